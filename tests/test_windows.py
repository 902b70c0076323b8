"""expandable_segments() / ipc_safe() windows: nesting, threads, exceptions,
the decorator, and a window opened before torch is imported.

In-process tests read what torch really holds through its own getter
(torch 2.13+), so they prove the write and not just allocconf's book-keeping.
"""
import asyncio
import random
import threading

import pytest

import allocconf
from helpers import run_json

torch = pytest.importorskip("torch")
live = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
# In-process tests read torch's own getter (2.13+); the child-process tests
# below record the setter and run on older torch too.
needs_getter = pytest.mark.skipif(
    live is None, reason="torch < 2.13 has no allocator getter to read back")


@pytest.fixture(autouse=True)
def no_window_left_open():
    assert allocconf.status().window_depth == 0
    before = live() if live else None
    yield
    assert allocconf.status().window_depth == 0
    if live:
        assert live() == before


@needs_getter
def test_window_holds_off_and_restores_exactly():
    before = live()
    assert "expandable_segments:True" in before
    with allocconf.ipc_safe() as w:
        assert w is allocconf.ipc_safe()
        assert live() == before.replace("expandable_segments:True",
                                        "expandable_segments:False")
        st = allocconf.status()
        assert st.expandable_segments is False
        assert st.window_depth == 1
        assert "window(s) open" in st.reason
    assert live() == before
    assert allocconf.status().expandable_segments is True


@needs_getter
def test_nested_windows_write_only_at_the_outermost():
    before = live()
    with allocconf.ipc_safe():
        inside = live()
        with allocconf.ipc_safe():
            with allocconf.expandable_segments(False):
                assert live() == inside
                assert allocconf.status().window_depth == 3
            assert live() == inside
        assert live() == inside
    assert live() == before


@needs_getter
def test_off_wins_over_on_while_any_off_window_is_open():
    with allocconf.expandable_segments(True):
        with allocconf.ipc_safe():
            assert "expandable_segments:False" in live()
            with allocconf.expandable_segments(True):
                assert "expandable_segments:False" in live()
        assert "expandable_segments:True" in live()


@needs_getter
def test_exception_inside_restores_and_propagates():
    before = live()
    with pytest.raises(ZeroDivisionError):
        with allocconf.ipc_safe():
            with allocconf.ipc_safe():
                1 / 0
    assert live() == before


@needs_getter
def test_decorator():
    seen = []

    @allocconf.ipc_safe()
    def pack(x):
        """Pack."""
        seen.append(live())
        return x * 2

    assert pack(21) == 42
    assert pack.__doc__ == "Pack." and pack.__name__ == "pack"
    assert seen == [live().replace("True", "False")]


@needs_getter
def test_decorator_on_async_function_holds_across_awaits():
    seen = []

    @allocconf.ipc_safe()
    async def pack():
        await asyncio.sleep(0)
        seen.append(live())
        await asyncio.sleep(0)
        seen.append(allocconf.status().window_depth)

    asyncio.run(pack())
    assert seen == [live().replace("True", "False"), 1]


@needs_getter
def test_decorator_restores_on_exception():
    @allocconf.expandable_segments(False)
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        boom()


@needs_getter
def test_threads_share_one_process_wide_window():
    before = live()
    errors = []
    barrier = threading.Barrier(12)

    def opener(seed):
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(300):
            depth = rng.randint(1, 3)
            try:
                with allocconf.ipc_safe():
                    if depth > 1:
                        with allocconf.ipc_safe():
                            if "expandable_segments:False" not in live():
                                errors.append(("nested", live()))
                    if "expandable_segments:False" not in live():
                        errors.append(("window", live()))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(repr(exc))

    def reader():
        barrier.wait()
        for _ in range(300):
            allocconf.status()
            allocconf.configure()  # same configuration again: no change

    threads = [threading.Thread(target=opener, args=(i,)) for i in range(10)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert live() == before


@needs_getter
def test_unbalanced_exit_is_an_error_and_changes_nothing():
    before = live()
    with pytest.raises(RuntimeError, match="closed more often than"):
        allocconf.ipc_safe().__exit__(None, None, None)
    assert live() == before


@needs_getter
def test_enabled_must_be_a_bool():
    with pytest.raises(TypeError, match="takes True or False, not 0"):
        allocconf.expandable_segments(0)


def test_window_opened_before_torch_holds_when_torch_arrives():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf
        with allocconf.ipc_safe():
            import torch
            inside = recorder.live()
            status = allocconf.status().as_dict()
        print(json.dumps({"inside": inside, "after": recorder.live(),
                          "calls": recorder.CALLS, "status": status}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["calls"] == ["max_split_size_mb:64,expandable_segments:False",
                            "max_split_size_mb:64,expandable_segments:True"]
    assert out["inside"] == "max_split_size_mb:64,expandable_segments:False"
    assert out["after"] == "max_split_size_mb:64,expandable_segments:True"
    assert out["status"]["window_depth"] == 1


def test_window_restores_the_users_exact_string_when_auto_is_off():
    # Nothing was written at import, so the string before the window is
    # the user's own, spaces and all: the restore gives back exactly that.
    user = "max_split_size_mb : 64, garbage_collection_threshold:0.6"
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        with allocconf.ipc_safe():
            pass
        print(json.dumps({"calls": recorder.CALLS}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": user, "ALLOCCONF_AUTO": "0"})
    assert out["calls"] == [
        "max_split_size_mb:64,garbage_collection_threshold:0.6,"
        "expandable_segments:False",
        user,
    ]


def test_torch_refusing_a_window_write_leaves_the_window_closed():
    out = run_json("""
        from helpers import recorder; recorder.install()
        recorder.REJECT.add("expandable_segments:False")
        import allocconf, torch
        try:
            with allocconf.ipc_safe():
                entered = True
        except allocconf.AllocConfError as exc:  # torch's error is its cause
            entered = str(exc.__cause__)
        print(json.dumps({"entered": entered, "live": recorder.live(),
                          "depth": allocconf.status().window_depth}))
    """)
    assert out == {"entered": "recorder refused 'expandable_segments:False'",
                   "live": "expandable_segments:True", "depth": 0}


# torch's setter replaced, before allocconf attaches, by one that calls
# allocconf back while `armed` says so: catching the RuntimeError it gets
# ("catch"), or letting it fail the write ("raise").
CALLS_BACK = """
    import torch
    from helpers import recorder
    name = next(n for n in recorder.NAMES if hasattr(torch._C, n))
    real = getattr(torch._C, name)
    armed, seen = [], []
    def calls_back(conf):
        if armed:
            try:
                sys.modules["allocconf"].status()
            except RuntimeError as exc:
                seen.append(str(exc))
                if armed == ["raise"]:
                    raise
        return real(conf)
    setattr(torch._C, name, calls_back)
"""


def test_setter_calling_back_into_allocconf_is_refused_not_deadlocked():
    out = run_json(CALLS_BACK, """
        armed.append("catch")
        import allocconf
        print(json.dumps(seen))
    """, timeout=60)
    assert len(out) == 1 and "called from inside torch's allocator" in out[0]


def test_a_setter_calling_back_is_not_called_torchs_refusal():
    out = run_json(CALLS_BACK, """
        import allocconf
        armed.append("raise")
        got = []
        for act in (lambda: allocconf.configure(max_split_size_mb=128),
                    lambda: allocconf.ipc_safe().__enter__()):
            try:
                act()
                got.append(None)
            except Exception as exc:
                got.append([type(exc).__name__, str(exc),
                            str(exc.__cause__)])
        armed.clear()
        print(json.dumps([got, allocconf.status().window_depth]))
    """, timeout=60)
    got, depth = out
    assert depth == 0
    for kind, text, cause in got:
        assert kind == "RuntimeError"
        assert text.startswith("allocconf: torch's setter called back into "
                               "allocconf")
        assert "refused" not in text
        assert "called from inside torch's allocator setter" in cause


def test_a_window_restores_what_torch_held_as_the_docs_say():
    # torch keeps expandable_segments across writes: after a window that
    # turned it on, the restore must name it, at torch's default, in
    # front of the string torch held before (README, docs/api.md).
    import os

    from helpers import TESTS_DIR, needs_getter
    needs_getter()
    out = run_json("""
        import allocconf, torch
        get = torch._C._accelerator_getAllocatorSettings
        before = get()
        with allocconf.expandable_segments(True):
            inside = get()
        print(json.dumps([before, inside, get(),
                          allocconf.status().config]))
    """, env={"ALLOCCONF_AUTO": "0",
              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    before, inside, after, config = out
    assert before == "max_split_size_mb:64"
    assert "expandable_segments:True" in inside
    assert after == config == "expandable_segments:False," + before
    root = os.path.dirname(TESTS_DIR)
    for page in ("README.md", os.path.join("docs", "api.md")):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        assert "`expandable_segments:False,` then the previous string" \
            in text or "`expandable_segments:False,max_split_size_mb:64` " \
            "where torch held `max_split_size_mb:64`" in text, page
        assert "restores the previous configuration, string for string" \
            not in text, page
