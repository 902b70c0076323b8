"""What `import allocconf` adds to a process start.

Whole processes, measured side by side and interleaved:
  python -c pass               vs  python -c "import allocconf"
  python -c "import torch"     vs  python -c "import allocconf, torch"
Target: at most 2 ms more at the median for the first pair.  Prints the
medians and the differences; writes import_cost.json.

Usage: python benchmarks/core/import_cost.py [--out DIR] [--quick]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

from common import machine, median, out_dir_arg, save  # noqa: E402

QUICK = "--quick" in sys.argv
PAIRS = [
    ("pass", "import allocconf", 60 if not QUICK else 10),
    ("import torch", "import allocconf, torch", 15 if not QUICK else 3),
]


# As users run: bytecode cached (some images set PYTHONDONTWRITEBYTECODE,
# which would add compile time to every run).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def once(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    rows: List[Dict[str, float]] = []
    for base, other, n in PAIRS:
        once(base), once(other)  # warm the file cache
        a: List[float] = []
        b: List[float] = []
        for i in range(n):
            if i % 2 == 0:
                a.append(once(base))
                b.append(once(other))
            else:
                b.append(once(other))
                a.append(once(base))
        row = {"base": base, "with": other, "runs": n,
               "base_ms": median(a) * 1e3, "with_ms": median(b) * 1e3}
        row["extra_ms"] = row["with_ms"] - row["base_ms"]
        row["ratio"] = row["with_ms"] / row["base_ms"]
        rows.append(row)
        print(f"python -c {other!r}: {row['with_ms']:.1f} ms vs "
              f"{base!r}: {row['base_ms']:.1f} ms -> {row['extra_ms']:+.2f} ms "
              f"(x{row['ratio']:.3f}, median of {n})", flush=True)
    result = {"machine": machine(), "rows": rows, "target_extra_ms": 2.0}
    save("import_cost", result, out_dir_arg())


if __name__ == "__main__":
    main()
