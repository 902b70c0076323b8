"""The report behind ``python -m allocconf``: what allocconf did, what torch
holds, and what the machine can do (driver, devices, pidfd).

It also lists the neighbours found (docs/neighbours.md), flags torch's
variables set to different values, and says what to do when pidfd, which
sharing expandable segments needs, fails.

``collect()`` gathers it as a JSON-ready dict (schema in docs/report.md);
``render()`` turns that dict into text.  The report runs in its own
process, so it may import torch and initialise CUDA.
"""
from __future__ import annotations

import platform
import sys
from typing import Any, Dict, List, Optional, Tuple

import allocconf
from allocconf import _C
from allocconf._neighbours import _attr

SCHEMA = 1
PROBE_BYTES = 2 << 20  # one 2 MiB tensor each side of an ipc_safe() window


def _torch_info(torch: Any) -> Dict[str, Any]:
    # A torch whose lazy attributes raise is reported as one without them.
    version = _attr(torch, "version")
    cuda = _attr(version, "cuda")
    hip = _attr(version, "hip")
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU"
    return {"version": str(_attr(torch, "__version__")), "build": build}


def _call(f: Any, default: Any) -> Any:
    """f(), or `default` where it raises an ordinary error."""
    try:
        return f()
    except Exception:
        return default


def _backend(torch: Any) -> Optional[str]:
    backend: Optional[str] = _call(
        lambda: torch.cuda.get_allocator_backend(), None)
    return backend


def _segments(torch: Any) -> Dict[str, Dict[str, int]]:
    out = {"expandable": {"count": 0, "bytes": 0},
           "classic": {"count": 0, "bytes": 0}}
    for seg in torch.cuda.memory_snapshot():
        kind = "expandable" if seg.get("is_expandable") else "classic"
        out[kind]["count"] += 1
        out[kind]["bytes"] += int(seg.get("total_size", 0))
    return out


def _segment_of(torch: Any, tensor: Any) -> Optional[bool]:
    ptr = tensor.untyped_storage().data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return bool(seg.get("is_expandable"))
    return None


def _probe(torch: Any) -> Dict[str, Any]:
    """Allocate one tensor as configured and one inside ipc_safe(), and ask
    torch and the driver where each landed."""
    out: Dict[str, Any] = {}
    for label, window in (("default", None), ("ipc_safe", allocconf.ipc_safe())):
        if window is None:
            t = torch.empty(PROBE_BYTES, dtype=torch.uint8, device="cuda")
        else:
            with window:
                t = torch.empty(PROBE_BYTES, dtype=torch.uint8, device="cuda")
        try:
            capable: Optional[bool] = allocconf.ipc_capable(t)
        except RuntimeError:
            capable = None
        out[label] = {"expandable_segment": _segment_of(torch, t),
                      "ipc_capable": capable}
    return out


def collect(probe: bool = True) -> Dict[str, Any]:
    """Gather the report.  Imports torch when it is installed and, when a
    CUDA device is there and ``probe`` is true, allocates two small
    tensors to show where new memory lands."""
    report: Dict[str, Any] = {
        "schema": SCHEMA,
        "allocconf": {"version": allocconf.__version__},
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "platform": sys.platform},
        "torch": None,
        "torch_error": None,
        "backend": None,
        "config": None,
        "expandable_segments": None,
        "driver": _C.driver_info(),
        "pidfd": _C.pidfd_probe(),
        "segments": None,
        "probe": None,
    }
    torch, report["torch_error"] = _import_torch()
    status = allocconf.status()
    live: Optional[str] = None
    live_error: Optional[str] = None
    if torch is not None:
        report["torch"] = dict(_torch_info(torch), setter=status.api)
        cuda = _call(lambda: bool(torch.cuda.is_available()), False)
        report["backend"] = _backend(torch) if cuda else None
        if cuda and probe:
            report["probe"] = _call(lambda: _probe(torch), None)
        if cuda:
            report["segments"] = _call(lambda: _segments(torch), None)
        live, live_error = _live(torch)
        status = allocconf.status()
    report["config"] = {
        "user": status.user_config,
        "source": status.source,
        "written": status.config if status.applied else None,
        "live": live,
        "live_error": live_error,
        "readback": status.readback,
    }
    report["expandable_segments"] = {
        "on": status.expandable_segments,
        "applied": status.applied,
        "reason": status.reason,
    }
    report["status"] = status.as_dict()
    report["neighbours"] = _neighbours_found(status)
    report["variables"] = _variables()
    report["pidfd"]["advice"] = _pidfd_advice(report["pidfd"])
    return report


def _import_torch() -> Tuple[Any, Optional[str]]:
    """(torch, None), or (None, None) where torch is not installed, or
    (None, the error) where importing it failed: an OSError for a missing
    CUDA library, an ImportError raised inside torch, any error its
    ``__init__`` raises.  The report names it instead of dying."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            return None, None
        return None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return torch, None


def _live(torch: Any) -> Tuple[Optional[str], Optional[str]]:
    """(what torch holds, None), (None, None) where torch cannot tell, or
    (None, the error) where its getter raised (torch 2.13+ parses a
    malformed variable only when asked, and raises what the user's first
    allocation will meet)."""
    getter = _attr(_attr(torch, "_C"), "_accelerator_getAllocatorSettings")
    if callable(getter):
        try:
            held = getter()
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"
        return (held if isinstance(held, str) else None), None
    live: Optional[str] = _C._live_config(torch)
    return live, None


def _neighbours_found(status: Any) -> List[Dict[str, Any]]:
    """Each neighbour in this process (status(), or imported here), with
    why it matters and what allocconf did about it."""
    from allocconf._neighbours import NEIGHBOURS

    names = list(status.neighbours)
    names += [n for n in NEIGHBOURS if n in sys.modules and n not in names]
    out = []
    for name in names:
        if "stepped back for " + name in status.reason:
            did = ("allocconf's default stepped back: expandable segments "
                   "off for new memory")
        elif status.expandable_segments:
            did = ("expandable segments are on by choice: hold them off "
                   "around its work with ipc_safe() windows")
        else:
            did = "expandable segments are off: nothing to do"
        out.append({"name": name, "why": NEIGHBOURS.get(name, ""),
                    "allocconf": did})
    return out


def _variables() -> Dict[str, Any]:
    """The variables torch may read that are set, whether they disagree
    (torch reads only the first it finds), and, once torch is imported,
    those whose settings apply nowhere, as status().advice says: this
    torch does not read them for CUDA (2.9 and older ignore
    PYTORCH_ALLOC_CONF, and read PYTORCH_HIP_ALLOC_CONF on ROCm builds
    only; csrc/state/environ.c), or it applies an earlier one that is
    set, holding another string."""
    import os

    inner = _C._internals()
    found = {n: os.environ[n] for n in inner["variables"] if n in os.environ}
    reads = list(inner["reads"]) if inner["attached"] else None
    applied = next((n for n in reads or () if n in found), None)
    ignored = {n: v for n, v in found.items()
               if reads is not None and n != applied
               and (applied is None or v != found[applied])}
    return {"set": found, "conflict": len(set(found.values())) > 1,
            "torch_reads": reads, "ignored": ignored}


def _pidfd_advice(p: Dict[str, Any]) -> Optional[str]:
    if p["ok"] is True:
        return None
    return ("sharing tensors in expandable segments with another process "
            "will fail here (torch's receiver needs pidfd_getfd, which needs "
            "ptrace permission over the sender: containers without "
            "CAP_SYS_PTRACE, Yama ptrace_scope, a non-dumpable sender). "
            "Allocate what you share inside allocconf.ipc_safe(), which "
            "classic CUDA IPC can share without pidfd.")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def render(r: Dict[str, Any]) -> str:
    """The report as text, one fact a line."""
    lines: List[str] = []
    add = lines.append
    add(f"allocconf {r['allocconf']['version']}  (Python "
        f"{r['python']['version']}, {r['python']['platform']})")
    t = r["torch"]
    if t is None and r.get("torch_error"):
        add(f"torch:        cannot be imported: {r['torch_error']}")
    elif t is None:
        add("torch:        not installed")
    else:
        add(f"torch:        {t['version']} ({t['build']} build)")
        add(f"setter:       {t['setter'] or 'none'}")
    add(f"backend:      {r['backend'] or 'unknown (no CUDA device)'}")
    c = r["config"]
    add(f"user config:  {c['user']!r} from {c['source'] or 'nowhere (unset)'}")
    add(f"written:      {c['written']!r}" if c["written"] is not None
        else "written:      nothing")
    if c["live"] is not None:
        add(f"live:         {c['live']!r}")
    elif c.get("live_error"):
        add(f"live:         torch's getter raised {c['live_error']}")
    elif t is None:
        add("live:         no torch to ask")
    else:
        add("live:         torch cannot tell without CUDA initialised")
    if c.get("live_error") and c["readback"]:
        add("readback:     no: torch has its getter, but it raises, so "
            "windows and status() act on what allocconf last wrote or read")
    elif c["readback"] is not None:
        add("readback:     " + (
            "yes: windows and status() act on what torch holds"
            if c["readback"] else
            "no (torch before 2.13 has no getter): a write through a "
            "setter reference taken before allocconf attached is not seen"))
    es = r["expandable_segments"]
    add(f"expandable:   {es['on']}  ({es['reason']})")
    for advice in r["status"]["advice"]:
        add(f"ADVICE:       {advice}")
    st = r["status"]
    add(f"ipc_safe():   {st['window_scope']} scope ("
        f"{st['window_scope_reason']}); pools hold "
        f"{_mib(st['pool_bytes'])}")
    d = r["driver"]
    if d["driver"] is None:
        add(f"driver:       {d['error']}")
    else:
        add(f"driver:       {d['driver']} (CUDA {d['version']})"
            + (f": {d['error']}" if d["error"] else ""))
    for dev in d["devices"]:
        add(f"  device {dev['index']}:   {dev['name']}, sm {dev['capability']},"
            f" VMM {'yes' if dev['vmm'] else 'no'}, POSIX fd handles "
            f"{'yes' if dev['posix_fd_handles'] else 'no'}")
    p = r["pidfd"]
    verdict = {True: "works", False: "FAILS", None: "unsupported"}[p["ok"]]
    add(f"pidfd:        {verdict} (sharing expandable segments across "
        f"processes needs it)")
    for key in ("self", "child_to_parent"):
        if p[key]["ok"] is not True:
            add(f"  {key}: {p[key]['step']}: {p[key]['error']}")
    if p.get("advice"):
        add(f"ADVICE:       {p['advice']}")
    for n in r["neighbours"]:
        add(f"neighbour:    {n['name']}: {n['allocconf']}")
    v = r["variables"]
    if v["conflict"]:
        add("CONFLICT:     " + ", ".join(
            f"{k}={val!r}" for k, val in v["set"].items())
            + ": these disagree and torch reads only one of them (allocconf "
            f"read {r['config']['source'] or 'none'}); keep one.")
    s = r["segments"]
    if s is not None:
        add(f"segments:     expandable {s['expandable']['count']} "
            f"({_mib(s['expandable']['bytes'])}), classic "
            f"{s['classic']['count']} ({_mib(s['classic']['bytes'])})")
    pr = r["probe"]
    if pr is not None:
        for label in ("default", "ipc_safe"):
            add(f"probe {label + ':':<10} expandable segment "
                f"{pr[label]['expandable_segment']}, classic IPC "
                f"{pr[label]['ipc_capable']}")
    return "\n".join(lines)
