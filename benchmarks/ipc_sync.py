"""Weight sync through CUDA IPC: 8 GiB of bf16 weights in 512 tensors,
allocated with expandable segments on (import allocconf), sent to a
receiver process (spawn) that rebuilds them and checks every element.

  direct      share each expandable tensor as it is (torch >= 2.5 maps
              expandable segments through pidfd_getfd)
  pack        inside ipc_safe(): one flat classic buffer, the weights
              copied in each sync, one tensor shared
  one-by-one  inside ipc_safe(): a classic copy of each tensor, 512 shared

Each approach gets a fresh receiver.  A sync is timed from the sender's
first copy until the receiver has rebuilt and checked everything; the
receiver keeps the previous sync's tensors until the next arrives, as an
inference engine keeps its weights.  Cold = the first sync; warm = the
median of the next ones.  Extra memory = what the sender holds beyond
its weights (the staging copies it holds).  Writes ipc_sync.json.

With --receiver-device N (two GPUs) the receiver copies every tensor onto
its own GPU N before checking, as a trainer-to-inference sync across GPUs
does.

Usage: python benchmarks/ipc_sync.py [--out DIR] [--gib N] [--warm N]
                                     [--receiver-device N]
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import allocconf  # noqa: E402  (expandable segments on, as in training)
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from common import machine, median, out_dir_arg, save  # noqa: E402

GiB = 1 << 30


def arg(name: str, default: int) -> int:
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


TOTAL_GIB = arg("--gib", 8)
RECEIVER_DEVICE = arg("--receiver-device", -1)
WARM = arg("--warm", 5)
COUNT = 512


def receiver(inbox: Any, outbox: Any, device: int) -> None:
    """Rebuild what arrives (copied onto `device` unless it is -1), check
    every element, answer."""
    torch.cuda.init()
    outbox.put("ready")
    while True:
        # `msg` and `tensors` keep the last sync's tensors (and so torch's
        # cached IPC mapping) alive until the next sync replaces them.
        msg = inbox.get()
        if msg is None:
            return
        kind, payload, sizes = msg
        if kind == "flat":
            tensors = list(payload.split(sizes))
        else:
            tensors = payload
        if device >= 0:
            tensors = [t.to(f"cuda:{device}") for t in tensors]
        bad = torch.zeros((), dtype=torch.bool,
                          device=tensors[0].device if tensors else "cuda")
        for i, t in enumerate(tensors):
            bad |= (t != float(i % 200)).any()
        outbox.put(not bool(bad.item()))


def run(approach: str, weights: List[torch.Tensor]) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver,
                       args=(inbox, outbox, RECEIVER_DEVICE))
    proc.start()
    assert outbox.get(timeout=300) == "ready"
    sizes = [w.numel() for w in weights]
    torch.cuda.synchronize()
    allocated0 = torch.cuda.memory_allocated()
    staging: Any = None
    times: List[float] = []
    ok = True
    for i in range(1 + WARM):
        t0 = time.perf_counter()
        if approach == "direct":
            msg = ("list", weights, sizes)
        elif approach == "pack":
            if staging is None:
                with allocconf.ipc_safe():
                    staging = torch.empty(sum(sizes), dtype=weights[0].dtype,
                                          device="cuda")
                views = list(staging.split(sizes))
            torch._foreach_copy_(views, weights)
            msg = ("flat", staging, sizes)
        else:
            if staging is None:
                with allocconf.ipc_safe():
                    staging = [torch.empty_like(w) for w in weights]
            torch._foreach_copy_(staging, weights)
            msg = ("list", staging, sizes)
        torch.cuda.synchronize()
        inbox.put(msg)
        ok &= outbox.get(timeout=600)
        times.append(time.perf_counter() - t0)
    extra = torch.cuda.memory_allocated() - allocated0
    inbox.put(None)
    proc.join(timeout=120)
    shared = staging if approach != "direct" else weights
    first = shared if isinstance(shared, torch.Tensor) else shared[0]
    result = {
        "cold_ms": times[0] * 1e3,
        "warm_ms": median(times[1:]) * 1e3,
        "warm_all_ms": [t * 1e3 for t in times[1:]],
        "extra_gib": extra / GiB,
        "correct": bool(ok),
        "shared_ipc_capable": allocconf.ipc_capable(first),
    }
    del staging, shared, first, msg
    if approach == "pack":
        del views
    torch.cuda.empty_cache()
    return result


def main() -> None:
    assert allocconf.status().expandable_segments is True
    per = TOTAL_GIB * GiB // COUNT // 2  # bf16 elements per tensor
    weights = [torch.full((per,), float(i % 200), dtype=torch.bfloat16,
                          device="cuda") for i in range(COUNT)]
    results: Dict[str, Any] = {}
    for approach in ("pack", "one-by-one", "direct"):
        r = run(approach, weights)
        results[approach] = r
        print(f"{approach:<11} cold {r['cold_ms']:9.1f} ms, warm "
              f"{r['warm_ms']:8.1f} ms (median of {WARM}), extra memory "
              f"{r['extra_gib']:.2f} GiB, correct {r['correct']}, shared "
              f"memory classic-IPC capable {r['shared_ipc_capable']}",
              flush=True)
    d, p = results["direct"], results["pack"]
    summary = {"warm_ratio_direct_over_pack": d["warm_ms"] / p["warm_ms"],
               "cold_ratio_direct_over_pack": d["cold_ms"] / p["cold_ms"]}
    print(f"direct / pack: warm x{summary['warm_ratio_direct_over_pack']:.1f},"
          f" cold x{summary['cold_ratio_direct_over_pack']:.1f}")
    save("ipc_sync", {"machine": machine(), "gib": TOTAL_GIB,
                      "receiver_device": RECEIVER_DEVICE,
                      "tensors": COUNT, "approaches": results,
                      "summary": summary}, out_dir_arg())


if __name__ == "__main__":
    main()
