"""Every C entry point, error paths included, looped 10^5 times: neither the
C heap nor the reference counts of what was passed in may grow."""
import os

import pytest

from helpers import run_json

# Under tools/sanitized-tests.sh malloc is AddressSanitizer's, which
# glibc's mallinfo2() does not see: these measurements would be empty.
pytestmark = pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="malloc is ASan's here; mallinfo2 cannot measure it")

LOOP = """
import gc, sys, tracemalloc
import allocconf, torch
from allocconf import _C
from helpers.heap import in_use as heap

CONF = "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:8],x:[a:b]"
# What configure() writes must be accepted by every torch (2.1-2.9 refuse
# unknown keys): known keys only.
KNOWN = "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:8]"
BAD = "expandable_segments:True,max_split_size_mb:10"
VALUE = {256: 1, ">": 8}

def swallow(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except (ValueError, TypeError, RuntimeError):
        pass

CASES = {
    "parse": lambda: _C.parse(CONF),
    "parse_error": lambda: swallow(_C.parse, BAD),
    "parse_nul": lambda: swallow(_C.parse, "a:b\\x00"),
    "merge": lambda: _C.merge(CONF, expandable_segments=False,
                              roundup_power2_divisions=VALUE,
                              max_split_size_mb=None),
    "merge_error": lambda: swallow(_C.merge, CONF, max_split_size_mb=1),
    "merge_type_error": lambda: swallow(_C.merge, CONF, x=object),
    "merge_relation_error": lambda: swallow(
        _C.merge, "large_segment_size_mb:64", max_split_size_mb=32),
    "configure": lambda: _C.configure(KNOWN, garbage_collection_threshold=0.5),
    "configure_error": lambda: swallow(_C.configure, BAD),
    "backend_error": lambda: swallow(_C.configure, backend="cudaMallocAsync"),
    "window": lambda: allocconf.ipc_safe().__enter__() and
                      allocconf.ipc_safe().__exit__(None, None, None),
    "window_exit_error": lambda: swallow(
        _C.Window(True).__exit__, None, None, None),
    "new_window": lambda: allocconf.expandable_segments(True),
    "status": lambda: _C.status(),
    "driver_info": lambda: _C.driver_info(),
    "ipc_capable_error": lambda: swallow(_C._pointer_ipc_capable, 4096),
    "live_config": lambda: _C._live_config(torch),
}
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
result = {}
setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or \
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings
watched = [CONF, BAD, VALUE, torch, setter]
for name, fn in CASES.items():
    for _ in range(2000):  # warm caches and free lists
        fn()
    gc.collect()
    refs = [sys.getrefcount(o) for o in watched]
    objects = len(gc.get_objects())
    tracemalloc.start()
    before_py = tracemalloc.get_traced_memory()[0]
    before = heap()
    for _ in range(N):
        fn()
    gc.collect()
    grown = heap() - before
    grown_py = tracemalloc.get_traced_memory()[0] - before_py
    tracemalloc.stop()
    refs_after = [sys.getrefcount(o) for o in watched]
    result[name] = {
        "heap_bytes_per_call": grown / N,
        "py_bytes_per_call": grown_py / N,
        "refs_grown": [a - b for a, b in zip(refs_after, refs)],
        "objects_grown": len(gc.get_objects()) - objects,
    }
print(json.dumps(result))
"""


def test_c_entry_points_do_not_leak():
    out = run_json(LOOP, timeout=900)
    for name, r in out.items():
        # A leak of even 8 bytes a call would show as >= 8 here.
        assert r["heap_bytes_per_call"] < 1.0, (name, r)
        assert r["py_bytes_per_call"] < 1.0, (name, r)
        assert r["refs_grown"] == [0, 0, 0, 0, 0], (name, r)
        assert abs(r["objects_grown"]) < 50, (name, r)


def test_pidfd_probe_does_not_leak_descriptors():
    out = run_json("""
        import os
        from allocconf import _C
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(300):
            _C.pidfd_probe()
        print(json.dumps(len(os.listdir("/proc/self/fd")) - fds))
    """)
    assert out == 0


@pytest.mark.parametrize("planted", [8, 64])
def test_the_leak_check_can_fail(planted):
    # The same measurement sees a planted C leak of `planted` bytes a call.
    out = run_json(f"""
        from helpers.heap import in_use, leak
        before = in_use()
        for _ in range(100_000):
            leak({planted})
        print(json.dumps((in_use() - before) / 100_000))
    """)
    assert out >= planted
