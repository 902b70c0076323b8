"""allocconf.Status: what allocconf did, and why (see allocconf.status)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class Status:
    """A snapshot of allocconf's state, from :func:`allocconf.status`.

    Attributes:
        applied: allocconf has written to torch's allocator in this process.
        reason: why expandable segments are (or are not) on, in words.
        expandable_segments: the value in force, or that will be once torch
            is imported; None where allocconf does not manage it (a backend
            or platform without expandable segments, a malformed variable).
        config: the string torch holds, string for string: what allocconf
            last wrote, or read back from torch (``readback``); before
            torch is imported, what will be written, or the user's own
            string where allocconf writes nothing.
        source: where the user's configuration came from: the variable's
            name, "torch" (read live from torch), or None.
        api: the torch function used to write, once torch is imported.
        torch_imported: torch has been imported and seen by allocconf.
        window_depth: how many expandable_segments()/ipc_safe() windows are
            open, in all threads.
        user_config: the user's own configuration, before allocconf's
            default is merged in.
        neighbours: the components found in this process that cannot live
            with expandable segments (``torch_memory_saver``, ``vllm``,
            ``sglang``; see docs/neighbours.md).  ``reason`` says when the
            default stepped back for one, ``advice`` when they are on
            anyway.
        advice: warnings about the configuration in force (logged to the
            "allocconf" logger when torch is imported), e.g. a
            max_split_size_mb that fights expandable segments, or a
            variable set that this torch does not read (PYTORCH_ALLOC_CONF
            on torch 2.9 and older), whose settings apply nowhere.
        readback: whether this torch can report the string it holds (its
            getter, torch 2.13 and newer).  True: ``config`` and every
            window act on what torch holds, a write that went past
            allocconf included.  False: ``config`` is what allocconf last
            wrote or read at attach; a write made through a reference to
            torch's setter taken before allocconf attached is not seen.
            None before torch is imported.
        window_scope: the scope ``ipc_safe()`` windows take now:
            "opener" (what the opening thread allocates goes to
            allocconf's pools of classic memory; nothing process-wide
            changes) or "process" (expandable segments held off for the
            whole process while a window is open).  Even where it says
            "opener", a window opened while CUDA is not initialised yet
            holds process-wide (routing needs CUDA; the window does not
            start it).
        window_scope_reason: why, in words (the torch version, build or
            backend that rules the pools out).
        pool_bytes: the bytes of device memory allocconf's pools hold,
            on all devices: in use, or freed inside a window and kept by
            torch in the pool for the next window (torch.cuda.empty_cache()
            does not reach a pool in use; allocconf.release_pools()
            gives it back).  0 before a window first routed.
        warnings: allocconf's warnings that the warning filters would have
            raised inside the user's ``import torch`` (``-W error``); they
            went to the "allocconf" logger instead, so that the import
            completed.
    """

    applied: bool
    reason: str
    expandable_segments: Optional[bool]
    config: Optional[str]
    source: Optional[str]
    api: Optional[str]
    torch_imported: bool
    window_depth: int
    user_config: Optional[str]
    neighbours: Tuple[str, ...]
    advice: Tuple[str, ...]
    readback: Optional[bool]
    window_scope: str
    window_scope_reason: str
    pool_bytes: int
    warnings: Tuple[str, ...] = ()

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (for JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
