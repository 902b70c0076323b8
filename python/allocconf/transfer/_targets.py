"""The engine's side of the one-copy mode: :class:`Targets` exports the
engine's weights to the trainer's Writer, and offers them once per sync
(docs/rl-weight-sync.md, "One copy: straight into the engine's weights";
docs/design.md, "One copy, into the engine's weights").

The engine exports its targets once: per name the trainer sends, the
engine tensor it lands in, a whole parameter or the rows of a fused one,
each one contiguous byte range of an engine storage in classic memory.
Each distinct storage is shared once by classic CUDA IPC, and a small
picklable :class:`TargetMap` goes to the trainer.

Each sync is a handshake, never a race: the engine *offers* its weights
(an :class:`Offer`: its interprocess CUDA event, recorded after its last
forward, and its map's identity); the trainer's Writer makes its
current stream wait on that event, writes every target, records its own
event and answers :class:`Written`; the engine's stream waits on that
before its next forward.  Neither side waits on the host for the other's
device work.
"""
from __future__ import annotations

import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from allocconf.transfer._channel import Channel
from allocconf.transfer._device import Device, device_of
from allocconf.transfer._errors import TransferError, error
from allocconf.transfer._errors import check as checked
from allocconf.transfer._messages import (MapClosed, Offer, SyncResult,
                                          Target, TargetMap, Written)
from allocconf.transfer._tensors import check, dtype_name

data_ptr = torch.Tensor.data_ptr

NOT_CLASSIC = (
    "the engine's target {name!r} lives in memory that classic CUDA IPC "
    "cannot share ({cause}): an expandable segment, or a cuMem/VMM pool "
    "(vLLM's sleep mode, torch_memory_saver). Allocate the engine's "
    "weights inside allocconf.ipc_safe() with their device current (its "
    "default scope routes that thread's allocations to classic memory "
    "and changes nothing else; allocconf also steps back from expandable "
    "segments by itself in the engines it knows: docs/neighbours.md), or "
    "use the bucketed mode (Sender/Receiver), which works with any engine "
    "memory")

# What to do about a target that is not contiguous.  Never a copy of it
# (t.contiguous()): the trainer would write the copy, which the engine
# never reads, and the sync would report complete.
NOT_ONE_RANGE = (
    "a one-copy target must be the engine's own memory, one byte range of "
    "it: the parameter itself, or a view of rows of a fused one (tell by "
    "t.is_contiguous() on the engine's own tensor or view, and "
    "t.untyped_storage().data_ptr() being the parameter's); a copy such as "
    "t.contiguous() is not the engine's memory. For a target that is not "
    "one byte range (a column shard, a transpose), use the bucketed mode "
    "(Sender/Receiver), whose load_weights places what it receives")


class Targets:
    """The engine's side: `targets` maps each name the trainer sends to
    the engine tensor it lands in (a parameter, or a view of the rows of
    a fused one: ``qkv[0:q_rows]``), each contiguous and on `device` (the
    current CUDA device by default; a testing HostDevice on the CPU), in
    classic memory (checked, and refused with the way out otherwise).  Names that share one byte range
    (tied weights) are written once; ranges that overlap otherwise are
    refused.

    The Targets hold the engine's storages and watch the tensors given
    (and the parameters they are views of): one given new memory
    (``param.data =``, ``set_``, a reload into new memory) makes
    :meth:`offer` raise instead of letting the trainer write through a
    stale map; export anew (a new Targets) and close this one.  A module
    attribute pointed at another tensor is not seen: make new Targets
    after a reload that builds new parameters.  One thread at a time."""

    def __init__(self, targets: Mapping[str, torch.Tensor], *,
                 device: Union[int, Device, None] = None) -> None:
        checked("targets", targets, "a mapping of names to tensors",
                isinstance(targets, Mapping), TypeError)
        self._device = device_of(device)
        index: Dict[int, int] = {}      # storage address -> its number
        whole: List[torch.Tensor] = []  # each storage, as uint8
        first: List[str] = []           # the first name in each storage
        entries: List[Target] = []
        # The tensors given, and the parameters they are views of, each
        # once, with their addresses: checked before every offer.
        watch: Dict[int, Tuple[str, torch.Tensor]] = {}
        for name, t in targets.items():
            check(name, t, self._device.torch_device, "the engine's targets",
                  NOT_ONE_RANGE)
            size = t.element_size()
            if not t.numel():
                entries.append(Target(name, -1, 0, dtype_name(t.dtype),
                                      tuple(t.shape), 0))
                continue
            storage = t.untyped_storage()
            n = index.get(storage.data_ptr())
            if n is None:
                flat = torch.empty(0, dtype=torch.uint8,
                                   device=t.device).set_(storage)
                if not self._device.capable(flat):
                    raise error(ValueError, NOT_CLASSIC.format(
                        name=name, cause="the CUDA driver says it is not "
                        "legacy-IPC capable"))
                n = index[storage.data_ptr()] = len(whole)
                whole.append(flat)
                first.append(name)
            entries.append(Target(name, n, int(t.storage_offset()) * size,
                                  dtype_name(t.dtype), tuple(t.shape),
                                  t.numel() * size))
            for watched in (t, t._base):
                if watched is not None:
                    watch.setdefault(id(watched), (name, watched))
        _refuse_overlaps(entries)
        handles = []
        for name, flat in zip(first, whole):
            try:
                handles.append(self._device.share(flat))
            except Exception as exc:  # e.g. cuMem memory torch cannot share
                raise error(ValueError, NOT_CLASSIC.format(
                    name=name, cause=f"{type(exc).__name__}: {exc}")
                ) from exc
        self._storages = whole
        self._names = [name for name, _ in watch.values()]
        self._watched = [t for _, t in watch.values()]
        self._ptrs = list(map(data_ptr, self._watched))
        self._event: Any
        self._handle: bytes
        self._event, self._handle = self._device.event()
        #: The map to send the trainer (Targets.serve sends it first).
        self.map = TargetMap(uuid.uuid4().hex, self._device.uuid,
                             tuple(handles), tuple(entries))
        self._syncs = 0
        self._offered: Optional[int] = None
        self._told: List[Any] = []  # channels the map went over
        self._closed = False
        #: The sync offered and not yet answered complete (None between
        #: syncs): while it is set, the weights may hold part of a write.
        self.sync: Optional[int] = None
        #: The last sync written whole.
        self.complete: Optional[int] = None

    def check(self) -> None:
        """Raise TransferError if a target's memory was replaced since
        the map was made (the map is stale)."""
        ptrs = list(map(data_ptr, self._watched))  # one call a tensor
        if ptrs != self._ptrs:
            moved = [n for n, a, b in zip(self._names, ptrs, self._ptrs)
                     if a != b]
            raise error(TransferError,
                        f"the memory behind target(s) "
                        f"{', '.join(map(repr, moved[:3]))}"
                        f"{', ...' if len(moved) > 3 else ''} was replaced "
                        f"since this map was made (the engine reallocated "
                        f"its weights); make new Targets of them, close "
                        f"this one, and send the new map")

    def _open(self) -> None:
        if self._closed:
            raise error(RuntimeError, "these Targets are closed")

    def offer(self) -> Offer:
        """Consent to one sync: records the engine's event on the current
        stream, after the work queued so far (its last forward).  Queue no
        work that reads the weights until :meth:`accept` took the
        answer."""
        self._open()
        if self._offered is not None:
            raise error(RuntimeError,
                        f"sync {self._offered} was offered and not "
                        f"answered; accept() its Written (serve() waits "
                        f"for it) before offering again")
        self.check()
        self._syncs += 1
        self._device.record(self._event)
        self._offered = self.sync = self._syncs
        return Offer(self.map.id, self._syncs, self._handle)

    def accept(self, written: Written) -> bool:
        """Take the trainer's answer: the current stream waits for its
        writes (complete or not) before the work queued after.  Returns
        whether the sync is complete."""
        self._open()
        if not isinstance(written, Written) or written.map != self.map.id:
            raise error(ValueError, f"{written!r} is not a Written for "
                                    f"this map ({self.map.id})")
        if written.sync != self._offered:
            raise error(ValueError,
                        f"Written for sync {written.sync}; "
                        + (f"sync {self._offered} is the one offered"
                           if self._offered is not None
                           else "none is offered"))
        self._device.wait(written.event)
        self._offered = None
        if written.error is None:
            self.complete, self.sync = written.sync, None
        return written.error is None

    def announce(self, channel: Channel) -> None:
        """Put the map on `channel` (serve() does, once per channel; again
        for a trainer that restarted)."""
        self._open()
        channel.put(self.map)
        if not any(c is channel for c in self._told):
            self._told.append(channel)

    def serve(self, channel: Channel, *,
              timeout: Optional[float] = 60.0) -> SyncResult:
        """One sync over `channel`: the map first (once per channel), an
        offer, and the trainer's Written accepted.  A trainer silent for
        `timeout` seconds raises TransferError and leaves the offer
        standing (``sync`` names it: the weights are in doubt); the next
        serve() waits for its answer instead of offering again.  Returns
        a SyncResult whose ``complete`` is False, with ``error``, when
        the trainer's write failed."""
        if not any(c is channel for c in self._told):
            self.announce(channel)
        if self._offered is None:
            channel.put(self.offer())
        while True:
            msg = channel.get(timeout)
            if isinstance(msg, Written) and msg.map == self.map.id:
                if msg.sync == self._offered:
                    break
                if msg.sync < (self._offered or 0):
                    continue  # a late answer to an offer already taken
            raise error(TransferError,
                        f"expected the trainer's Written for sync "
                        f"{self._offered} of map {self.map.id}, got "
                        f"{msg!r}")
        complete = self.accept(msg)
        return SyncResult(msg.sync, complete, 1, msg.tensors, msg.error)

    def close(self, channel: Optional[Channel] = None) -> None:
        """Let go of the storages (their memory is freed once the engine's
        own tensors and the trainer's mappings are gone); with a channel,
        tell the trainer, so that it lets go of its mappings."""
        if self._closed:
            return
        if channel is not None:
            try:
                channel.put(MapClosed(self.map.id))
            except Exception:
                pass  # a trainer that cannot hear
        self._closed = True
        self._storages = []
        self._watched = []
        self._ptrs = []
        self._told = []


def _refuse_overlaps(entries: Sequence[Target]) -> None:
    """Targets that share bytes must share all of them (tied weights)."""
    spans = sorted((e.storage, e.offset, e.offset + e.nbytes, e.name)
                   for e in entries if e.nbytes)
    for (s0, a0, b0, n0), (s1, a1, b1, n1) in zip(spans, spans[1:]):
        if s0 == s1 and a1 < b0 and (a0, b0) != (a1, b1):
            raise error(ValueError,
                        f"the targets {n0!r} (bytes {a0}-{b0}) and {n1!r} "
                        f"(bytes {a1}-{b1}) of one storage overlap; "
                        f"targets must be disjoint, or the same bytes "
                        f"(tied)")

