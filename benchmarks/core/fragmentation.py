"""Fragmentation under a variable-sequence-length workload.

Like LLM training with random sequence lengths (512 to 8192, hidden 4096,
12 layers, 60 steps, bf16): each step allocates activations whose size
follows the length, frees them in shuffled order while gradient
temporaries come and go, and keeps a small buffer from every step alive
(long-lived buffers pin segments), next to long-lived weights.  The same
seed drives every variant, each in its own process:

  off                      torch alone (no allocconf)
  allocconf-before-torch   import allocconf, torch
  allocconf-after-torch    import torch, allocconf
  allocconf+max_split      the user's max_split_size_mb:128 as well
  allocconf+max_split512   ... or max_split_size_mb:512
  off+max_split            max_split_size_mb:128 alone, for reference
  torch-es, torch-es+max_split
                           no allocconf: expandable segments (and
                           max_split_size_mb:128) from the environment,
                           to tell torch's behaviour from allocconf's

Reports peak reserved / peak allocated and num_alloc_retries; target with
allocconf <= 1.05 in every import order (the "worst" figure is taken over
the import-order variants; the max_split variants show what the user's
max_split_size_mb does next to expandable segments).  Writes fragmentation.json and
fragmentation.png (reserved and allocated against step, off and on).

Usage: python benchmarks/core/fragmentation.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

from common import machine, out_dir_arg, save  # noqa: E402

GiB = 1 << 30
MAX_SPLIT = "max_split_size_mb:128"
VARIANTS = {
    "off": ("import torch", {}),
    "allocconf-before-torch": ("import allocconf, torch", {}),
    "allocconf-after-torch": ("import torch, allocconf", {}),
    "allocconf+max_split": ("import allocconf, torch",
                            {"PYTORCH_CUDA_ALLOC_CONF": MAX_SPLIT}),
    "allocconf+max_split512": ("import allocconf, torch",
                               {"PYTORCH_CUDA_ALLOC_CONF":
                                "max_split_size_mb:512"}),
    "off+max_split": ("import torch", {"PYTORCH_CUDA_ALLOC_CONF": MAX_SPLIT}),
    # Controls without allocconf: torch's own expandable segments.
    "torch-es": ("import torch",
                 {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "torch-es+max_split": ("import torch",
                           {"PYTORCH_CUDA_ALLOC_CONF":
                            "expandable_segments:True," + MAX_SPLIT}),
}


def workload(steps: int = 60, hidden: int = 4096, layers: int = 12,
             seed: int = 0) -> Dict[str, Any]:
    import torch

    rng = random.Random(seed)
    kw = {"dtype": torch.bfloat16, "device": "cuda"}
    weights = [torch.empty(hidden, hidden, **kw) for _ in range(layers)]
    history = []  # one small buffer per step, kept: long-lived
    trace = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        length = rng.randint(512, 8192)
        acts = []
        for _ in range(layers):  # forward
            acts.append(torch.empty(length, hidden, **kw))
            acts.append(torch.empty(length, 2 * hidden, **kw))
            tmp = torch.empty(length, hidden // 2, **kw)
            del tmp
        history.append(torch.empty(length, 128, **kw))
        trace.append((torch.cuda.memory_reserved(),
                      torch.cuda.memory_allocated()))
        order = list(range(len(acts)))
        rng.shuffle(order)
        for j in order:  # backward, out of order
            grad = torch.empty_like(acts[j])
            acts[j] = None
            del grad
    stats = torch.cuda.memory_stats()
    peak_reserved = stats["reserved_bytes.all.peak"]
    peak_allocated = stats["allocated_bytes.all.peak"]
    del weights, history
    return {
        "peak_reserved": peak_reserved,
        "peak_allocated": peak_allocated,
        "ratio": peak_reserved / peak_allocated,
        "num_alloc_retries": stats["num_alloc_retries"],
        "trace": trace,
    }


def worker(imports: str) -> None:
    exec(imports)  # the import order under test
    result = workload()
    if "allocconf" in sys.modules:
        result["status"] = sys.modules["allocconf"].status().as_dict()
    print(json.dumps(result))


def main() -> None:
    results: Dict[str, Any] = {}
    for name, (imports, env) in VARIANTS.items():
        child_env = {k: v for k, v in os.environ.items()
                     if k not in ("PYTORCH_CUDA_ALLOC_CONF", "ALLOCCONF_AUTO")}
        child_env.update(env)
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", imports],
            capture_output=True, text=True, env=child_env, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results[name] = r
        print(f"{name:<24} peak reserved {r['peak_reserved'] / GiB:6.2f} GiB, "
              f"peak allocated {r['peak_allocated'] / GiB:6.2f} GiB, "
              f"reserved/allocated {r['ratio']:.3f}, "
              f"alloc retries {r['num_alloc_retries']}", flush=True)
    on = [results[k]["ratio"] for k in results
          if k.startswith("allocconf") and "max_split" not in k]
    summary = {"worst_with_allocconf": max(on), "off": results["off"]["ratio"],
               "target": 1.05}
    print(f"worst ratio with allocconf (either import order): "
          f"{summary['worst_with_allocconf']:.3f} (target <= 1.05); "
          f"without: {summary['off']:.3f}")
    out = out_dir_arg()
    save("fragmentation", {"machine": machine(), "variants": results,
                           "summary": summary}, out)
    plot(results, os.path.join(out, "fragmentation.png"))


def plot(results: Dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, color in (("off", "tab:red"),
                        ("allocconf-before-torch", "tab:blue")):
        trace = results[name]["trace"]
        steps = range(1, len(trace) + 1)
        label = "without allocconf" if name == "off" else "with allocconf"
        ax.plot(steps, [r / GiB for r, _ in trace], color=color,
                label=f"reserved, {label}")
        ax.plot(steps, [a / GiB for _, a in trace], color=color,
                linestyle=":", label=f"allocated, {label}")
    ax.set_xlabel("step")
    ax.set_ylabel("GiB at the forward peak")
    ax.set_title("Variable sequence lengths: reserved vs allocated memory")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
    else:
        main()
