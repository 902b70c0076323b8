"""Shared by the benchmarks: medians, the machine's versions, results."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def median(xs: List[float]) -> float:
    return statistics.median(xs)


def per_call(fn: Callable[[], None], n: int) -> float:
    """Seconds per call of fn, over n calls."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def cuda_median(fn: Callable[[], object], runs: int = 5) -> float:
    """Median seconds of `runs` calls of fn on the GPU, each between two
    device synchronisations, after one warm-up call."""
    import torch

    times = []
    for _ in range(runs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return median(times[1:])


def interleaved(cases: Dict[str, Callable[[], None]], n: int,
                rounds: int) -> Dict[str, float]:
    """Median seconds per call of each case, the cases measured in turn in
    every round (alternating their order) so that drift hits all alike."""
    samples: Dict[str, List[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            samples[name].append(per_call(cases[name], n))
    return {k: median(v) for k, v in samples.items()}


def machine() -> Dict[str, Any]:
    """What the figures were measured on."""
    info: Dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda_runtime"] = torch.version.cuda
    except ImportError:
        info["torch"] = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version",
             "--format=csv,noheader"], capture_output=True, text=True,
            timeout=30)
        if out.returncode == 0:
            info["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def save(name: str, result: Dict[str, Any], out_dir: str) -> str:
    """Write result as <out_dir>/<name>.json; return the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    return path


def option(name: str, default: str) -> str:
    """The value after `name` on the command line, else `default`."""
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


def out_dir_arg() -> str:
    """--out DIR from the command line (default: benchmarks/results)."""
    if "--out" in sys.argv:
        return sys.argv[sys.argv.index("--out") + 1]
    return os.path.join(HERE, "results")
