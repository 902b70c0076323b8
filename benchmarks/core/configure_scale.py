"""configure() against parse() as the configuration grows.

A configuration of N unknown keys (torch's CPU build keeps unknown keys;
nothing else grows a configuration to thousands of entries) is parsed and
merged in through configure(), each timed in a fresh process so earlier
runs leave no state behind.  Target: configure() linear in N, like
parse(): the time per key stays flat as N goes from 5,000 to 40,000
(0.1.0 merged key by key: 4.5 s at 40,000 keys).  Prints a table; writes
configure_scale.json.

Usage: python benchmarks/core/configure_scale.py [--out DIR] [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

from common import machine, out_dir_arg, save  # noqa: E402

QUICK = "--quick" in sys.argv
SIZES = [5_000, 10_000, 20_000, 40_000] if not QUICK else [2_000, 8_000]

CHILD = """
import json, sys, time
import allocconf
n = int(sys.argv[1])
conf = ",".join(f"key_{i}:{i}" for i in range(n))
t0 = time.perf_counter(); allocconf.parse(conf); t1 = time.perf_counter()
allocconf.configure(conf); t2 = time.perf_counter()
print(json.dumps({"parse_s": t1 - t0, "configure_s": t2 - t1}))
"""


def main() -> None:
    rows = []
    for n in SIZES:
        env = dict(os.environ, ALLOCCONF_AUTO="0")
        out = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env,
                             capture_output=True, text=True, check=True,
                             timeout=600)
        row = {"keys": n, **json.loads(out.stdout)}
        row["configure_us_per_key"] = row["configure_s"] / n * 1e6
        row["parse_us_per_key"] = row["parse_s"] / n * 1e6
        rows.append(row)
        print(f"{n:>6} keys: parse {row['parse_s'] * 1e3:8.1f} ms, "
              f"configure {row['configure_s'] * 1e3:8.1f} ms "
              f"({row['configure_us_per_key']:.2f} us per key)", flush=True)
    growth = rows[-1]["configure_us_per_key"] / rows[0]["configure_us_per_key"]
    result = {"machine": machine(), "rows": rows,
              "per_key_growth": growth,
              "target": "per-key time flat (growth well under "
                        f"{SIZES[-1] // SIZES[0]}x, the quadratic figure)"}
    save("configure_scale", result, out_dir_arg())
    print(f"per-key time, {SIZES[-1]} keys against {SIZES[0]}: "
          f"{growth:.2f}x (linear: about 1; quadratic: "
          f"{SIZES[-1] // SIZES[0]}x)")


if __name__ == "__main__":
    main()
