"""ipc_safe() in the opener's scope on a GPU: what the opening thread (or
coroutine) allocates is classic and shareable, everything else keeps
expandable segments, torch's setter is never written, and the pool's
memory goes back."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

# Counts the calls of torch's setter that reach torch (allocconf's own
# writes and everyone else's), from before allocconf is imported.
COUNT_SETTER = """
    import torch
    _setter = torch._C._accelerator_setAllocatorSettings
    WRITES = []
    def _counting(s):
        WRITES.append(s)
        return _setter(s)
    torch._C._accelerator_setAllocatorSettings = _counting
    import allocconf
    from helpers.gpu import alloc, expandable
    torch.cuda.init()
    torch.empty(1, device="cuda")
"""


def test_window_tensor_classic_other_thread_expandable_no_setter_write():
    out = run_json(COUNT_SETTER, """
        import threading
        before = len(WRITES)
        inside, during = {}, {}
        go, done = threading.Barrier(2), threading.Barrier(2)

        def other():
            go.wait(timeout=60)
            during["t"] = alloc(64)
            done.wait(timeout=60)

        th = threading.Thread(target=other)
        th.start()
        with allocconf.ipc_safe():
            inside["t"] = alloc(64)
            go.wait(timeout=60)
            done.wait(timeout=60)
            depth = allocconf.status().window_depth
        th.join(timeout=60)
        after = alloc(64)
        st = allocconf.status()
        print(json.dumps({
            "scope": st.window_scope,
            "inside_expandable": expandable(inside["t"]),
            "inside_ipc": allocconf.ipc_capable(inside["t"]),
            "during_expandable": expandable(during["t"]),
            "after_expandable": expandable(after),
            "setter_writes": len(WRITES) - before,
            "depth_inside": depth, "depth_after": st.window_depth,
            "pool_bytes": st.pool_bytes}))
    """, timeout=300)
    assert out["scope"] == "opener"
    assert out["inside_expandable"] is False and out["inside_ipc"] is True
    assert out["during_expandable"] is True
    assert out["after_expandable"] is True
    assert out["setter_writes"] == 0
    assert (out["depth_inside"], out["depth_after"]) == (1, 0)
    assert out["pool_bytes"] >= 64 << 20


def test_nested_windows_exceptions_and_the_process_scope_beside():
    out = run_json(COUNT_SETTER, """
        got = {}
        try:
            with allocconf.ipc_safe():
                with allocconf.ipc_safe():
                    got["inner"] = alloc(8)
                got["outer"] = alloc(8)
                raise KeyError("boom")
        except KeyError:
            pass
        got["after"] = alloc(8)
        before = len(WRITES)
        with allocconf.ipc_safe(scope="process"):
            got["process"] = alloc(8)
        print(json.dumps({k: expandable(v) for k, v in got.items()} | {
            "process_writes": len(WRITES) - before,
            "depth": allocconf.status().window_depth}))
    """, timeout=300)
    assert out == {"inner": False, "outer": False, "after": True,
                   "process": False, "process_writes": 2, "depth": 0}


def test_async_window_holds_only_while_its_coroutine_runs():
    out = run_json(COUNT_SETTER, """
        import asyncio
        got = {}

        @allocconf.ipc_safe()
        async def sync_weights():
            got["before_await"] = alloc(8)
            await asyncio.sleep(0.05)
            got["after_await"] = alloc(8)

        async def train_step():
            await asyncio.sleep(0.01)  # runs during sync_weights' await
            got["other_task"] = alloc(8)

        async def main():
            await asyncio.gather(sync_weights(), train_step())

        asyncio.run(main())
        print(json.dumps({k: expandable(v) for k, v in got.items()}))
    """, timeout=300)
    assert out == {"before_await": False, "after_await": False,
                   "other_task": True}


def test_generator_decorated_holds_per_step():
    out = run_json(COUNT_SETTER, """
        got = []

        @allocconf.ipc_safe()
        def gen():
            for _ in range(2):
                yield alloc(8)

        for t in gen():
            got.append((expandable(t), expandable(alloc(8))))
        print(json.dumps(got))
    """, timeout=300)
    assert out == [[False, True], [False, True]]


def test_window_before_cuda_is_up_leaves_it_down_then_holds():
    out = run_json("""
        import allocconf, torch
        from helpers.gpu import expandable
        with allocconf.ipc_safe():
            pass
        up_after_empty = torch.cuda.is_initialized()
        with allocconf.ipc_safe():
            t = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        print(json.dumps({"up_after_empty": up_after_empty,
                          "expandable": expandable(t),
                          "ipc": allocconf.ipc_capable(t)}))
    """, timeout=300)
    assert out == {"up_after_empty": False, "expandable": False,
                   "ipc": True}


def test_pool_keeps_freed_memory_for_the_next_window_and_stays_flat():
    # torch cannot empty a pool in use (empty_cache passes over it), and
    # ending one is unsafe while other pool contexts are open: the pool
    # keeps what a window freed, and the next window takes it again.
    out = run_json(COUNT_SETTER, """
        def held():
            return allocconf.status().pool_bytes
        with allocconf.ipc_safe():
            t = alloc(256)
        first = held()
        del t
        torch.cuda.empty_cache()
        after_empty = held()
        for _ in range(100):
            with allocconf.ipc_safe():
                t = alloc(256)
                del t
        print(json.dumps({"first": first, "after_empty": after_empty,
                          "after_100": held()}))
    """, timeout=300)
    assert out["first"] >= 256 << 20
    assert out["after_empty"] == out["first"]
    assert out["after_100"] == out["first"]


def test_release_pools_gives_the_memory_back():
    out = run_json(COUNT_SETTER, """
        def held():
            return allocconf.status().pool_bytes
        with allocconf.ipc_safe():
            t = alloc(256)
            del t
        cached = held()
        free0 = torch.cuda.mem_get_info()[0]
        allocconf.release_pools()
        after_free = held()
        freed = torch.cuda.mem_get_info()[0] - free0
        with allocconf.ipc_safe():
            kept = alloc(256)
        allocconf.release_pools()
        while_kept = held()
        kept.fill_(1)  # still usable: its pool ends only once it is freed
        torch.cuda.synchronize()
        del kept
        torch.cuda.empty_cache()
        print(json.dumps({"cached": cached, "after_free": after_free,
                          "freed": freed, "while_kept": while_kept,
                          "after_empty": held()}))
    """, timeout=300)
    assert out["cached"] >= 256 << 20
    assert out["after_free"] == 0
    assert out["freed"] >= 256 << 20
    assert out["while_kept"] >= 256 << 20
    assert out["after_empty"] == 0


def test_classic_ipc_as_nobody_non_dumpable():
    # The sharing process runs as uid 65534 and is not dumpable: memory in
    # an expandable segment cannot be shared from it (pidfd_getfd fails),
    # classic memory can.
    out = run_json("""
        import ctypes, os
        import allocconf, torch
        from helpers.gpu import arange_seen_by_spawned_child, expandable
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE: 0
        torch.empty(1, device="cuda")
        with allocconf.ipc_safe():
            t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
        same, exitcode = arange_seen_by_spawned_child(t)
        print(json.dumps({"same": same, "exitcode": exitcode,
                          "expandable": expandable(t),
                          "scope": allocconf.status().window_scope,
                          "uid": os.getuid()}))
    """, timeout=300)
    assert out == {"same": True, "exitcode": 0, "expandable": False,
                   "scope": "opener", "uid": 65534}


def test_cuda_graph_capture_inside_a_window():
    out = run_json(COUNT_SETTER, """
        x = torch.ones(1 << 20, device="cuda")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x * 2  # warm up outside capture
        torch.cuda.current_stream().wait_stream(s)
        with allocconf.ipc_safe():
            with torch.cuda.graph(g):
                y = x * 2
        x.fill_(3)
        g.replay()
        torch.cuda.synchronize()
        print(json.dumps({"value": float(y[0]), "y_expandable": expandable(y),
                          "depth": allocconf.status().window_depth}))
    """, timeout=300)
    # The capture is the inner pool context: its allocations go to the
    # graph's own pool (expandable, as the process is), not allocconf's.
    assert out["value"] == 6.0
    assert out["depth"] == 0
    assert out["y_expandable"] is True
