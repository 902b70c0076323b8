"""python -m allocconf [--json] [--no-probe]: report what allocconf did,
what torch holds, and what this machine can do.

Exit status: 0 when the report was made, whatever it found; 2 for a usage
error.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allocconf",
        description="Report allocconf's status, torch's allocator "
        "configuration, the CUDA driver's devices and the pidfd probe.",
    )
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (schema: docs/report.md)")
    parser.add_argument("--no-probe", action="store_true",
                        help="do not allocate the two small probe tensors")
    args = parser.parse_args(argv)  # exits 2 on a usage error

    # `python -m allocconf` has imported the package (and so activated it)
    # before torch, as a user's script would.
    from allocconf import _report

    # The report never dies of what it reports on: a warning the filters
    # turn into an error (`-W error`) is printed as a warning instead.
    # Its advice is printed as ADVICE: lines, not a second time by
    # logging's last-resort handler.
    import logging
    import warnings

    logging.getLogger("allocconf").addHandler(logging.NullHandler())
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        report = _report.collect(probe=not args.no_probe)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(_report.render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
