"""Where allocconf's state could drift from torch's, each in a
fresh interpreter with warnings as errors: what torch holds is read with
torch's own getter (2.13+), never with allocconf's bookkeeping."""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import TESTS_DIR, child_env, run_json, torch_facts

FACTS = torch_facts()
needs_getter = pytest.mark.skipif(
    not FACTS["getter"], reason="needs torch 2.13+: its getter says what "
    "torch holds")

GET = "torch._C._accelerator_getAllocatorSettings"


# -- 1. a write that went past allocconf --------------------------------------

@needs_getter
def test_a_setter_taken_before_allocconf_attached_is_seen_and_kept():
    out = run_json(f"""
        import torch
        early = torch._C._accelerator_setAllocatorSettings  # not wrapped
        import allocconf
        get = {GET}
        early("garbage_collection_threshold:0.5")
        st = allocconf.status()
        with allocconf.ipc_safe():
            inside = get()
        print(json.dumps({{"config": st.config, "readback": st.readback,
                          "held": early.__self__ is None, "inside": inside,
                          "after": get(), "reason": st.reason}}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    # status() says what torch holds, and why.
    assert out["config"] == "garbage_collection_threshold:0.5"
    assert out["readback"] is True
    assert "did not see" in out["reason"]
    # The window keeps that write, and the user's key under it.
    assert out["inside"] == ("max_split_size_mb:64,garbage_collection_"
                             "threshold:0.5,expandable_segments:False")
    assert out["after"] == ("max_split_size_mb:64,garbage_collection_"
                            "threshold:0.5,expandable_segments:True")


@needs_getter
def test_a_read_back_during_allocconfs_own_write_is_not_a_write_it_missed():
    # torch's setter here is Python code that lets another thread run
    # before torch holds the new string: that thread's status() reads the
    # old string, then waits for allocconf's lock.  It must not take the
    # old string for a write allocconf did not see.
    out = run_json(f"""
        import threading, time
        import torch
        get = {GET}
        name = "_accelerator_setAllocatorSettings"
        real = getattr(torch._C, name)
        inside = threading.Event()
        def slow(conf):
            inside.set()
            time.sleep(0.2)  # the reader reads torch now
            return real(conf)
        setattr(torch._C, name, slow)
        import allocconf
        seen = []
        def reader():
            inside.wait(30)
            seen.append(allocconf.status().config)
        inside.clear()
        r = threading.Thread(target=reader)
        r.start()
        window = allocconf.ipc_safe()
        window.__enter__()
        r.join()
        inside_window = get()
        window.__exit__(None, None, None)
        print(json.dumps([seen, inside_window, get(),
                          allocconf._C._internals()["unseen"]]))
    """, timeout=120)
    assert out == [["expandable_segments:False"], "expandable_segments:False",
                   "expandable_segments:True", 0]


def test_a_torch_without_a_getter_says_so_in_status():
    from helpers.standin import decide

    out = decide("2.11.0+cu130", cuda="13.0")
    assert out["status"]["readback"] is False
    assert out["calls"] == ["expandable_segments:True"]


@needs_getter
def test_with_keep_foreign_off_a_window_keeps_what_torch_holds():
    # ALLOCCONF_KEEP_FOREIGN=0: other components' writes replace what
    # torch holds as torch alone has it; a window builds on that.
    out = run_json(f"""
        import allocconf, torch
        get = {GET}
        torch._C._accelerator_setAllocatorSettings(
            "garbage_collection_threshold:0.5")
        with allocconf.ipc_safe():
            inside = get()
        print(json.dumps([inside, get(), allocconf.status().config]))
    """, env={"ALLOCCONF_KEEP_FOREIGN": "0",
              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == [
        "garbage_collection_threshold:0.5,expandable_segments:False",
        "garbage_collection_threshold:0.5,expandable_segments:True",
        "garbage_collection_threshold:0.5,expandable_segments:True"]


# -- 2. allocconf imported while torch is still being imported ----------------

GATE = """
import threading, time
inside, gate = threading.Event(), threading.Event()
class Gate:
    # Holds torch's import at one of its first submodules, before torch._C
    # is there.
    def find_spec(self, name, path=None, target=None):
        if name == "torch._utils_internal" and not inside.is_set():
            inside.set()
            ACTION()
        return None
sys.meta_path.insert(0, Gate())

def attached(allocconf):
    for _ in range(1000):  # the attach runs in allocconf's waiting thread
        if allocconf.status().torch_imported:
            return True
        time.sleep(0.005)
    return False
"""


def test_imported_by_another_thread_during_import_torch():
    out = run_json("ACTION = lambda: gate.wait(60)", GATE, f"""
        t = threading.Thread(target=lambda: __import__("torch"))
        t.start()
        assert inside.wait(60)
        import allocconf  # torch is in sys.modules, its body still running
        during = allocconf.status().torch_imported
        gate.set()
        t.join()
        ok = attached(allocconf)
        import torch
        get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        print(json.dumps({{"during": during, "attached": ok,
                          "api": allocconf.status().api,
                          "held": get() if get else None}}))
    """)
    assert out["during"] is False
    assert out["attached"] is True
    assert out["api"] == FACTS["setter"]
    if FACTS["getter"]:
        assert out["held"] == "expandable_segments:True"


def test_imported_by_torchs_own_import_chain():
    out = run_json("ACTION = lambda: __import__('allocconf')", GATE, """
        import torch, allocconf
        ok = attached(allocconf)
        get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        print(json.dumps({"attached": ok, "held": get() if get else None,
                          "warnings": list(allocconf.status().warnings)}))
    """)
    assert out["attached"] is True
    assert out["warnings"] == []
    if FACTS["getter"]:
        assert out["held"] == "expandable_segments:True"


# -- 3. forked children ---------------------------------------------------------

@needs_getter
def test_a_forked_child_writes_only_what_the_fork_dropped():
    out = run_json(f"""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        from helpers.harness import Held, forked
        get = {GET}
        def child():
            return [recorder.CALLS[start:], get()]
        start = len(recorder.CALLS)
        plain = forked(child)[1]
        with allocconf.ipc_safe():  # this thread's window: the child has it
            start = len(recorder.CALLS)
            mine = forked(child)[1]
        held = Held(False)          # another thread's: the child does not
        start = len(recorder.CALLS)
        other = forked(child)[1]
        held.release()
        print(json.dumps({{"plain": plain, "mine": mine, "other": other}}))
    """)
    assert out["plain"] == [[], "expandable_segments:True"]
    assert out["mine"] == [[], "expandable_segments:False"]
    assert out["other"] == [["expandable_segments:True"],
                            "expandable_segments:True"]


@needs_getter
def test_dataloader_workers_hold_what_the_parent_holds_without_a_write():
    out = run_json(f"""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        from torch.utils.data import DataLoader, Dataset
        get = {GET}
        allocconf.configure(max_split_size_mb=64)
        class Probe(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return json.dumps([len(recorder.CALLS), get()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork
            loader = DataLoader(Probe(), batch_size=None, num_workers=2,
                                multiprocessing_context="fork")
            seen = sorted(set(loader))
        print(json.dumps([seen, len(recorder.CALLS), get()]))
    """, timeout=180)
    seen, calls, held = out
    assert seen == [f'[{calls}, "{held}"]']
    assert held == "max_split_size_mb:64,expandable_segments:True"


def test_no_register_at_fork_imports_with_a_warning():
    out = run_json("""
        import os
        import torch  # its imports (random, tempfile) register at fork too
        del os.register_at_fork
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import allocconf
        print(json.dumps([[str(w.message) for w in caught],
                          allocconf.status().applied]))
    """)
    messages, applied = out
    assert applied is True
    assert len(messages) == 1
    assert "no os.register_at_fork" in messages[0]
    assert "fork()" in messages[0]


def test_after_fork_does_nothing_in_the_process_that_did_not_fork():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        from helpers.harness import Held
        held = Held(False)
        calls = len(recorder.CALLS)
        allocconf._C._after_fork()
        depth = allocconf.status().window_depth
        held.release()
        print(json.dumps([depth, len(recorder.CALLS) - calls,
                          allocconf.status().window_depth]))
    """)
    assert out == [1, 1, 0]  # the one call: the window's own close


# -- 5. nothing of torch's runs under the lock ----------------------------------

def test_torch_version_str_runs_outside_the_lock():
    out = run_json("""
        import types
        calls = []
        class Version(str):
            def __str__(self):
                # Under allocconf's lock this call would raise RuntimeError.
                calls.append(sys.modules["allocconf"].status().api)
                return "2.0.1+hostile"
        torch = types.ModuleType("torch")
        torch.__version__ = Version("2.0.1")
        torch.version = types.SimpleNamespace(cuda="11.8", hip=None)
        torch._C = types.SimpleNamespace()
        sys.modules["torch"] = torch
        import allocconf
        reasons = [allocconf.status().reason for _ in range(3)]
        print(json.dumps([calls, reasons[0], len(set(reasons))]))
    """)
    calls, reason, distinct = out
    assert len(calls) == 1  # once, at attach
    assert reason == ("torch 2.0.1+hostile has no run-time allocator setter; "
                      "allocconf writes nothing")
    assert distinct == 1


@pytest.mark.parametrize("raised, outcome", [
    ("KeyboardInterrupt", "KeyboardInterrupt"),  # passes through
    ("MemoryError", "warned: MemoryError"),      # not taken as "missing"
    ("RuntimeError", "attached"),                # a lazy attribute: missing
])
def test_lookups_clear_only_ordinary_errors(raised, outcome):
    out = run_json(f"""
        import types
        class Lazy(types.SimpleNamespace):
            def __getattr__(self, name):
                raise {raised}("lazy " + name)
        torch = types.ModuleType("torch")
        torch.__version__ = "2.13.0"
        torch.version = types.SimpleNamespace(cuda=None, hip=None)
        torch._C = Lazy(_accelerator_setAllocatorSettings=lambda s: None)
        sys.modules["torch"] = torch
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import allocconf
        except BaseException as exc:
            print(json.dumps(type(exc).__name__))
        else:
            failed = [str(w.message) for w in caught
                      if "could not attach" in str(w.message)]
            print(json.dumps("warned: " + failed[0].split(": ")[2].split("(")[0]
                             if failed else
                             "attached" if allocconf.status().torch_imported
                             else "not attached"))
    """)
    assert out == outcome


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "MemoryError"])
def test_the_c_lookups_let_what_must_propagate_through(raised):
    out = run_json(f"""
        import types
        import allocconf
        class Lazy(types.SimpleNamespace):
            def __getattr__(self, name):
                raise {raised}("lazy " + name)
        torch = types.ModuleType("torch")
        torch._C = Lazy()
        try:
            got = allocconf._C._live_config(torch)
        except BaseException as exc:
            got = type(exc).__name__
        print(json.dumps(got))
    """)
    assert out == raised


def test_the_report_survives_a_torch_whose_lazy_attributes_raise(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(textwrap.dedent("""
        __version__ = "2.99.0"
        def __getattr__(name):
            raise RuntimeError("lazy " + name + " failed")
    """))
    env = child_env({"PYTHONPATH": str(tmp_path) + os.pathsep
                     + os.environ.get("PYTHONPATH", "")})
    for args in ([], ["--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "allocconf", "--no-probe", *args],
            env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "2.99.0" in proc.stdout


def test_configure_does_not_build_the_internals_when_export_is_off():
    out = run_json("""
        import allocconf, torch
        real = allocconf._C._internals
        calls = []
        def counted():
            calls.append(1)
            return real()
        allocconf._C._internals = counted
        for i in range(50):
            allocconf.configure(max_split_size_mb=64 + i)
        print(json.dumps(len(calls)))
    """)
    assert out == 0


# -- 7. an opt-out in a variable torch does not apply ---------------------------

@pytest.mark.parametrize("cuda", ["", "roundup_power2_divisions:4"])
@pytest.mark.parametrize("order", ["allocconf first", "torch first"])
def test_an_opt_out_shadowed_by_an_earlier_variable_is_kept(cuda, order):
    imports = ("import allocconf, torch" if order == "allocconf first"
               else "import torch, allocconf")
    out = run_json(f"""
        from helpers import recorder; recorder.install()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            {imports}
        st = allocconf.status()
        print(json.dumps({{"warned": [str(w.message) for w in caught],
                          "calls": recorder.CALLS, "live": recorder.live(),
                          "es": st.expandable_segments,
                          "reason": st.reason, "advice": st.advice}}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": cuda,
              "PYTORCH_ALLOC_CONF": "expandable_segments:False"})
    assert out["calls"] == []  # nothing written: torch keeps what it read
    assert out["live"] == cuda
    assert out["es"] is False
    assert "honours it as an opt-out" in out["reason"]
    assert len(out["warned"]) == 1
    assert out["warned"][0].startswith(
        "allocconf: PYTORCH_ALLOC_CONF says expandable_segments:False, but "
        "torch applies PYTORCH_CUDA_ALLOC_CONF")
    assert any("PYTORCH_ALLOC_CONF is set" in a for a in out["advice"])


# -- 10. status() reports what was written, string for string ------------------

@needs_getter
def test_status_config_is_what_torch_holds_through_random_operations(
        tmp_path):
    (tmp_path / "vllm.py").write_text("STANDIN = True\n")
    out = run_json(f"sys.path.insert(0, {str(tmp_path)!r})", f"""
        import random
        import allocconf, torch
        get = {GET}
        early = torch._C._accelerator_setAllocatorSettings  # wrapped
        rng = random.Random(20261204)
        ops = [
            lambda: allocconf.configure(max_split_size_mb=rng.choice(
                [None, 64, 128])),
            lambda: allocconf.configure(large_segment_size_mb=rng.choice(
                [None, 20, 40])),
            lambda: allocconf.configure(expandable_segments=rng.choice(
                [None, True, False])),
            lambda: torch._C._accelerator_setAllocatorSettings(rng.choice([
                "", "garbage_collection_threshold:0.5",
                "expandable_segments:True,max_split_size_mb:256",
                "large_segment_size_mb:64"])),
            lambda: allocconf.ipc_safe().__enter__(),
            lambda: allocconf.expandable_segments(True).__enter__(),
            lambda: allocconf.ipc_safe().__exit__(None, None, None),
            lambda: allocconf.expandable_segments(True).__exit__(
                None, None, None),
            lambda: __import__("vllm"),
        ]
        bad = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the step-back's warning
            for step in range(300):
                try:
                    rng.choice(ops)()
                except (RuntimeError, allocconf.AllocConfError, ValueError):
                    pass  # a window closed too often; a value torch refuses
                st = allocconf.status()
                if st.config != get():
                    bad.append([step, st.config, get()])
        print(json.dumps(bad[:5]))
    """)
    assert out == []


@needs_getter
def test_status_after_a_step_back_and_a_sticky_default(tmp_path):
    (tmp_path / "vllm.py").write_text("STANDIN = True\n")
    out = run_json(f"sys.path.insert(0, {str(tmp_path)!r})", f"""
        import allocconf, torch
        get = {GET}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import vllm
        stepped = [allocconf.status().config, get()]
        allocconf.configure(large_segment_size_mb=40)
        allocconf.configure(large_segment_size_mb=None)
        dflt = [allocconf.status().config, get(),
                allocconf.status().expandable_segments]
        print(json.dumps([stepped, dflt]))
    """)
    stepped, dflt = out
    # The step-back wrote the sticky key's default: status() shows it.
    assert stepped == ["expandable_segments:False"] * 2
    # Removing large_segment_size_mb writes its default (torch keeps the
    # key otherwise); expandable segments stay off, kept by torch.
    assert dflt == ["large_segment_size_mb:20", "large_segment_size_mb:20",
                    False]
