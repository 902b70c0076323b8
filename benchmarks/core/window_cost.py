"""What an ipc_safe() window costs, against the alternatives.

Measured side by side in one process, interleaved round by round:
  window    `with allocconf.ipc_safe(scope="process"): pass` (enter + exit)
  bare      two calls of torch's setter with the same two strings
  bare_read the same pair, each call after a read of torch's getter
            (torch 2.13+): what a window that checks what torch holds
            must do at least, as allocconf's does (docs/design.md,
            "Reading torch back"); the same as bare where torch has no
            getter
  kept      the same two strings written by "another component" through
            the setter allocconf wraps (docs/neighbours.md): for
            information, no target
  snapshot  the common hand-written alternative: read the live
            configuration through torch.cuda.memory._snapshot(), write it
            with expandable_segments off, write the old one back
each with 10 to 10,000 live CUDA tensors (the snapshot walks every block;
allocconf's strings are precomputed).  Targets: window/bare_read <= 1.5
(and window/bare <= 2.0), flat in the number of tensors.  Prints a
table; writes window_cost.json and, with matplotlib, window_cost.png.

Usage: python benchmarks/core/window_cost.py [--out DIR] [--quick]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import allocconf  # noqa: E402  (before torch, as users do)
import torch  # noqa: E402

from common import interleaved, machine, out_dir_arg, save  # noqa: E402

QUICK = "--quick" in sys.argv
CUDA = torch.cuda.is_available()
COUNTS = [0] if not CUDA else [10, 100, 1000, 3000, 10000]


def main() -> None:
    # allocconf wraps torch's setter to keep other components' writes
    # (docs/neighbours.md); the bare pair is torch's own, which is also
    # what allocconf writes through.
    wrapped = torch._C._accelerator_setAllocatorSettings
    setter = getattr(wrapped, "__wrapped__", wrapped)
    on = allocconf.status().config
    off = allocconf.merge(on, expandable_segments=False)
    window = allocconf.ipc_safe(scope="process")

    def with_window() -> None:
        with window:
            pass

    def with_new_window() -> None:
        with allocconf.ipc_safe(scope="process"):
            pass

    def bare_pair() -> None:
        setter(off)
        setter(on)

    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)

    def bare_read_pair() -> None:
        getter()
        setter(off)
        getter()
        setter(on)

    def kept_pair() -> None:  # another component's two writes, merged
        wrapped(off)
        wrapped(on)

    def snapshot_pair() -> None:
        live = torch.cuda.memory._snapshot()["allocator_settings"]
        prev = live.get("PYTORCH_CUDA_ALLOC_CONF", on)
        setter(allocconf.merge(prev, expandable_segments=False))
        setter(prev)

    rows = []
    keep = []
    for count in COUNTS:
        while len(keep) < count:  # small tensors: one block each
            keep.append(torch.empty(1024, device="cuda"))
        cases = {"window": with_window, "window_new": with_new_window,
                 "bare": bare_pair,
                 "bare_read": bare_read_pair if getter else bare_pair}
        n, rounds = (2000, 9) if not QUICK else (200, 3)
        t = interleaved(cases, n, rounds)
        t.update(interleaved({"kept": kept_pair}, n // 4, 3))
        if CUDA:
            snap_n = max(5, min(200, 200_000 // max(count, 1)))
            t.update(interleaved({"snapshot": snapshot_pair},
                                 snap_n if not QUICK else 5, 3))
        row = {"tensors": count,
               **{f"{k}_us": v * 1e6 for k, v in t.items()},
               "ratio": t["window"] / t["bare"],
               "ratio_new": t["window_new"] / t["bare"],
               "ratio_read": t["window_new"] / t["bare_read"]}
        if "snapshot" in t:
            row["snapshot_ratio"] = t["snapshot"] / t["bare"]
        rows.append(row)
        print(f"{count:>6} tensors: window {row['window_us']:.2f} us, "
              f"with ipc_safe() call {row['window_new_us']:.2f} us, bare "
              f"pair {row['bare_us']:.2f} us, ratio {row['ratio']:.2f} "
              f"({row['ratio_new']:.2f}); bare pair with the getter read "
              f"{row['bare_read_us']:.2f} us, ratio {row['ratio_read']:.2f};"
              f" another component's pair kept {row['kept_us']:.2f} us"
              + (f", snapshot {row['snapshot_us']:.1f} us "
                 f"({row['snapshot_ratio']:.0f}x bare)" if CUDA else ""),
              flush=True)
    assert allocconf.status().window_depth == 0
    result = {"machine": machine(), "rows": rows,
              "getter": getter is not None,
              "max_ratio": max(r["ratio_new"] for r in rows),
              "target_ratio": 2.0,
              "max_ratio_read": max(r["ratio_read"] for r in rows),
              "target_ratio_read": 1.5}
    out = out_dir_arg()
    save("window_cost", result, out)
    print(f"worst ratio (window incl. ipc_safe() call / bare pair): "
          f"{result['max_ratio']:.2f} (target <= 2.0); against the bare "
          f"pair with the getter read "
          f"({'read' if getter else 'no getter in this torch'}): "
          f"{result['max_ratio_read']:.2f} (target <= 1.5)")
    plot(rows, os.path.join(out, "window_cost.png"))


def plot(rows, path) -> None:
    if len(rows) < 2:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    x = [r["tensors"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(x, [r["window_new_us"] for r in rows], "o-",
            label="allocconf.ipc_safe() enter+exit")
    ax.plot(x, [r["bare_us"] for r in rows], "s--",
            label="bare pair of torch setter calls")
    if "snapshot_us" in rows[0]:
        ax.plot(x, [r["snapshot_us"] for r in rows], "^-",
                label="torch.cuda.memory._snapshot() read + setter pair")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("live CUDA tensors")
    ax.set_ylabel("microseconds per window (median)")
    ax.set_title("Cost of a window against live tensors")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
