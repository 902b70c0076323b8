"""Are torch.cat(out=) and torch.split_with_sizes_copy(out=) of many
tensors safe to capture in a CUDA graph (the next step for
allocconf.transfer's copies, docs/design.md, "Kept copies replay from CUDA graphs")?

512 int64 tensors of 1 MiB: each op captured once
(CUDAGraph.capture_begin(capture_error_mode="thread_local") on a side
stream), then replayed 20 times each with new source values, other
eager cat / split calls of other tensors around every replay (so that
any host-side staging torch reuses would be overwritten), each result
compared with the eager op's.  Prints the wrong replays (of 40) and the
host time to launch each op eagerly and as a replay (median of 20).
An empirical check, not a proof: read the kernels' source too.

Usage: python benchmarks/transfer/graph_safety.py
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, List, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

from common import median  # noqa: E402

N, PER = 512, 1 << 17  # 512 x 1 MiB of int64


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    g.capture_begin(capture_error_mode="thread_local")
    fn()
    g.capture_end()
    return g


def main() -> None:
    dev = "cuda"
    srcs = [torch.empty(PER, dtype=torch.int64, device=dev)
            for _ in range(N)]
    flat = torch.empty(N * PER, dtype=torch.int64, device=dev)
    outs = [torch.empty(PER, dtype=torch.int64, device=dev)
            for _ in range(N)]
    sizes = [PER] * N

    def cat() -> None:
        torch.cat(srcs, out=flat)

    def split() -> None:
        torch.split_with_sizes_copy(flat, sizes, out=outs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cat()
        split()  # warm-up outside the capture
        g_cat, g_split = capture(cat), capture(split)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    # other eager cats and splits, of other tensors, around each replay
    half = PER // 2
    o_srcs = [torch.randint(0, 9, (half,), dtype=torch.int64, device=dev)
              for _ in range(300)]
    o_flat = torch.empty(300 * half, dtype=torch.int64, device=dev)
    o_outs = [torch.empty(half, dtype=torch.int64, device=dev)
              for _ in range(300)]
    bad = 0
    for _ in range(20):
        for s in srcs:
            s.random_()
        torch.cat(o_srcs, out=o_flat)
        torch.split_with_sizes_copy(o_flat, [half] * 300, out=o_outs)
        g_cat.replay()
        torch.cat(o_srcs[::-1], out=o_flat)
        bad += not torch.equal(flat, torch.cat(srcs))
        flat.random_()
        g_split.replay()
        torch.split_with_sizes_copy(o_flat, [half] * 300, out=o_outs)
        bad += not all(torch.equal(o, v)
                       for o, v in zip(outs, flat.split(sizes)))
    print(f"graph replays wrong: {bad} of 40")
    ways: List[Tuple[str, Callable[[], object]]] = [
        ("cat eager", cat), ("cat graph", g_cat.replay),
        ("split eager", split), ("split graph", g_split.replay)]
    for name, fn in ways:
        ts = []
        for _ in range(20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        print(f"{name:12} host launch median {median(ts) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
