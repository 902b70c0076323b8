"""allocconf: PyTorch's expandable segments on at import, nothing lost.

``import allocconf`` (before or after ``import torch``) turns on
``expandable_segments`` for torch's CUDA caching allocator through torch's
own run-time setter, carrying every other setting the user made.  It never
imports torch, never initialises CUDA and never changes ``os.environ``.

``with allocconf.ipc_safe():`` holds expandable segments off, so that the
tensors allocated inside can be shared by classic CUDA IPC, and restores
the previous configuration when the last window closes.

The work is done by the C extension ``allocconf._C``; this module is the
public face and the import-time activation.
"""
from __future__ import annotations

import sys
import warnings

from allocconf import _C, _neighbours, _pools
from allocconf._windows import expandable_segments, ipc_safe, release_pools
from allocconf._C import AllocConfError, AllocConfWarning, merge, parse

__version__ = "0.1.0"
__all__ = [
    "AllocConfError",
    "AllocConfWarning",
    "Status",
    "check_ipc",
    "child_env",
    "configure",
    "expandable_segments",
    "ipc_capable",
    "ipc_safe",
    "merge",
    "parse",
    "release_pools",
    "set_expandable_segments",
    "status",
]

TYPE_CHECKING = False  # typing costs import time; only checkers need it
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Dict, List, Mapping, Optional, Union

    from allocconf._status import Status


def status() -> Status:
    """What allocconf did and why: an :class:`allocconf.Status`."""
    from allocconf._status import Status

    return Status(**_C.status(), warnings=tuple(_KEPT))


def configure(conf: Optional[str] = None, /, **overrides: Any) -> str:
    """Merge settings into the allocator configuration and write it.

    ``conf`` is a configuration string (``"max_split_size_mb:512"``) and
    each keyword overrides one key (``expandable_segments=True``,
    ``roundup_power2_divisions={256: 1, ">": 8}``; ``None`` removes a key).
    Everything already configured is kept.  The full result is written to
    torch at once, or when torch is imported, and returned.  Open windows
    keep holding expandable segments as they do until they close.

    Raises :class:`AllocConfError` naming the key and offset of a bad
    setting, or saying that torch refused the result (torch's own error is
    its ``__cause__``), with nothing changed either way.  Values are turned
    into text before anything is locked, so a value's ``__str__`` may call
    allocconf.
    """
    result: str = _C.configure(conf, **overrides)
    _log(20, "configure(): now %r", result)  # INFO
    _neighbours.export()
    return result


def set_expandable_segments(enable: bool) -> None:
    """Turn expandable segments on or off, keeping every other setting.

    A drop-in for the one-liner RL frameworks copy (verl's
    ``set_expandable_segments(enable)``, which writes
    ``expandable_segments:{enable}`` through torch's setter and so resets
    the user's ``max_split_size_mb`` and friends): this is
    ``configure(expandable_segments=enable)``, under allocconf's lock, with
    the full configuration written.  Open windows keep holding what they
    hold until they close.
    """
    if not isinstance(enable, bool):
        raise TypeError(
            f"allocconf.set_expandable_segments() takes True or False, not "
            f"{enable!r}")
    configure(expandable_segments=enable)


def child_env(config: str = "same", *,
              environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment for a child process, built explicitly: allocconf
    never changes ``os.environ``, and a child inherits nothing of what it
    wrote at run time.

    ``config`` is what the child's allocator gets:

    - ``"same"``: the configuration torch holds here outside windows
      (allocconf's default, the user's keys and other components' writes
      included);
    - ``"user"``: the user's own configuration, without allocconf's
      default (for an inference-engine worker);
    - ``"off"``: the variables as they are, allocconf's import-time action
      switched off.

    Each sets ``ALLOCCONF_AUTO=0``, so that an ``import allocconf`` in the
    child changes nothing of it, and writes ``PYTORCH_CUDA_ALLOC_CONF``
    (and each other variable torch reads that is set, so that none
    disagrees).  Returns a copy of ``environ`` (``os.environ`` when not
    given) with those changes: pass it to ``subprocess`` as ``env=``, or,
    built on ``environ={}``, as a Ray ``runtime_env``'s ``env_vars``.
    """
    return _neighbours.child_env(config, environ=environ)


def ipc_capable(tensor: Any) -> bool:
    """Whether ``tensor``'s memory can be shared by classic CUDA IPC.

    Asked of the CUDA driver for the tensor's storage, through
    ``cuPointerGetAttribute`` with
    ``CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE``: False for memory in
    an expandable segment.  Raises ValueError for a tensor that is not on a
    CUDA device or has no memory, RuntimeError when the driver cannot tell.
    """
    device = getattr(tensor, "device", None)
    if device is None:
        raise ValueError(
            f"allocconf.ipc_capable: expected a CUDA tensor, got "
            f"{type(tensor).__name__} (no device)"
        )
    if getattr(device, "type", None) != "cuda":
        raise ValueError(
            f"allocconf.ipc_capable: expected a CUDA tensor, got one on "
            f"{device}"
        )
    ptr = tensor.untyped_storage().data_ptr()
    if ptr == 0:
        raise ValueError("allocconf.ipc_capable: the tensor has no memory")
    capable: bool = _C._pointer_ipc_capable(ptr)
    return capable


def check_ipc(tensors: Union[Mapping[str, Any], Any]) -> None:
    """Raise ValueError listing every tensor that classic CUDA IPC cannot
    share; return None when all can.

    ``tensors`` is a mapping of names to tensors (a state dict) or an
    iterable of tensors, reported by position.
    """
    if hasattr(tensors, "items"):
        named = [(repr(str(k)), t) for k, t in tensors.items()]
    else:
        named = [(f"#{i}", t) for i, t in enumerate(tensors)]
    bad: List[str] = []
    expandable = 0
    for name, t in named:
        if not all(hasattr(t, a) for a in ("dtype", "shape", "device")):
            bad.append(f"{name} ({type(t).__name__}: not a tensor)")
            continue
        try:
            if ipc_capable(t):
                continue
            why = "in an expandable segment"
            expandable += 1
        except ValueError as exc:
            why = str(exc).replace("allocconf.ipc_capable: ", "")
        bad.append(
            f"{name} ({str(t.dtype).replace('torch.', '')}"
            f"{list(t.shape)} on {t.device}: {why})"
        )
    if bad:
        hint = (
            " Those in expandable segments were most likely allocated "
            "before the allocconf.ipc_safe() window: allocate or copy them "
            "inside it." if expandable else ""
        )
        raise ValueError(
            f"allocconf.check_ipc: {len(bad)} of {len(named)} items cannot "
            f"be shared by classic CUDA IPC: {', '.join(bad)}.{hint}"
        )


def __getattr__(name: str) -> Any:
    # Status lives in its own module, loaded on first use: dataclasses
    # would add milliseconds to every `import allocconf`.
    if name == "Status":
        from allocconf._status import Status

        return Status
    raise AttributeError(f"module 'allocconf' has no attribute {name!r}")


# ---------------------------------------------------------------------------
# Import-time activation
# ---------------------------------------------------------------------------


def _log(level: int, msg: str, *args: Any) -> bool:
    """Log to the "allocconf" logger at `level` (logging's numbers),
    importing logging only when torch (which imports it anyway) or the
    user already has.  Returns whether it logged.  Where nothing is set
    up, logging's last-resort handler prints WARNING records as they are,
    so each message says itself that it is allocconf's."""
    if "logging" not in sys.modules:
        return False
    import logging

    logging.getLogger("allocconf").log(level, msg, *args)
    return True


def _stacklevel() -> int:
    """The stacklevel that makes warnings.warn, called by our caller,
    point at the first frame outside allocconf (the user's `import`
    line), counting frames as warnings.warn does: importlib's own
    frames are skipped."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    frame: Any = sys._getframe(1)  # the frame that calls warnings.warn
    level = 1
    while frame is not None and \
            os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame = frame.f_back
        while frame is not None and "importlib" in frame.f_code.co_filename \
                and "_bootstrap" in frame.f_code.co_filename:
            frame = frame.f_back
        level += 1
    return level


def _warn(messages: List[str]) -> None:
    """Give import-time warnings; never raise (see _give)."""
    _give(messages)


def _attach(torch: ModuleType) -> List[str]:
    """Attach to torch; return the warnings to give (never raises: this
    runs inside the user's `import torch`)."""
    try:
        _C._trace("attaching to torch")
        messages: List[str] = _C._attach(torch)
        _pools.attach(torch, _C.status()["user_config"] or "")
        if _C._internals()["keep_foreign"]:
            wrapped = _neighbours.wrap_setters(torch)
            _C._trace(f"keeping other components' writes through "
                      f"{', '.join(wrapped) or 'no setter'}")
        _neighbours.export()
        st = _C.status()
        _log(20, "%s; config %r via %s", st["reason"], st["config"],
             st["api"])  # INFO
        for advice in st["advice"]:
            # An opt-out torch does not see was given as an
            # AllocConfWarning already: once per problem.
            if "honoured as an opt-out" not in advice:
                _log(30, "allocconf: %s", advice)  # WARNING
    except Exception as exc:
        return [f"allocconf: could not attach to torch: {exc!r}; the "
                f"allocator was left as it was"]
    return messages


def _on_torch(torch: ModuleType) -> None:
    """The hook's callback, run when `import torch` finishes (in the
    importing thread, or in the hook's waiting thread).  Nothing may
    raise out of here into the user's `import torch` (torch could never
    be imported again in this process): a warning that the filters turn
    into an exception goes to the "allocconf" logger and is kept in
    status().warnings instead."""
    _give(_attach(torch))


def _on_neighbour(module: ModuleType) -> None:
    """The hook's callback for a neighbour's import; raises nothing into
    it, as _on_torch."""
    name = module.__name__
    try:
        messages = _neighbours.arrived(name, _neighbours.NEIGHBOURS[name])
    except Exception as exc:
        messages = [f"allocconf: could not step back for {name}: {exc!r}"]
    _give(messages)


def _give(messages: List[str]) -> None:
    """Give warnings from inside an import (allocconf's own, torch's or a
    neighbour's), pointing at the user's import line: one the filters
    turn into an exception (``-W error``) is kept in status().warnings and
    goes to the "allocconf" logger (stderr where logging is not
    imported), so that it is said once and the import completes."""
    for message in messages:
        try:
            warnings.warn(message, AllocConfWarning,
                          stacklevel=_stacklevel())
        except Exception:
            _KEPT.append(message)
            if not _log(30, "%s", message):  # WARNING
                sys.stderr.write(message + "\n")


def _activate() -> List[str]:
    """Read the environment, then attach now or when torch is imported.
    Returns the warnings to give."""
    from allocconf import _hook

    torch = sys.modules.get("torch")
    # torch still being imported (by another thread, or by the import
    # chain that imports allocconf): attach once that import completes.
    pending = torch is not None and _hook.initializing(torch)
    # Read the environment as this torch reads it, where it is imported.
    messages: List[str] = _C._load_environ(None if pending else torch)
    inner = _C._internals()
    if not inner["at_fork"]:
        messages.append(
            "allocconf: this Python has no os.register_at_fork, so a child "
            "made by fork() inherits allocconf's lock and open windows as "
            "they were: one forked while another thread held the lock "
            "hangs at its first allocconf call, one forked inside a window "
            "keeps it open. Use the spawn start method, or fork only with "
            "no window open.")
    if inner["auto"]:
        messages += _neighbours.present()
        watch = _neighbours.missing()
        if watch:
            _hook.watch(watch, _on_neighbour)
    if torch is not None and not pending:
        return messages + _attach(torch)
    finder = _hook.install(_on_torch)
    if pending:
        finder.wait("torch")
        _C._trace("torch is being imported: attaching when that completes")
    else:
        _C._trace("waiting for `import torch` (sys.meta_path hook "
                  "installed)")
    return messages


# Warnings that could not be given as warnings (see _on_torch).  Kept
# across importlib.reload, like the activation itself: the state lives in
# _C, which a reload does not re-run, so a reload changes nothing.
_KEPT: List[str] = globals().get("_KEPT", [])
if not globals().get("_ACTIVATED"):
    _ACTIVATED = True
    try:
        _messages = _activate()
    except Exception as _exc:  # import-time problems warn, never raise
        _messages = [f"allocconf: import-time activation failed: {_exc!r}"]
    _warn(_messages)
    del _messages
