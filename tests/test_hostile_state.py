"""Regressions for the state under hostile conditions: sticky keys, torch
refusing, a second module state, fork(), user code under the lock,
containers mutated by __str__, decorated generators.  Each runs in a
fresh interpreter with warnings as errors and a timeout, since a failure
here is often a hang or a crash."""
import json
import sys

import pytest

from helpers import run_json, run_script, torch_facts


def needs_getter():
    if not torch_facts()["getter"]:
        pytest.skip("needs torch 2.13+ (its getter says what it holds)")


HOLDS = """
import allocconf, torch
def holds():
    # What torch holds, read back.  torch keeps expandable_segments when a
    # write leaves it out, so only a string that names it says its value.
    live = torch._C._accelerator_getAllocatorSettings()
    return {"live": live,
            "es": allocconf.parse(live).get("expandable_segments", "kept"),
            "status": str(allocconf.status().expandable_segments)}
"""


# -- sticky keys --------------------------------------------------------------

def test_window_on_then_closed_names_expandable_segments_false():
    # 0.1.0 wrote "max_split_size_mb:64" on exit: torch kept them ON.
    needs_getter()
    out = run_json(HOLDS, """
        with allocconf.expandable_segments(True):
            inside = holds()
        print(json.dumps([inside, holds()]))
    """, env={"ALLOCCONF_AUTO": "0",
              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    inside, after = out
    assert inside["es"] == "True" == inside["status"]
    assert after["es"] == "False" == after["status"]
    assert "max_split_size_mb:64" in after["live"]


def test_configure_removing_a_sticky_key_writes_its_default():
    needs_getter()
    out = run_json(HOLDS, """
        allocconf.configure(expandable_segments=True, large_segment_size_mb=64)
        on = holds()
        allocconf.configure(expandable_segments=None,
                            large_segment_size_mb=None)
        print(json.dumps([on, holds()]))
    """, env={"ALLOCCONF_AUTO": "0"})
    on, off = out
    assert on["es"] == "True" == on["status"]
    assert off["es"] == "False" == off["status"]
    assert "large_segment_size_mb:20" in off["live"]


def test_removing_a_reserve_key_torch_holds_is_refused_with_its_name():
    needs_getter()
    if not torch_facts()["knows_reserve"]:
        pytest.skip(f"torch {torch_facts()['version']} does not know "
                    f"expandable_segments_reserve")
    out = run_json("""
        import allocconf, torch
        allocconf.configure(expandable_segments_reserve="0.5")
        try:
            allocconf.configure(expandable_segments_reserve=None)
            err = None
        except allocconf.AllocConfError as exc:
            err = str(exc)
        print(json.dumps([err, allocconf.status().config]))
    """)
    err, config = out
    assert err.startswith("expandable_segments_reserve: torch keeps it")
    assert "expandable_segments_reserve:0.5" in config


# -- torch refuses ------------------------------------------------------------

def test_after_torch_refuses_status_tells_what_it_holds_and_windows_work():
    out = run_json("""
        from helpers import recorder; recorder.install()
        recorder.REJECT.add("max_split_size_mb:64,expandable_segments:True")
        import warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import allocconf, torch
        st = allocconf.status()
        live = recorder.live()
        with allocconf.ipc_safe():
            inside = allocconf.status().expandable_segments
        print(json.dumps({
            "warned": [str(w.message) for w in seen],
            "applied": st.applied, "es": st.expandable_segments,
            "config": st.config, "reason": st.reason, "inside": inside,
            "calls": recorder.CALLS, "live": live,
            "after": recorder.live()}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert len(out["warned"]) == 1 and "torch refused" in out["warned"][0]
    assert out["applied"] is False
    assert out["es"] is False                     # 0.1.0 said True
    # torch was handed back what it held, with the default of the sticky
    # key the refused string named (it may have taken it before refusing);
    # status() says what torch holds, string for string.
    assert out["calls"] == ["max_split_size_mb:64,expandable_segments:True",
                            "expandable_segments:False,max_split_size_mb:64"]
    assert out["config"] == out["live"] == (
        "expandable_segments:False,max_split_size_mb:64")
    assert "refused" in out["reason"] and "turned on" not in out["reason"]
    # The window builds on what torch holds (expandable segments already
    # off there): nothing to write, and nothing changed after it.
    assert out["inside"] is False
    assert out["after"] == out["live"]


# -- one state per process ----------------------------------------------------

def test_a_second_module_state_is_refused():
    out = run_json("""
        import importlib, sys
        import allocconf
        first = sys.modules.pop("allocconf._C")
        try:
            importlib.import_module("allocconf._C")
            err = None
        except ImportError as exc:
            err = str(exc)
        sys.modules["allocconf._C"] = first
        print(json.dumps([err, allocconf.status().window_depth]))
    """)
    assert out[0].startswith(
        "allocconf: allocconf._C is already loaded in this process")
    assert out[1] == 0


@pytest.mark.skipif(sys.version_info >= (3, 12),
                    reason="3.12+ refuses sub-interpreters by the module slot")
def test_a_sub_interpreter_gets_no_second_state():
    _testcapi = pytest.importorskip("_testcapi")
    del _testcapi
    proc = run_script("""
        import _testcapi
        import allocconf
        code = "import sys; sys.path[:0] = %r; import allocconf._C" % sys.path
        print(json.dumps(_testcapi.run_in_subinterp(code)))
    """, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) != 0
    assert "already imported by another interpreter of this process" \
        in proc.stderr


# -- fork ---------------------------------------------------------------------

FORK = """
import threading, time
from helpers.harness import forked, slow_setter
"""


def test_child_forked_while_another_thread_holds_the_lock_does_not_hang():
    # A setter that takes a moment keeps the state lock held in a thread.
    setter = torch_facts()["setter"]
    if setter is None:
        pytest.skip("this torch has no setter")
    out = run_json(FORK, """
        import torch
        slow_setter(torch, 0.5)
        import allocconf
        t = threading.Thread(
            target=lambda: allocconf.configure(max_split_size_mb=64))
        t.start()
        time.sleep(0.2)          # the thread is inside the setter now
        def child():
            get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
            return [allocconf.status().config,
                    allocconf.status().window_depth,
                    get() if get else allocconf.status().config]
        code, got = forked(child)
        t.join()
        print(json.dumps([code, got]))
    """, timeout=60)
    code, got = out
    assert code == 0
    assert isinstance(got, list), got  # else the child's exception
    config, depth, held = got
    # The thread may have been half-way through its write: the child
    # writes its configuration naming every sticky key, and says so.
    assert (config, depth) == (
        "large_segment_size_mb:20,max_split_size_mb:64,"
        "expandable_segments:True" if torch_facts()["new_setter"] else
        "max_split_size_mb:64,expandable_segments:True", 0)
    assert held == config


def test_child_forked_inside_another_threads_window_has_none_open():
    out = run_json(FORK, """
        import allocconf, torch
        from helpers.harness import Held
        held = Held(False)
        def child():
            st = allocconf.status()
            with allocconf.ipc_safe():
                pass         # and windows still work in the child
            getter = getattr(torch._C,
                             "_accelerator_getAllocatorSettings", None)
            return [st.window_depth, st.expandable_segments,
                    getter() if getter else None]
        code, child = forked(child)
        parent = allocconf.status().window_depth
        held.release()
        print(json.dumps([code, parent, child]))
    """, timeout=60)
    code, parent, child = out
    assert [code, parent] == [0, 1]
    assert isinstance(child, list), child  # else the child's exception
    depth, es, live = child
    assert (depth, es) == (0, True)
    if torch_facts()["getter"]:
        assert live == "expandable_segments:True"


def test_readme_states_the_fork_rules():
    import os
    with open(os.path.join(os.path.dirname(__file__), "..",
                           "README.md")) as f:
        readme = f.read()
    assert "`fork()`: allocconf registers an at-fork handler" in readme


# -- no user code under the lock ----------------------------------------------

def test_a_str_that_calls_allocconf_works_inside_configure():
    out = run_json("""
        import allocconf, torch, threading
        class CallsStatus:
            def __str__(self):
                allocconf.status()            # 0.1.0: RuntimeError
                return "0.5"
        class WaitsOnAThread:
            def __str__(self):
                t = threading.Thread(target=allocconf.status)
                t.start()
                t.join(10)                    # 0.1.0: deadlock
                return "64" if not t.is_alive() else "stuck"
        got = allocconf.configure(
            roundup_power2_divisions=[(256, WaitsOnAThread())],
            garbage_collection_threshold=CallsStatus.__str__(CallsStatus())
        )
        print(json.dumps(got))
    """, timeout=60)
    assert "roundup_power2_divisions:[256:64]" in out


def test_a_str_calling_status_inside_a_list_value_of_configure():
    out = run_json("""
        import allocconf, torch
        class K:
            def __str__(self):
                return str(allocconf.status().window_depth + 256)
        print(json.dumps(allocconf.configure(
            roundup_power2_divisions={K(): 2})))
    """)
    assert "roundup_power2_divisions:[256:2]" in out


# -- containers mutated by __str__ --------------------------------------------

def test_str_that_empties_its_container_is_no_use_after_free():
    proc = run_script("""
        import allocconf
        d, lst = {}, []
        class K:
            def __init__(self, box):
                self.box = box
            def __str__(self):
                self.box.clear()       # frees the pair 0.1.0 still read
                return "256"
        class V:
            def __str__(self):
                return "4"
        d[K(d)] = V()
        lst.append((K(lst), V()))
        print(json.dumps([allocconf.merge("", roundup_power2_divisions=d),
                          allocconf.merge("", roundup_power2_divisions=lst),
                          len(d), len(lst)]))
    """, env={"PYTHONMALLOC": "debug"})
    assert json.loads(proc.stdout) == [
        "roundup_power2_divisions:[256:4]",
        "roundup_power2_divisions:[256:4]", 0, 0]


# -- decorated generators and coroutines --------------------------------------

def test_decorated_generators_iterate_inside_the_window():
    out = run_json("""
        import asyncio, allocconf
        @allocconf.ipc_safe()
        def gen():
            yield allocconf.status().window_depth
            got = yield allocconf.status().window_depth
            yield got
        @allocconf.ipc_safe()
        async def agen():
            yield allocconf.status().window_depth
            await asyncio.sleep(0)
            got = yield allocconf.status().window_depth
            yield got
        g = gen()
        sync = [next(g), next(g), g.send("sent")]
        g.close()
        async def drive():
            a = agen()
            got = [await a.__anext__(), await a.__anext__(),
                   await a.asend("sent")]
            await a.aclose()
            return got
        print(json.dumps([sync, asyncio.run(drive()),
                          allocconf.status().window_depth]))
    """)
    assert out == [[1, 1, "sent"], [1, 1, "sent"], 0]


def test_exception_thrown_into_a_decorated_generator_closes_the_window():
    out = run_json("""
        import allocconf
        @allocconf.ipc_safe()
        def gen():
            try:
                yield 1
            except KeyError:
                yield "caught"
        g = gen()
        next(g)
        caught = g.throw(KeyError("x"))
        g.close()
        print(json.dumps([caught, allocconf.status().window_depth]))
    """)
    assert out == ["caught", 0]


def test_bad_override_key_name_points_at_the_key():
    # Any word is a key, as in torch ("bad-key" included); a keyword that
    # is no single word would change the string's meaning.
    out = run_json("""
        import allocconf
        try:
            allocconf.merge("", **{"bad key,x": 1})
        except allocconf.AllocConfError as exc:
            print(json.dumps([exc.key, exc.offset, exc.conf,
                              allocconf.merge("", **{"bad-key": 1})]))
    """)
    assert out == ["bad key,x", 0, "bad key,x:1", "bad-key:1"]
