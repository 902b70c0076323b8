"""How to copy many tensors into one flat buffer on the GPU, and out of it
again, fastest: the question behind allocconf.transfer's packing (the
trainer's copy into a bucket) and its receiver's load (the copy out).

For the weights of --model uniform (512 bf16 tensors of 0.1, 2 and 8 GiB
in all) and llama8b (the shapes of an 8B Llama-style model, 15 GiB),
each way in the same run, into one classic flat buffer ("in"), out of
it into the tensors ("out"), or from each tensor straight into another
tensor of its own, allocated apart ("across": the one-copy mode's
copies, trainer weights into engine weights):

  reference    one copy_ of a single tensor of the same total bytes
  copy_        one Tensor.copy_ per tensor (cudaMemcpyAsync, device to
               device)
  foreach-int  one torch._foreach_copy_ over the tensors seen as int64
               (bit for bit; as bf16 its kernel rounds through float)
  cat          in: one torch.cat(out=) of the tensors seen as int64
  split-copy   out: one torch.split_with_sizes_copy(out=) of the buffer
               seen as int64
  graph        the copy_ per tensor captured once in a CUDA graph, each
               sync one replay
  streams-K    across: the copy_ per tensor dealt round-robin to K
               streams (K = 2, 4), so that one copy's ramp overlaps
               another's tail
  graph-K      across: the same captured once in a CUDA graph of K
               parallel branches

Every view a method needs is made before it is timed (a sync that
follows its plan makes none).  Each is checked (the destination zeroed,
copied once, compared), then timed: median of 5 after one warm-up, each
between two device synchronisations; "launch" is the host's time to
queue it.  GB/s counts the bytes copied.  Writes copy_methods.json.

Usage: python benchmarks/transfer/copy_methods.py [--out DIR]
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import allocconf  # noqa: E402  (the weights in expandable segments)
import torch  # noqa: E402

from common import cuda_median, machine, median, out_dir_arg, save  # noqa: E402
from ipc_sync import llama8b_shapes  # noqa: E402

GiB = 1 << 30


def as_int(ts: List[torch.Tensor]) -> List[torch.Tensor]:
    return [t.view(-1).view(torch.int64) for t in ts]


def graphed(fn: Callable[[], None]) -> Callable[[], None]:
    """fn captured once in a CUDA graph; the result replays it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        fn()
    return g.replay


def dealt(pairs: List[Tuple[torch.Tensor, torch.Tensor]], k: int,
          streams: List[Any]) -> Callable[[], None]:
    """The copy_ of each pair, dealt round-robin to `k` streams that fork
    from the current one and join it again."""
    def run() -> None:
        here = torch.cuda.current_stream()
        for s in streams[:k]:
            s.wait_stream(here)
        for i, (d, s_) in enumerate(pairs):
            with torch.cuda.stream(streams[i % k]):
                d.copy_(s_)
        for s in streams[:k]:
            here.wait_stream(s)
    return run


def methods(tensors: List[torch.Tensor], flat: torch.Tensor,
            whole: torch.Tensor, way: str,
            others: List[torch.Tensor]) -> Dict[str, Callable[[], None]]:
    parts = [v.view(t.shape) for v, t in
             zip(flat.split([t.numel() for t in tensors]), tensors)]
    src, dst = {"in": (tensors, parts), "out": (parts, tensors),
                "across": (tensors, others)}[way]
    isrc, idst = as_int(src), as_int(dst)
    flat_int = flat.view(torch.int64)
    sizes = [t.numel() for t in idst] if way == "out" else []
    pairs: List[Tuple[torch.Tensor, torch.Tensor]] = list(zip(dst, src))

    def each() -> None:
        for d, s in pairs:
            d.copy_(s)

    out: Dict[str, Callable[[], None]] = {
        "reference": (lambda: flat.copy_(whole)) if way == "in"
        else (lambda: whole.copy_(flat)),
        "copy_": each,
        "foreach-int": lambda: torch._foreach_copy_(idst, isrc),
    }
    if way == "in":
        out["cat"] = lambda: torch.cat(isrc, out=flat_int)
    elif way == "out":
        out["split-copy"] = lambda: torch.split_with_sizes_copy(
            flat_int, sizes, out=idst)
    out["graph"] = graphed(each)
    if way == "across":
        streams = [torch.cuda.Stream() for _ in range(4)]
        for k in (2, 4):
            out[f"streams-{k}"] = dealt(pairs, k, streams)
            out[f"graph-{k}"] = graphed(dealt(pairs, k, streams))
    return out


def measure(fn: Callable[[], None]) -> Tuple[float, float]:
    """(seconds on the device, seconds to launch), medians of 5."""
    seconds = cuda_median(fn)
    launch = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        launch.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return seconds, median(launch)


def main() -> None:
    cases: List[Tuple[str, List[Any]]] = [
        (f"uniform-{g}", [(int(g * GiB) // 512 // 2 // 64 * 64,)] * 512)
        for g in (0.1, 2, 8)]
    cases.append(("llama8b", [shape for _, shape in llama8b_shapes()]))
    record: Dict[str, Any] = {"machine": machine()}
    for model, shapes in cases:
        tensors = [torch.full(s, 1.0, dtype=torch.bfloat16, device="cuda")
                   for s in shapes]
        n = sum(t.numel() for t in tensors)
        with allocconf.ipc_safe():  # the buffer in classic memory
            flat = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            # the engine's weights, each its own allocation
            others = [torch.empty_like(t) for t in tensors]
        whole = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        nbytes = n * 2
        figures: Dict[str, Any] = {}
        for way in ("in", "out", "across"):
            flat.fill_(1.0)
            for t in tensors:
                t.fill_(1.0)
            for name, fn in methods(tensors, flat, whole, way,
                                    others).items():
                target = {"in": [flat], "out": tensors,
                          "across": others}[way]
                if way == "in":
                    flat.zero_()
                else:
                    torch._foreach_zero_(target)
                    whole.zero_()
                fn()
                torch.cuda.synchronize()
                ok = (torch.equal(whole, torch.ones_like(whole))
                      if name == "reference" and way != "in" else
                      all(bool((t == 1).all()) for t in target))
                assert ok, (model, way, name)  # it copied everything
                if way != "in":
                    whole.fill_(1.0)
                s, launch = measure(fn)
                figures[f"{way}:{name}"] = {
                    "ms": s * 1e3, "launch_ms": launch * 1e3,
                    "gbps": nbytes / s / 1e9}
                print(f"{model:<12} {len(tensors):4d} tensors "
                      f"{nbytes / GiB:6.2f} GiB {way:<3} {name:<12} "
                      f"{s * 1e3:7.3f} ms {nbytes / s / 1e9:6.0f} GB/s "
                      f"(launch {launch * 1e3:6.3f} ms)", flush=True)
        record[model] = {"tensors": len(tensors), "gib": nbytes / GiB,
                         "methods": figures}
        del tensors, flat, whole, others
        torch.cuda.empty_cache()
    save("copy_methods", record, out_dir_arg())


if __name__ == "__main__":
    main()
