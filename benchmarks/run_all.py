"""Run every benchmark and write the results page.

Each benchmark runs as its own process and prints its figures; this
script keeps what each printed, reads the JSON each wrote, and writes
<out>/benchmarks.md (results tables, plots, versions, the command),
<out>/results.json (all figures) and the plots beside them.  To publish
a run, bring its tables into the benchmarks' sections of
docs/benchmarks.md and its PNGs into docs/img/, and keep the page and
JSON, dated, in benchmarks/results/: every number on the page is one a
benchmark printed.

Usage: python benchmarks/run_all.py --out DIR [--only a,b] [--quick]
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(sys.path[0], "transfer"))  # plot_ipc_sync

from common import HERE, machine, out_dir_arg  # noqa: E402

ORDER = ["window_cost", "import_cost", "fragmentation", "copy_methods",
         "ipc_sync", "configure_scale"]
# Where each lives: core/ (the allocator, windows, import, configure()) or
# transfer/ (allocconf.transfer, weight sync).
FOLDER = {"window_cost": "core", "import_cost": "core",
          "fragmentation": "core", "copy_methods": "transfer",
          "ipc_sync": "transfer", "configure_scale": "core"}
# Runs of one script with its arguments, each with its own name.
VARIANTS = {"ipc_sync": {"ipc_sync_uniform": ["--model", "uniform"],
                         "ipc_sync_llama8b": ["--model", "llama8b"],
                         # Needs root (it drops to user 65534) and a
                         # tree that user can read.
                         "ipc_sync_uniform_nobody": [
                             "--model", "uniform", "--gib", "2",
                             "--as-nobody", "--only", "direct,transfer"]}}
IPC_SYNC = ("ipc_sync_uniform", "ipc_sync_llama8b", "ipc_sync_uniform_nobody")


def run(name: str, out: str, extra: List[str]) -> str:
    """Run benchmark `name` (each of its variants in turn); its output."""
    script = os.path.join(HERE, FOLDER[name], f"{name}.py")
    cmd = [sys.executable, script, "--out", out]
    return "".join(run_cmd(cmd + args, extra)
                   for args in VARIANTS.get(name, {name: []}).values())


def run_cmd(cmd: List[str], extra: List[str]) -> str:
    print(f"$ {' '.join(cmd[1:] + extra)}", flush=True)
    proc = subprocess.run(cmd + extra, capture_output=True, text=True,
                          timeout=1800)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.stdout + f"\n(failed, exit {proc.returncode})\n" + (
            proc.stderr[-2000:])
    return proc.stdout


def load(out: str, name: str) -> Dict[str, Any]:
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        data: Dict[str, Any] = json.load(f)
    return data


def copy_methods_section(c: Dict[str, Any],
                         printed: Dict[str, str]) -> List[str]:
    if not c:
        return []
    lines = ["## Copying many tensors into one buffer", "",
             "What allocconf.transfer's packing is built on: the weights "
             "copied into one classic buffer, each way in turn in one run "
             "(median of 5; each way checked first).", "",
             "| weights | way | ms | GB/s |", "|---|---|---:|---:|"]
    for model in ("uniform", "llama8b"):
        for way, r in c.get(model, {}).get("methods", {}).items():
            lines.append(f"| {model} | {way} | {r['ms']:.2f} | "
                         f"{r['gbps']:.0f} |")
    return lines + ["", "```", printed.get("copy_methods", "").strip(),
                    "```", ""]


def ipc_sync_section(runs: List[Dict[str, Any]],
                     printed: Dict[str, str]) -> List[str]:
    runs = [p for p in runs if p]
    if not runs:
        return []
    lines = ["## IPC weight sync", "",
             "The trainer's bf16 weights in expandable segments; an engine "
             "process (spawn) copies what it is sent into its own weights. "
             "A sync is timed until the engine holds them all; its check of "
             "every element comes after, untimed. One copy / its copies: "
             "the warm sync over the time the device copy bandwidth, "
             "measured in the same run, needs to copy the weights once, and "
             "as many times as the approach copies them (direct 1, the "
             "others 2).", ""]
    for p in runs:
        s = p["summary"]
        lines += [f"### {p['model']}, {p['gib']:.2f} GiB in {p['tensors']} "
                  f"tensors" + (", as an unprivileged user"
                                if p["as_nobody"] else ""), "",
                  f"Device copy {s['copy_gbps']:.0f} GB/s: "
                  f"{s['copy_limit_ms']:.1f} ms to copy the weights once.",
                  "", "| approach | cold (ms) | warm (ms, median) | / one "
                  "copy | / its copies | extra memory (GiB) | correct |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for approach, r in p["approaches"].items():
            warm = (f"{r['warm_ms']:.1f} | {r['warm_over_copy_limit']:.2f}x"
                    f" | {r['warm_over_own_floor']:.2f}x"
                    if r["warm_ms"] is not None else "- | - | -")
            lines.append(f"| {approach} | {r['cold_ms']:.1f} | {warm} | "
                         f"{r['extra_gib']:.2f} | {r['correct']} |")
        lines.append("")
    said = [ln for ln in printed.get("ipc_sync", "").splitlines()
            if not ln.startswith("{")]  # the JSON line is in the file
    return lines + ["![IPC weight sync](img/ipc_sync.svg)", "", "```",
                    "\n".join(said).strip(), "```", ""]


def page(out: str, printed: Dict[str, str], command: str) -> str:
    m = machine()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `benchmarks/run_all.py`; every figure below is one the",
        "benchmark printed (its output is quoted under each table).",
        "",
        f"- Command: `{command}`",
        f"- Date: {datetime.date.today().isoformat()}",
        f"- GPU: {m.get('gpu', 'none')}, driver {m.get('driver', 'n/a')}, "
        f"CUDA runtime {m.get('cuda_runtime', 'n/a')}",
        f"- torch {m.get('torch')}, Python {m['python']}, "
        f"{m['cpu_count']} CPUs, {m['platform']}",
        "",
    ]
    w = load(out, "window_cost")
    if w:
        lines += [
            "## Window cost",
            "",
            "`with allocconf.ipc_safe(): pass` against a bare pair of torch",
            "setter calls with the same strings, against the same pair with",
            "torch's getter read before each call (what a window that acts",
            "on what torch holds must do at least; the bare pair where this",
            "torch has no getter), and against reading the live configuration",
            "through `torch.cuda.memory._snapshot()` on every window. Medians,",
            "interleaved in one process.",
            "",
            "| live tensors | ipc_safe() window (us) | bare setter pair (us) "
            "| ratio | pair with the getter read (us) | ratio "
            "| _snapshot() pattern (us) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in w["rows"]:
            snap = (f"{r['snapshot_us']:.1f} ({r['snapshot_ratio']:.0f}x bare)"
                    if "snapshot_us" in r else "n/a")
            read = r.get("bare_read_us", r["bare_us"])
            lines.append(f"| {r['tensors']} | {r['window_new_us']:.2f} | "
                         f"{r['bare_us']:.2f} | {r['ratio_new']:.2f} | "
                         f"{read:.2f} | {r['window_new_us'] / read:.2f} | "
                         f"{snap} |")
        lines += ["", f"Worst ratio: **{w['max_ratio']:.2f}** (target <= 2.0); "
                  f"against the pair with the getter read "
                  f"**{w.get('max_ratio_read', w['max_ratio']):.2f}** "
                  f"(target <= 1.5"
                  + ("" if w.get("getter", True) else
                     "; this torch has no getter") + ").", ""]
        if os.path.exists(os.path.join(out, "window_cost.png")):
            lines += ["![window cost](img/window_cost.png)", ""]
        lines += ["```", printed.get("window_cost", "").strip(), "```", ""]
    i = load(out, "import_cost")
    if i:
        lines += ["## Import cost", "",
                  "Whole processes, interleaved; medians.", "",
                  "| command | median (ms) | baseline | median (ms) | extra (ms) |",
                  "|---|---:|---|---:|---:|"]
        for r in i["rows"]:
            lines.append(f"| `{r['with']}` | {r['with_ms']:.1f} | "
                         f"`{r['base']}` | {r['base_ms']:.1f} | "
                         f"{r['extra_ms']:+.2f} |")
        lines += ["", "Target: at most 2 ms more for `import allocconf`.", "",
                  "```", printed.get("import_cost", "").strip(), "```", ""]
    f = load(out, "fragmentation")
    if f:
        lines += ["## Fragmentation", "",
                  "Variable sequence lengths (512-8192, hidden 4096, 12 layers,",
                  "60 steps, bf16), activations freed out of order, long-lived",
                  "buffers. Each variant in its own process, same seed.", "",
                  "| variant | peak reserved (GiB) | peak allocated (GiB) "
                  "| reserved / allocated | alloc retries |",
                  "|---|---:|---:|---:|---:|"]
        for name, r in f["variants"].items():
            lines.append(f"| {name} | {r['peak_reserved'] / 2**30:.2f} | "
                         f"{r['peak_allocated'] / 2**30:.2f} | "
                         f"{r['ratio']:.3f} | {r['num_alloc_retries']} |")
        s = f["summary"]
        lines += ["", f"Worst with allocconf: **{s['worst_with_allocconf']:.3f}**"
                  f" (target <= 1.05); without: {s['off']:.3f}.", ""]
        if os.path.exists(os.path.join(out, "fragmentation.png")):
            lines += ["![fragmentation](img/fragmentation.png)", ""]
        lines += ["```", printed.get("fragmentation", "").strip(), "```", ""]
    lines += copy_methods_section(load(out, "copy_methods"), printed)
    lines += ipc_sync_section([load(out, n) for n in IPC_SYNC], printed)
    c = load(out, "configure_scale")
    if c:
        lines += ["## configure() as the configuration grows", "",
                  "N unknown keys parsed, then merged in by configure(), each"
                  " size in a fresh process.", "",
                  "| keys | parse (ms) | configure (ms) | configure per key "
                  "(us) |", "|---:|---:|---:|---:|"]
        for r in c["rows"]:
            lines.append(f"| {r['keys']} | {r['parse_s'] * 1e3:.1f} | "
                         f"{r['configure_s'] * 1e3:.1f} | "
                         f"{r['configure_us_per_key']:.2f} |")
        lines += ["", f"Per-key time growth over the range: "
                  f"**{c['per_key_growth']:.2f}x** (linear: about 1).", "",
                  "```", printed.get("configure_scale", "").strip(), "```",
                  ""]
    return "\n".join(lines)


def main() -> None:
    out = out_dir_arg()
    os.makedirs(out, exist_ok=True)
    raw = tempfile.mkdtemp(prefix="allocconf-bench-")
    os.chmod(raw, 0o1777)  # the --as-nobody run saves here as user 65534
    only = ORDER
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    extra = ["--quick"] if "--quick" in sys.argv else []
    printed = {name: run(name, raw, extra) for name in ORDER if name in only}
    command = "python benchmarks/run_all.py " + " ".join(sys.argv[1:])
    text = page(raw, printed, command)
    with open(os.path.join(out, "benchmarks.md"), "w") as fh:
        fh.write(text + "\n")
    results = {name: load(raw, name) for name in ORDER if name in only}
    results["printed"] = printed
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1, sort_keys=True)
    for png in ("window_cost.png", "fragmentation.png"):
        if os.path.exists(os.path.join(raw, png)):
            shutil.copy(os.path.join(raw, png), os.path.join(out, png))
    plotted = [r for r in (load(raw, n) for n in IPC_SYNC[:2]) if r]
    if plotted:
        from plot_ipc_sync import svg
        with open(os.path.join(out, "ipc_sync.svg"), "w") as fh:
            fh.write(svg(plotted))
    shutil.rmtree(raw, ignore_errors=True)
    print(f"wrote {os.path.join(out, 'benchmarks.md')} and results.json")


if __name__ == "__main__":
    main()
