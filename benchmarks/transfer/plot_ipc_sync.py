"""The benchmarks page's plot of benchmarks/transfer/ipc_sync.py: warm sync
time of each approach, per model, against the time the device needs to
copy the weights once (dashed) and twice (dotted: the floor of any
approach that stages through classic memory).  Plain SVG, no plotting library.

Usage: python benchmarks/transfer/plot_ipc_sync.py OUT.svg RESULT.json [...]
       (RESULT: ipc_sync_uniform.json, ipc_sync_llama8b.json)
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List
from xml.sax.saxutils import escape

COLOURS = {"direct": "#888888", "one-by-one": "#c9a227", "pack": "#4a7fb5",
           "transfer": "#2e9e5b", "one-copy": "#b5473a"}
BAR, GAP, LEFT, WIDTH = 18, 14, 190, 460


def svg(records: List[Dict[str, Any]]) -> str:
    rows = sum(len(r["approaches"]) for r in records)
    height = 40 + rows * BAR + len(records) * (GAP + 22) + 40
    top = max(r["summary"]["copy_limit_ms"] * 2 for r in records)
    top = max([top] + [a["warm_ms"] or 0 for r in records
                       for a in r["approaches"].values()]) * 1.1
    x = lambda ms: LEFT + ms / top * WIDTH  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 150}"'
           f' height="{height}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="8" y="20" font-weight="bold">warm sync, ms (median; '
           'in brackets, over one copy of the weights); dashed: one copy, '
           'dotted: two</text>']
    y = 40
    for r in records:
        limit = r["summary"]["copy_limit_ms"]
        out.append(f'<text x="8" y="{y + 14}" font-weight="bold">'
                   f'{escape(r["model"])}: {r["tensors"]} tensors, '
                   f'{r["gib"]:.1f} GiB</text>')
        y += 22
        y0 = y
        for name, a in r["approaches"].items():
            ms = a["warm_ms"]
            out.append(f'<text x="{LEFT - 6}" y="{y + 13}" '
                       f'text-anchor="end">{escape(name)}</text>')
            if ms is None or a["correct"] is not True:
                out.append(f'<text x="{LEFT + 4}" y="{y + 13}">failed</text>')
            else:
                out.append(f'<rect x="{LEFT}" y="{y + 2}" '
                           f'width="{x(ms) - LEFT:.1f}" height="{BAR - 4}" '
                           f'fill="{COLOURS.get(name, "#555")}"/>')
                out.append(f'<text x="{x(ms) + 4:.1f}" y="{y + 13}">'
                           f'{ms:.1f} ({ms / limit:.1f}x)</text>')
            y += BAR
        for k, dash in ((1, "5,3"), (2, "2,3")):
            out.append(f'<line x1="{x(limit * k):.1f}" y1="{y0}" '
                       f'x2="{x(limit * k):.1f}" y2="{y}" stroke="black" '
                       f'stroke-dasharray="{dash}"/>')
        y += GAP
    out.append(f'<text x="{LEFT}" y="{height - 12}" fill="#555">'
               f'{escape(records[0]["machine"].get("gpu", ""))}, torch '
               f'{escape(str(records[0]["machine"].get("torch")))}; '
               f'benchmarks/transfer/ipc_sync.py</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    records = []
    for path in sys.argv[2:]:
        with open(path) as f:
            records.append(json.load(f))
    with open(sys.argv[1], "w") as f:
        f.write(svg(records))


if __name__ == "__main__":
    main()
