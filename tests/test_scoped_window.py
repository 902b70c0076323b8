"""ipc_safe()'s scopes on the CPU: the API, the process-wide fallback with
real torch, and the bookkeeping of the opener's scope (one pool per thread
at a time, routes begun and ended in pairs, per-step decorators) against a
recording stand-in for torch's pool routing.  That the routing gives
classic, shareable memory is proven on the GPU
(tests/gpu/test_scoped_window_gpu.py)."""
from helpers import run_json, torch_facts

# After `import allocconf, torch`: torch's pool routing replaced by one
# that records each call (CALLS) and answers as a GPU torch would; the
# getter says what torch's allocator holds (the CPU build keeps it).
RECORDING = """
    import threading, weakref
    import allocconf, torch
    CALLS = []
    MADE = []  # a weak reference to each pool made
    CUDA_UP = [True]
    DEVICE = [0]
    FAIL = {}

    class Pool:
        made = 0
        def __init__(self, device):
            Pool.made += 1
            self.id = (Pool.made, 0)
            self.device = device
            MADE.append(weakref.ref(self))

    def _rec(name):
        def call(*args):
            if FAIL.get(name):
                raise RuntimeError(f"torch refused {name}")
            CALLS.append((name, threading.current_thread().name) + args)
        return call

    def make(device):
        if FAIL.get("make"):
            raise RuntimeError("no pool")
        CALLS.append(("make", threading.current_thread().name, device))
        return Pool(device)

    allocconf._C._set_pools(
        (_rec("begin"), _rec("end"), _rec("release"), lambda: DEVICE[0],
         lambda: CUDA_UP[0], make), "recording stand-in")
    getter = torch._C._accelerator_getAllocatorSettings
    def names():
        return [c[0] for c in CALLS]
"""


def test_scope_argument_is_checked_by_name():
    out = run_json("""
        import allocconf
        errors = []
        for bad in ("thread", "", "Opener", 3, None):
            try:
                allocconf.ipc_safe(bad)
            except (TypeError, ValueError) as exc:
                errors.append([type(exc).__name__, str(exc)])
        print(json.dumps({"errors": errors,
                          "depth": allocconf.status().window_depth,
                          "default": repr(allocconf.ipc_safe()),
                          "process": repr(allocconf.ipc_safe("process"))}))
    """)
    assert out["errors"][0] == [
        "ValueError", "allocconf.ipc_safe: scope must be 'opener' or "
        "'process', not 'thread'"]
    assert [e[0] for e in out["errors"]] == [
        "ValueError", "ValueError", "ValueError", "TypeError", "TypeError"]
    assert "not int" in out["errors"][3][1]
    assert out["depth"] == 0
    assert out["default"] == "allocconf.ipc_safe()"
    assert out["process"] == "allocconf.expandable_segments(False)"


def test_before_torch_windows_hold_process_wide_and_say_why():
    out = run_json("""
        import allocconf
        st = allocconf.status()
        with allocconf.ipc_safe():
            inside = allocconf.status()
        print(json.dumps({"scope": st.window_scope,
                          "why": st.window_scope_reason,
                          "inside_es": inside.expandable_segments,
                          "depth": inside.window_depth,
                          "torch": "torch" in sys.modules}))
    """)
    assert out["scope"] == "process"
    assert "torch is not imported yet" in out["why"]
    assert out["inside_es"] is False and out["depth"] == 1
    assert out["torch"] is False


def test_cpu_build_falls_back_to_the_process_scope_as_torch_sees_it():
    facts = torch_facts()
    out = run_json("""
        import allocconf, torch
        getter = torch._C._accelerator_getAllocatorSettings
        st = allocconf.status()
        before = getter()
        with allocconf.ipc_safe():
            inside = getter()
        print(json.dumps({"scope": st.window_scope,
                          "why": st.window_scope_reason,
                          "pool_bytes": st.pool_bytes,
                          "before": before, "inside": inside,
                          "after": getter(),
                          "cuda_up": torch.cuda.is_initialized()}))
    """)
    if not facts["cpu_only"]:  # a CUDA build routes (the GPU suite)
        assert out["scope"] == "opener"
        return
    assert out["scope"] == "process"
    assert "built without CUDA" in out["why"]
    assert "expandable_segments:True" in out["before"]
    assert "expandable_segments:False" in out["inside"]
    assert out["after"] == out["before"]
    assert out["pool_bytes"] == 0 and out["cuda_up"] is False


def test_a_window_routes_once_and_writes_nothing_to_torch():
    out = run_json(RECORDING, """
        before = getter()
        with allocconf.ipc_safe():
            with allocconf.ipc_safe():
                inside = getter()
                depth = allocconf.status().window_depth
        print(json.dumps({"calls": CALLS, "same": before == inside == getter(),
                          "depth": depth,
                          "after": allocconf.status().window_depth}))
    """)
    main = "MainThread"
    assert out["calls"] == [["make", main, 0], ["begin", main, 0, [1, 0]],
                            ["end", main, 0, [1, 0]],
                            ["release", main, 0, [1, 0]]]
    assert out["same"] is True
    assert (out["depth"], out["after"]) == (2, 0)


def test_threads_at_once_get_pools_of_their_own_then_reuse_them():
    out = run_json(RECORDING, """
        both = threading.Barrier(2)
        def opener():
            with allocconf.ipc_safe():
                both.wait(timeout=30)
                both.wait(timeout=30)
        ts = [threading.Thread(target=opener, name=f"t{i}") for i in (1, 2)]
        for t in ts: t.start()
        for t in ts: t.join(timeout=30)
        with allocconf.ipc_safe():
            pass
        begun = {c[1]: tuple(c[3]) for c in CALLS if c[0] == "begin"}
        print(json.dumps({"made": Pool.made, "ids": sorted(set(
            begun[t] for t in ("t1", "t2"))), "main": begun["MainThread"],
            "ends": names().count("end"), "releases": names().count("release")}))
    """)
    assert out["made"] == 2
    assert out["ids"] == [[1, 0], [2, 0]]
    assert out["main"] in ([1, 0], [2, 0])  # a kept pool, not a third
    assert out["ends"] == out["releases"] == 3


def test_a_window_closed_by_another_thread_ends_the_openers_route():
    out = run_json(RECORDING, """
        w = allocconf.ipc_safe()
        w.__enter__()
        t = threading.Thread(target=w.__exit__, args=(None, None, None),
                             name="closer")
        t.start(); t.join(timeout=30)
        errors = []
        try:
            w.__exit__(None, None, None)
        except RuntimeError as exc:
            errors.append(str(exc))
        print(json.dumps({"calls": CALLS, "errors": errors,
                          "depth": allocconf.status().window_depth}))
    """)
    assert out["calls"][1:] == [["begin", "MainThread", 0, [1, 0]],
                                ["end", "closer", 0, [1, 0]],
                                ["release", "closer", 0, [1, 0]]]
    assert out["errors"] == ["allocconf: an ipc_safe() window was closed "
                             "more often than it was opened"]
    assert out["depth"] == 0


def test_torch_refusing_the_route_leaves_nothing_open():
    out = run_json(RECORDING, """
        got = {}
        FAIL["begin"] = True
        try:
            with allocconf.ipc_safe():
                got["ran"] = True
        except RuntimeError as exc:
            got["error"] = str(exc)
        got["depth"] = allocconf.status().window_depth
        FAIL["begin"] = False
        FAIL["make"] = True  # a second pool would fail: the first is free
        with allocconf.ipc_safe():
            pass
        FAIL["make"] = False
        FAIL["end"] = True
        try:
            with allocconf.ipc_safe():
                pass
        except RuntimeError as exc:
            got["end_error"] = str(exc)
        got["made"] = Pool.made
        got["after"] = allocconf.status().window_depth
        got["names"] = names()
        print(json.dumps(got))
    """)
    assert "ran" not in out and out["error"] == "torch refused begin"
    assert out["depth"] == 0
    assert out["made"] == 1
    assert out["end_error"] == "torch refused end"
    # begin refused: nothing to end; then two routes, each ended, and the
    # pool's hold given back even when end was refused.
    assert out["names"] == ["make", "begin", "end", "release", "begin",
                            "release"]
    assert out["after"] == 0


def test_before_cuda_is_up_windows_hold_process_wide_nested_too():
    out = run_json(RECORDING, """
        CUDA_UP[0] = False
        before = getter()
        with allocconf.ipc_safe():
            CUDA_UP[0] = True  # CUDA starts inside: the nest stays held
            with allocconf.ipc_safe():
                inside = getter()
                depth = allocconf.status().window_depth
        print(json.dumps({"calls": CALLS, "before": before, "inside": inside,
                          "after": getter(), "depth": depth}))
    """)
    assert out["calls"] == []
    assert "expandable_segments:False" in out["inside"]
    assert out["after"] == out["before"]
    assert out["depth"] == 2


def test_routes_the_current_device():
    out = run_json(RECORDING, """
        DEVICE[0] = 3
        with allocconf.ipc_safe():
            pass
        print(json.dumps(CALLS))
    """)
    assert out[0] == ["make", "MainThread", 3]
    assert out[1] == ["begin", "MainThread", 3, [1, 0]]


def test_async_decorator_holds_only_while_its_coroutine_runs():
    out = run_json(RECORDING, """
        import asyncio
        seen = []

        @allocconf.ipc_safe()
        async def sync():
            seen.append(("sync", allocconf.status().window_depth))
            await asyncio.sleep(0.02)
            seen.append(("sync", allocconf.status().window_depth))
            return "synced"

        async def step():
            await asyncio.sleep(0.01)
            seen.append(("step", allocconf.status().window_depth))

        async def main():
            return await asyncio.gather(sync(), step())

        result = asyncio.run(main())
        print(json.dumps({"seen": seen, "result": result[0],
                          "begins": names().count("begin"),
                          "ends": names().count("end")}))
    """)
    assert out["seen"] == [["sync", 1], ["step", 0], ["sync", 1]]
    assert out["result"] == "synced"
    assert out["begins"] == out["ends"] >= 2


def test_generator_and_async_generator_decorators_hold_per_step():
    out = run_json(RECORDING, """
        import asyncio

        @allocconf.ipc_safe()
        def gen():
            sent = yield allocconf.status().window_depth
            yield (sent, allocconf.status().window_depth)

        g = gen()
        first = next(g)
        between = allocconf.status().window_depth
        second = g.send("x")
        g.close()

        @allocconf.ipc_safe()
        async def agen():
            yield allocconf.status().window_depth
            yield allocconf.status().window_depth

        async def consume():
            out = []
            async for depth in agen():
                out.append([depth, allocconf.status().window_depth])
            return out

        print(json.dumps({"first": first, "between": between,
                          "second": second,
                          "async": asyncio.run(consume()),
                          "after": allocconf.status().window_depth}))
    """)
    assert out["first"] == 1 and out["between"] == 0
    assert out["second"] == ["x", 1]
    assert out["async"] == [[1, 0], [1, 0]]
    assert out["after"] == 0


def test_exceptions_close_the_window_and_propagate():
    out = run_json(RECORDING, """
        @allocconf.ipc_safe()
        def boom():
            raise KeyError("k")
        try:
            boom()
        except KeyError as exc:
            caught = repr(exc)
        print(json.dumps({"caught": caught, "names": names(),
                          "depth": allocconf.status().window_depth}))
    """)
    assert out["caught"] == "KeyError('k')"
    assert out["names"] == ["make", "begin", "end", "release"]
    assert out["depth"] == 0


def test_fork_inside_windows_keeps_only_the_forking_threads_routes():
    out = run_json(RECORDING, """
        import os, warnings
        hold, done = threading.Event(), threading.Event()
        def other():
            with allocconf.ipc_safe():
                hold.set()
                done.wait(timeout=30)
        t = threading.Thread(target=other, name="other")
        t.start(); hold.wait(timeout=30)
        with allocconf.ipc_safe():
            r, w = os.pipe()
            with warnings.catch_warnings():  # 3.12+: fork with threads
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os.close(r)
                depth = allocconf.status().window_depth
                CALLS.clear()
                allocconf.ipc_safe().__exit__(None, None, None)
                with allocconf.ipc_safe():  # the other thread's pool is free
                    pass
                os.write(w, json.dumps({"depth": depth, "calls": CALLS,
                    "after": allocconf.status().window_depth}).encode())
                os._exit(0)
            os.close(w)
            child = json.loads(os.read(r, 65536))
            os.waitpid(pid, 0)
        done.set(); t.join(timeout=30)
        print(json.dumps(child))
    """)
    assert out["depth"] == 1
    assert [c[0] for c in out["calls"]] == ["end", "release", "begin", "end",
                                            "release"]
    assert out["after"] == 0


def test_release_pools_lets_go_of_them_and_refuses_while_a_window_routes():
    out = run_json(RECORDING, """
        import gc
        with allocconf.ipc_safe():
            pass
        pool_ref = list(MADE)
        errors = []
        with allocconf.ipc_safe():
            try:
                allocconf.release_pools()
            except RuntimeError as exc:
                errors.append(str(exc))
            alive_inside = [r() is not None for r in pool_ref]
        allocconf.release_pools()
        gc.collect()
        alive_after = [r() is not None for r in pool_ref]
        with allocconf.ipc_safe():
            pass
        print(json.dumps({"errors": errors, "inside": alive_inside,
                          "after": alive_after, "made": Pool.made,
                          "depth": allocconf.status().window_depth}))
    """)
    assert out["errors"] == [
        "allocconf.release_pools: an ipc_safe() window routes to a pool "
        "now; call it once every window has closed"]
    assert out["inside"] == [True]
    assert out["after"] == [False]
    assert out["made"] == 2  # the next window made a new one
    assert out["depth"] == 0
