"""The neighbours allocconf lives with, in one place (docs/neighbours.md).

``NEIGHBOURS`` names each component that cannot live with expandable
segments and why; allocconf's import-time default steps back when one is
in the process (imported, whatever the order, or, for torch_memory_saver,
its hook library in ``LD_PRELOAD``).  ``SETTERS`` names torch's setters,
wrapped when allocconf attaches so that a write by another component
keeps the user's other keys.  ``child_env`` and the opt-in export give the
configuration to those that read the environment.  The state changes
themselves happen in C (csrc/api/neighbours.c), under allocconf's lock.
"""
from __future__ import annotations

import os
import sys

from allocconf import _C

TYPE_CHECKING = False  # typing costs import time; only checkers need it
if TYPE_CHECKING:
    from types import ModuleType
    from typing import (Any, Callable, Dict, List, Mapping, Optional,
                        Tuple)

#: Components that cannot live with expandable segments, and why.
NEIGHBOURS = {
    "torch_memory_saver": (
        "its preload hook mode (LD_PRELOAD, SGLang's default) sees only "
        "cudaMalloc, so memory in an expandable segment is never paused: "
        "pause() freed 0.0 of 8 GiB (measured on an H200); its own check "
        "reads only PYTORCH_CUDA_ALLOC_CONF"),
    "vllm": (
        "its sleep mode and custom all-reduce decide from "
        "PYTORCH_CUDA_ALLOC_CONF, not from the allocator, and custom "
        "all-reduce cannot register expandable CUDA-graph buffers with more "
        "than one GPU (vLLM issue 42609)"),
    "sglang": (
        "it releases memory through torch_memory_saver and decides from "
        "PYTORCH_CUDA_ALLOC_CONF, not from the allocator"),
}

#: The part of an LD_PRELOAD entry that names torch_memory_saver's hooks.
PRELOAD_MARK = "torch_memory_saver"

#: torch's run-time setters, each wrapped when allocconf attaches.  The
#: deprecated ``torch.cuda.memory._set_allocator_settings`` (what verl and
#: vLLM call) looks one of these up at each call, so it is kept through
#: them and keeps torch's own FutureWarning.
SETTERS = (
    "_C._accelerator_setAllocatorSettings",
    "_C._cuda_cudaCachingAllocator_set_allocator_settings",
)

#: The variables torch may read, PYTORCH_CUDA_ALLOC_CONF (which every
#: torch reads first) first; the list lives in csrc/state/environ.c.
VARIABLES: Tuple[str, ...] = _C._internals()["variables"]


def arrived(name: str, why: str) -> List[str]:
    """Tell the state that neighbour `name` is here; the warning to give
    when the default stepped back for it."""
    if not _C._neighbour(name, why):
        return []
    export()
    return [
        f"allocconf: {name} is in this process, and {why}. allocconf's "
        f"default steps back: expandable segments are off for new memory "
        f"from now on (memory already in expandable segments stays there). "
        f"To keep them on, set expandable_segments yourself "
        f"(PYTORCH_CUDA_ALLOC_CONF or allocconf.configure()) or "
        f"ALLOCCONF_STEP_BACK=0; see allocconf's docs/neighbours.md."]


def present() -> List[str]:
    """Record the neighbours already here; return the warnings."""
    messages: List[str] = []
    preload = os.environ.get("LD_PRELOAD", "")
    if any(PRELOAD_MARK in p for p in preload.replace(" ", ":").split(":")):
        messages += arrived(
            "torch_memory_saver", NEIGHBOURS["torch_memory_saver"]
            + " (its hook library is in LD_PRELOAD)")
    for name, why in NEIGHBOURS.items():
        if name in sys.modules:
            messages += arrived(name, why)
    return messages


def missing() -> List[str]:
    """The neighbours not imported yet, to watch for."""
    return [name for name in NEIGHBOURS if name not in sys.modules]


# ---------------------------------------------------------------------------
# Writes by other components
# ---------------------------------------------------------------------------


def _keeping(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """`original`, torch's setter, as a function that keeps what the
    other keys hold: the keys the caller names change, nothing else."""
    import functools

    writer = f"{api}, called by another component"

    def setter(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs:
            if _C._foreign_write(writer, args[0]) is not NotImplemented:
                export()
                return None
        return original(*args, **kwargs)

    try:
        functools.update_wrapper(setter, original)
    except Exception:  # an object without a name: keep ours
        setter.__wrapped__ = original  # type: ignore[attr-defined]
    setter._allocconf_keeps = True  # type: ignore[attr-defined]
    return setter


def _attr(obj: Any, name: str) -> Any:
    """getattr(obj, name), None where it is missing or raises an ordinary
    error: as the C side looks torch over (csrc/torchio/attach.c), so a
    torch whose lazy attributes fail is taken as one without them.
    MemoryError (and KeyboardInterrupt) pass through."""
    try:
        return getattr(obj, name, None)
    except MemoryError:
        raise
    except Exception:
        return None


def wrap_setters(torch: ModuleType) -> List[str]:
    """Replace each of torch's setters that exists with one that keeps
    the user's keys; return the names wrapped."""
    wrapped = []
    for path in SETTERS:
        owner_path, _, attr = path.rpartition(".")
        owner: Any = torch
        for part in owner_path.split("."):
            owner = _attr(owner, part)
        original = _attr(owner, attr)
        if not callable(original) or getattr(original, "_allocconf_keeps",
                                             False):
            continue
        setattr(owner, attr, _keeping(original, f"torch.{path}"))
        wrapped.append(f"torch.{path}")
    return wrapped


# ---------------------------------------------------------------------------
# The environment: children and the opt-in export
# ---------------------------------------------------------------------------

CHILD_CONFIGS = ("same", "user", "off")


def _with_value(env: Dict[str, str], value: str) -> None:
    """Make every variable torch reads that `env` sets, and the one it
    reads first for CUDA, say `value` (or none say anything when it is
    empty)."""
    if not value:
        for name in VARIABLES:
            env.pop(name, None)
        return
    for name in VARIABLES:
        if name == VARIABLES[0] or name in env:
            env[name] = value


def child_env(config: str = "same", *,
              environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    inner = _C._internals()
    if config not in CHILD_CONFIGS:
        raise ValueError(
            f"allocconf.child_env: config must be one of "
            f"{', '.join(map(repr, CHILD_CONFIGS))}, not {config!r}")
    env = dict(os.environ if environ is None else environ)
    env["ALLOCCONF_AUTO"] = "0"
    if config == "same":
        base = inner["base"]
        _with_value(env, base if base is not None else inner["user"] or "")
    elif config == "user":
        _with_value(env, inner["user"] or "")
    return env


def export() -> None:
    """With ALLOCCONF_EXPORT=1, once torch is attached: write the
    configuration torch holds outside windows into the variables torch
    reads, for the neighbours that only read the environment (the one
    place allocconf changes os.environ, and only when asked)."""
    base: Optional[str] = _C._export_base()
    if base is None:
        return
    current = {n: os.environ[n] for n in VARIABLES if n in os.environ}
    wanted = dict(current)
    _with_value(wanted, base)
    if wanted != current:
        for name in VARIABLES:
            if name in wanted:
                os.environ[name] = wanted[name]
            else:
                os.environ.pop(name, None)
