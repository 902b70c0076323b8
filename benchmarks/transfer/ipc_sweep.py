"""The weight-sync sweep: benchmarks/transfer/ipc_sync.py at every size in
one session, each approach in each run (512 bf16 tensors of 0.1, 0.5, 1,
2, 8 and 16 GiB in all, then the llama8b layout), and a table of what it
measured: each approach's warm sync, the transfer's against two device
copies of the same bytes at the bandwidth measured in that run, what
the trainer waits for against one copy, and the one-copy mode's against
one copy.  Writes ipc_sync.json (every
run's record, as ipc_sync.py saves it) and ipc_sync.svg to --out.

A whole sweep outlasts one device call (10 minutes), so it is run in
parts (--sizes 0.1,0.5,1,2 --no-llama, then --sizes 8,16) and the parts'
ipc_sync.json files joined with --merge: their runs in one ipc_sync.json,
ordered by size (llama8b last), one table and one plot, as one sweep
would have written them.  Parts measured on other GPUs or torch builds
are refused: their figures do not belong in one table.

Usage: python benchmarks/transfer/ipc_sweep.py [--out DIR] [--warm N]
           [--sizes 0.1,0.5,...] [--no-llama] [--only a,b]
           [--channel queues|pipes] [--engine-sees device|event]
           (the last two passed to ipc_sync.py)
       python benchmarks/transfer/ipc_sweep.py --out DIR --merge A.json ...
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # its folder, and common.py's

from common import machine, option, out_dir_arg, save  # noqa: E402
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


def write(sweep: Dict[str, Any], out: str) -> None:
    """The sweep's table printed, its ipc_sync.json and plot in out."""
    runs = sweep["runs"]
    print("\n" + HEADER)
    for r in runs:
        print(row(r))
    save("ipc_sync", sweep, out)
    if runs:
        with open(os.path.join(out, "ipc_sync.svg"), "w") as f:
            f.write(svg(runs))


def merged(paths: List[str]) -> Dict[str, Any]:
    """The sweeps saved at paths as one: every run, ordered by size
    (llama8b last); a part measured elsewhere is refused by name."""
    if not paths:
        raise SystemExit("ipc_sweep.py: --merge needs the ipc_sync.json "
                         "files of the parts to join")
    parts = []
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        if not isinstance(part, dict) or not isinstance(
                part.get("runs"), list):
            raise SystemExit(f"ipc_sweep.py: {path} is not a sweep's "
                             f"ipc_sync.json (no list of runs)")
        parts.append((path, part))
    keys = ("gpu", "torch")
    first_path, first = parts[0]
    want = {k: first.get("machine", {}).get(k) for k in keys}
    seen: Dict[Any, str] = {}
    for path, part in parts:
        got = {k: part.get("machine", {}).get(k) for k in keys}
        if got != want:
            raise SystemExit(f"ipc_sweep.py: {path} was measured on {got}, "
                             f"{first_path} on {want}: one table holds "
                             f"one machine's figures")
        for r in part["runs"]:
            key = (r["model"], r["gib"], r["tensors"], r.get("as_nobody"))
            if key in seen:
                raise SystemExit(f"ipc_sweep.py: {path} and {seen[key]} "
                                 f"both hold the run of {r['model']} "
                                 f"{r['gib']:g} GiB: a table holds one")
            seen[key] = path
    runs = [r for _, part in parts for r in part["runs"]]
    runs.sort(key=lambda r: (r["model"] == "llama8b", r["gib"]))
    return {"machine": first.get("machine", {}), "runs": runs,
            "parts": paths}


def main() -> None:
    out = out_dir_arg()
    if "--merge" in sys.argv:
        write(merged(sys.argv[sys.argv.index("--merge") + 1:]), out)
        return
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
    write({"machine": machine(), "runs": runs}, out)


if __name__ == "__main__":
    main()
