"""The weight-sync sweep: benchmarks/ipc_sync.py at every size in one
session, each approach in each run (512 bf16 tensors of 0.1, 0.5, 1, 2, 8
and 16 GiB in all, then the llama8b layout), and a table of what it
measured: each approach's warm sync, the transfer's against two device
copies of the same bytes at the bandwidth measured in that run, what
the trainer waits for against one copy, and the one-copy mode's against
one copy.  Writes ipc_sync.json (every
run's record, as ipc_sync.py saves it) and ipc_sync.svg to --out.

Usage: python benchmarks/ipc_sweep.py [--out DIR] [--warm N]
           [--sizes 0.1,0.5,...] [--no-llama] [--only a,b]
           [--channel queues|pipes] [--engine-sees device|event]
           (the last two passed to ipc_sync.py)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import HERE, machine, option, out_dir_arg, save  # noqa: E402
from plot_ipc_sync import svg  # noqa: E402

SIZES = "0.1,0.5,1,2,8,16"


def row(r: Dict[str, Any]) -> str:
    a = r["approaches"]
    limit = r["summary"]["copy_limit_ms"]

    def ms(name: str, key: str = "warm_ms") -> str:
        x = a.get(name, {})
        return (f"{x[key]:.2f}" if x.get(key) is not None
                and x.get("correct") is True else "-")
    t = a.get("transfer", {})
    ok = t.get("correct") is True and t.get("warm_ms") is not None
    size = ("llama8b" if r["model"] == "llama8b" else
            f"{r['gib']:.1f} GiB")
    tail = (f" | {t['warm_ms'] / (2 * limit):.2f}x | "
            f"{t['trainer_ms']:.2f} ({t['trainer_ms'] / limit:.2f}x"
            f"{'' if r['fits_buffers'] else ', buffers reused'}) |"
            if ok else " | - | - |")
    o = a.get("one-copy", {})
    one = (f" {o['warm_ms'] / limit:.2f}x |"
           if o.get("correct") is True and o.get("warm_ms") is not None
           else " - |")
    return (f"| {size} | {r['tensors']} | {limit:.2f} | {2 * limit:.2f} | "
            + " | ".join(ms(n) for n in ("direct", "one-by-one", "pack",
                                         "transfer")) + tail
            + f" {ms('one-copy')} |" + one)

HEADER = ("| weights | tensors | one copy (ms) | two copies | direct | "
          "one-by-one | pack | transfer | transfer / two copies | "
          "trainer waits (ms, / one copy) | one-copy | one-copy / one copy "
          "|\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def main() -> None:
    out = out_dir_arg()
    runs: List[Dict[str, Any]] = []
    common = ["--out", out, "--warm", option("--warm", "5")]
    for flag in ("--only", "--channel", "--engine-sees"):
        if flag in sys.argv:
            common += [flag, option(flag, "")]
    cases = [["--model", "uniform", "--gib", g]
             for g in option("--sizes", SIZES).split(",")]
    if "--no-llama" not in sys.argv:
        cases.append(["--model", "llama8b"])
    for case in cases:
        cmd = [sys.executable, os.path.join(HERE, "ipc_sync.py")] + case \
            + common
        print("$", " ".join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        lines = done.stdout.splitlines()
        print("\n".join(ln for ln in lines if not ln.startswith("{")),
              flush=True)
        records = [json.loads(ln) for ln in lines if ln.startswith("{")]
        if done.returncode != 0 or not records:
            print(f"failed (exit {done.returncode})", flush=True)
            continue
        runs.append(records[-1])
    print("\n" + HEADER)
    for r in runs:
        print(row(r))
    save("ipc_sync", {"machine": machine(), "runs": runs}, out)
    if runs:
        with open(os.path.join(out, "ipc_sync.svg"), "w") as f:
            f.write(svg(runs))


if __name__ == "__main__":
    main()
