"""What an ipc_safe() window of the opener's scope costs, in time and in
memory, against the process-wide window and torch's own route to a pool.

Time (median per enter + exit, cases interleaved round by round):
  opener        `with allocconf.ipc_safe(): ...` (the default scope)
  process       `with allocconf.ipc_safe(scope="process"): ...`
  use_mem_pool  `with torch.cuda.use_mem_pool(pool): ...` on a MemPool over
                the same allocator: torch's route to a pool, the floor of
                the mechanism
each empty, and each around one 64 MiB allocation freed inside (served
from the cache after the first round); `outside` is that allocation with
no window.  Targets: opener <= 1.5x use_mem_pool, opener <= process.

Memory: 1,000 windows, each allocating and freeing one tensor of 32 to
96 MiB (the same sizes for both scopes), each scope in a fresh process:
what the device gave the window's memory (opener: status().pool_bytes;
process: torch.cuda.memory_reserved() growth) after the 1,000.

Usage: python benchmarks/core/scoped_window.py [--out DIR] [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import allocconf  # noqa: E402  (before torch, as users do)
import torch  # noqa: E402

from common import interleaved, machine, out_dir_arg, save  # noqa: E402

QUICK = "--quick" in sys.argv
MIB = 1 << 20

MEMORY_CHILD = """
import json, random, sys
import allocconf, torch
scope = sys.argv[1]
torch.empty(1, device="cuda")
torch.cuda.synchronize()
reserved0 = torch.cuda.memory_reserved()
rng = random.Random(0)
window = allocconf.ipc_safe(scope=scope)
for _ in range(1000):
    with window:
        t = torch.empty(rng.randint(32, 96) << 20, dtype=torch.uint8,
                        device="cuda")
        del t
torch.cuda.synchronize()
print(json.dumps({
    "pool_bytes": allocconf.status().pool_bytes,
    "reserved_growth": torch.cuda.memory_reserved() - reserved0}))
"""


def timing(n: int, rounds: int) -> dict:
    opener = allocconf.ipc_safe()
    process = allocconf.ipc_safe(scope="process")
    # torch's own route: a pool over allocconf's allocator, as the opener
    # scope's pools are made (python/allocconf/_pools.py).
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        allocconf._C.__file__, allocconf._C.POOL_MALLOC,
        allocconf._C.POOL_FREE)
    pool = torch.cuda.MemPool(allocator.allocator())
    use_mem_pool = torch.cuda.use_mem_pool

    def alloc() -> None:
        t = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        del t

    def empty(ctx):
        def run() -> None:
            with ctx():
                pass
        return run

    def with_alloc(ctx):
        def run() -> None:
            with ctx():
                alloc()
        return run

    def routed():
        return use_mem_pool(pool)

    cases = {
        "opener": empty(lambda: opener),
        "process": empty(lambda: process),
        "use_mem_pool": empty(routed),
    }
    alloc_cases = {
        "opener": with_alloc(lambda: opener),
        "process": with_alloc(lambda: process),
        "use_mem_pool": with_alloc(routed),
        "outside": alloc,
    }
    for fn in list(cases.values()) + list(alloc_cases.values()):
        fn()  # warm: pools made, blocks cached
    torch.cuda.synchronize()
    return {"empty": interleaved(cases, n, rounds),
            "alloc_64mib": interleaved(alloc_cases, max(n // 10, 10),
                                       rounds)}


def memory(scope: str) -> dict:
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, scope],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"memory child ({scope}) failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    out_dir = out_dir_arg()
    if not torch.cuda.is_available():
        print("scoped_window: needs a CUDA GPU; nothing measured")
        return
    torch.empty(1, device="cuda")
    st = allocconf.status()
    if st.window_scope != "opener":
        print(f"scoped_window: windows hold process-wide here "
              f"({st.window_scope_reason}); nothing measured")
        return
    n, rounds = (200, 5) if QUICK else (2000, 15)
    times = timing(n, rounds)
    mem = {scope: memory(scope) for scope in ("opener", "process")}
    e, a = times["empty"], times["alloc_64mib"]
    print(f"{'window (enter+exit)':24s} {'empty us':>9s} "
          f"{'64 MiB alloc us':>16s}")
    for k in ("opener", "process", "use_mem_pool"):
        print(f"{k:24s} {e[k] * 1e6:9.2f} {a[k] * 1e6:16.2f}")
    print(f"{'outside (no window)':24s} {'':9s} {a['outside'] * 1e6:16.2f}")
    print(f"opener / use_mem_pool: empty {e['opener'] / e['use_mem_pool']:.2f}x"
          f", with the allocation {a['opener'] / a['use_mem_pool']:.2f}x "
          f"(target <= 1.5x)")
    print(f"opener / process: empty {e['opener'] / e['process']:.2f}x, with "
          f"the allocation {a['opener'] / a['process']:.2f}x (target <= 1x)")
    print(f"1,000 windows of 32-96 MiB: opener pool holds "
          f"{mem['opener']['pool_bytes'] / MIB:.0f} MiB (main pool grew "
          f"{mem['opener']['reserved_growth'] / MIB:.0f} MiB); process "
          f"window: main pool grew "
          f"{mem['process']['reserved_growth'] / MIB:.0f} MiB")
    save("scoped_window", {"machine": machine(), "n": n, "rounds": rounds,
                           "seconds": times, "memory": mem}, out_dir)


if __name__ == "__main__":
    main()
