"""One copy: the trainer writes straight into the engine's weights
(docs/rl-weight-sync.md, "One copy: straight into the engine's weights";
docs/design.md, "One copy, into the engine's weights").  Imported and
re-exported by allocconf.transfer.

The engine exports its targets once (:class:`Targets`): per name the
trainer sends, the engine tensor it lands in, a whole parameter or the
rows of a fused one, each one contiguous byte range of an engine storage
in classic memory.  Each distinct storage is shared once by classic CUDA
IPC, and a small picklable :class:`TargetMap` goes to the trainer.

Each sync is a handshake, never a race: the engine *offers* its weights
(an :class:`Offer`: its interprocess CUDA event, recorded after its last
forward, and its map's identity); the trainer's :class:`Writer` makes its
current stream wait on that event, writes every target, records its own
event and answers :class:`Written`; the engine's stream waits on that
before its next forward.  Neither side waits on the host for the other's
device work.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import (Any, Dict, Iterable, List, Mapping, Optional,
                    Sequence, Set, Tuple, Union)

import torch

from allocconf.transfer import (Channel, SyncResult, TransferError, _casts,
                                _check, _Cuda, _dtype, _dtype_name, _Lanes,
                                _Sources)

__all__ = ["Target", "TargetMap", "Offer", "Written", "Targets", "Writer"]

_data_ptr = torch.Tensor.data_ptr

_NOT_CLASSIC = (
    "allocconf.transfer: the engine's target {name!r} lives in memory that "
    "classic CUDA IPC cannot share ({cause}): an expandable segment, or a "
    "cuMem/VMM pool (vLLM's sleep mode, torch_memory_saver). Allocate the "
    "engine's weights inside allocconf.ipc_safe() (allocconf steps back "
    "from expandable segments by itself in the engines it knows: "
    "docs/neighbours.md), or use the bucketed mode (Sender/Receiver), "
    "which works with any engine memory")


@dataclass(frozen=True)
class Target:
    """Where one name lands in the engine: `nbytes` bytes at `offset` in
    the map's storage number `storage` (-1: an empty tensor)."""

    name: str
    storage: int
    offset: int
    dtype: str               # torch dtype name, e.g. "bfloat16"
    shape: Tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class TargetMap:
    """What the trainer needs to write into an engine: its GPU (by UUID),
    one IPC handle per storage (reduce_tensor's) and the targets.  A new
    map (new ``id``) each time the engine exports."""

    id: str
    device: str
    storages: Tuple[Any, ...]
    targets: Tuple[Target, ...]


@dataclass(frozen=True)
class Offer:
    """The engine's consent to one sync: its weights are not read after
    `event` until it accepts the Written that answers.  ``kind`` "close":
    the engine let go of map `map`."""

    map: str
    sync: int
    event: bytes
    kind: str = "offer"


@dataclass(frozen=True)
class Written:
    """The trainer's answer to an Offer: the engine's stream waits on
    `event` (recorded after the trainer's copies, or what of them ran).
    ``error`` set: the sync did not complete; the engine's weights may
    hold part of it."""

    map: str
    sync: int
    event: bytes
    tensors: int = 0
    error: Optional[str] = None

    @property
    def complete(self) -> bool:
        return self.error is None


class Targets:
    """The engine's side: `targets` maps each name the trainer sends to
    the engine tensor it lands in (a parameter, or a view of the rows of
    a fused one: ``qkv[0:q_rows]``), each contiguous and on `device` (the
    current CUDA device by default), in classic memory (checked, and
    refused with the way out otherwise).  Names that share one byte range
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
                 device: Optional[int] = None, _ops: Any = None) -> None:
        if not isinstance(targets, Mapping):
            raise TypeError(f"allocconf.transfer: Targets takes a mapping "
                            f"of names to tensors, got "
                            f"{type(targets).__name__}")
        self._ops = _ops if _ops is not None else _Cuda(device)
        index: Dict[int, int] = {}      # storage address -> its number
        whole: List[torch.Tensor] = []  # each storage, as uint8
        first: List[str] = []           # the first name in each storage
        entries: List[Target] = []
        # The tensors given, and the parameters they are views of, each
        # once, with their addresses: checked before every offer.
        watch: Dict[int, Tuple[str, torch.Tensor]] = {}
        for name, t in targets.items():
            _check(name, t, self._ops.torch_device, "the engine's targets")
            size = t.element_size()
            if not t.numel():
                entries.append(Target(name, -1, 0, _dtype_name(t.dtype),
                                      tuple(t.shape), 0))
                continue
            storage = t.untyped_storage()
            n = index.get(storage.data_ptr())
            if n is None:
                flat = torch.empty(0, dtype=torch.uint8,
                                   device=t.device).set_(storage)
                if not self._ops.capable(flat):
                    raise ValueError(_NOT_CLASSIC.format(
                        name=name, cause="the CUDA driver says it is not "
                        "legacy-IPC capable"))
                n = index[storage.data_ptr()] = len(whole)
                whole.append(flat)
                first.append(name)
            entries.append(Target(name, n, int(t.storage_offset()) * size,
                                  _dtype_name(t.dtype), tuple(t.shape),
                                  t.numel() * size))
            for watched in (t, t._base):
                if watched is not None:
                    watch.setdefault(id(watched), (name, watched))
        _refuse_overlaps(entries)
        handles = []
        for name, flat in zip(first, whole):
            try:
                handles.append(self._ops.share(flat))
            except Exception as exc:  # e.g. cuMem memory torch cannot share
                raise ValueError(_NOT_CLASSIC.format(
                    name=name, cause=f"{type(exc).__name__}: {exc}")
                ) from exc
        self._storages = whole
        self._names = [name for name, _ in watch.values()]
        self._watched = [t for _, t in watch.values()]
        self._ptrs = list(map(_data_ptr, self._watched))
        self._event: Any
        self._handle: bytes
        self._event, self._handle = self._ops.event()
        #: The map to send the trainer (Targets.serve sends it first).
        self.map = TargetMap(uuid.uuid4().hex, self._ops.uuid,
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
        ptrs = list(map(_data_ptr, self._watched))  # one call a tensor
        if ptrs != self._ptrs:
            moved = [n for n, a, b in zip(self._names, ptrs, self._ptrs)
                     if a != b]
            raise TransferError(
                f"allocconf.transfer: the memory behind target(s) "
                f"{', '.join(map(repr, moved[:3]))}"
                f"{', ...' if len(moved) > 3 else ''} was replaced since "
                f"this map was made (the engine reallocated its weights); "
                f"make new Targets of them, close this one, and send the "
                f"new map")

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("allocconf.transfer: these Targets are "
                               "closed")

    def offer(self) -> Offer:
        """Consent to one sync: records the engine's event on the current
        stream, after the work queued so far (its last forward).  Queue no
        work that reads the weights until :meth:`accept` took the
        answer."""
        self._open()
        if self._offered is not None:
            raise RuntimeError(
                f"allocconf.transfer: sync {self._offered} was offered and "
                f"not answered; accept() its Written (serve() waits for it) "
                f"before offering again")
        self.check()
        self._syncs += 1
        self._ops.record(self._event)
        self._offered = self.sync = self._syncs
        return Offer(self.map.id, self._syncs, self._handle)

    def accept(self, written: Written) -> bool:
        """Take the trainer's answer: the current stream waits for its
        writes (complete or not) before the work queued after.  Returns
        whether the sync is complete."""
        self._open()
        if not isinstance(written, Written) or written.map != self.map.id:
            raise ValueError(f"allocconf.transfer: {written!r} is not a "
                             f"Written for this map ({self.map.id})")
        if written.sync != self._offered:
            raise ValueError(
                f"allocconf.transfer: Written for sync {written.sync}; "
                + (f"sync {self._offered} is the one offered"
                   if self._offered is not None else "none is offered"))
        self._ops.wait(written.event)
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
            raise TransferError(f"allocconf.transfer: expected the "
                                f"trainer's Written for sync {self._offered} "
                                f"of map {self.map.id}, got {msg!r}")
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
                channel.put(Offer(self.map.id, -1, b"", "close"))
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
            raise ValueError(
                f"allocconf.transfer: the targets {n0!r} (bytes {a0}-{b0}) "
                f"and {n1!r} (bytes {a1}-{b1}) of one storage overlap; "
                f"targets must be disjoint, or the same bytes (tied)")


_Span = Tuple[int, int, int]  # (storage, offset, nbytes)


class _Matcher:
    """One sync's pairing of given tensors with the engine's targets,
    every pair checked (dtype after the cast, shape) before it is
    written; a name the engine does not hold is allowed only as another
    name of memory that is written (a tied weight the engine keeps once),
    and every target must be written."""

    def __init__(self, views: Mapping[str, Tuple[torch.Tensor, _Span]],
                 casts: Dict[torch.dtype, torch.dtype],
                 device: torch.device) -> None:
        self.views = views
        self.casts = casts
        self.device = device
        self.spans: Dict[_Span, Tuple[str, Tuple[int, torch.dtype]]] = {}
        self.covered: Set[str] = set()
        self.others: List[Tuple[str, Tuple[int, Any, Tuple[int, ...]]]] = []
        self.memory: Set[Tuple[int, Any, Tuple[int, ...]]] = set()
        self.count = 0

    def match(self, name: Any, t: Any
              ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The (target, source) to copy for this item, or None (nothing
        to copy: empty, or already written under a tied name)."""
        _check(name, t, self.device, "the engine's targets")
        mem = (t.data_ptr(), t.dtype, tuple(t.shape))
        got = self.views.get(name)
        if got is None:
            self.others.append((name, mem))
            return None
        dst, span = got
        want = self.casts.get(t.dtype, t.dtype)
        if dst.dtype != want or dst.shape != t.shape:
            cast = f" (sent as {_dtype_name(want)})" if want != t.dtype else ""
            raise ValueError(
                f"allocconf.transfer: {name!r} is {_dtype_name(t.dtype)}"
                f"{list(t.shape)}{cast}; the engine's target is "
                f"{_dtype_name(dst.dtype)}{list(dst.shape)}")
        self.covered.add(name)
        self.count += 1
        if not span[2]:
            return None
        self.memory.add(mem)
        prev = self.spans.get(span)
        if prev is not None:
            if prev[1] == (t.data_ptr(), t.dtype):
                return None  # tied here and in the engine: written once
            raise ValueError(
                f"allocconf.transfer: {name!r} and {prev[0]!r} land in the "
                f"same engine memory (tied there) but are different tensors "
                f"here")
        self.spans[span] = (name, (t.data_ptr(), t.dtype))
        return dst, t

    def finish(self) -> None:
        """Raise for names the engine does not hold and for targets not
        written."""
        unknown = [n for n, mem in self.others if mem not in self.memory]
        if unknown:
            raise KeyError(
                f"allocconf.transfer: {', '.join(map(repr, unknown[:3]))}"
                f"{', ...' if len(unknown) > 3 else ''} "
                f"{'is' if len(unknown) == 1 else 'are'} not among the "
                f"engine's {len(self.views)} targets")
        missing = [n for n, (_, span) in self.views.items()
                   if n not in self.covered and span not in self.spans]
        if missing:
            raise ValueError(
                f"allocconf.transfer: {len(missing)} of the engine's targets "
                f"were not given ({', '.join(map(repr, missing[:3]))}"
                f"{', ...' if len(missing) > 3 else ''}); a sync writes "
                f"every target")


class _Copies(_Lanes):
    """The copies of one sync layout, made once and replayed while the
    sources stay as they were (docs/design.md, "One copy, into the
    engine's weights"): :class:`_Lanes` of (target, source) pairs, with
    the sources they were made of and the tensors the sync counts."""

    def __init__(self, sources: _Sources,
                 pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                 count: int, ops: Any, graph: bool, small: int,
                 branches: int) -> None:
        super().__init__(pairs, ops, graph, small, branches)
        self.sources = sources
        self.count = count


class Writer:
    """The trainer's side: opens an engine's TargetMap (each storage once,
    on this process's device for the engine's GPU, matched by UUID) and
    writes each sync straight into the targets, after the engine's offer,
    on the current stream.  `timeout` (seconds) bounds each wait for
    the engine in :meth:`sync`.  With `graph` (the default) the copies of
    a state dict are captured once in a CUDA graph and replayed while its
    tensors stay where they were; ``graph=False`` runs them eagerly.  One
    thread at a time."""

    SMALL = _Lanes.SMALL        # bytes: smaller copies are batched
    BRANCHES = _Lanes.BRANCHES  # parallel lanes of the captured copies

    def __init__(self, *, device: Optional[int] = None,
                 timeout: float = 60.0, graph: bool = True,
                 _ops: Any = None) -> None:
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                or not timeout > 0):
            raise ValueError(f"allocconf.transfer: timeout must be a "
                             f"number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.graph = bool(graph)
        self._ops = _ops if _ops is not None else _Cuda(device)
        self._event: Any
        self._handle: bytes
        self._event, self._handle = self._ops.event()
        #: The engine's map written into (None before open()).
        self.map: Optional[TargetMap] = None
        self._storages: List[torch.Tensor] = []
        self._views: Dict[str, Tuple[torch.Tensor, _Span]] = {}
        self._copies: Optional[_Copies] = None
        self._closed = False
        #: Syncs written whole.
        self.syncs = 0

    @property
    def graphed(self) -> bool:
        """Whether the last state dict's copies replay from a CUDA graph."""
        return self._copies is not None and self._copies.graphed

    def open(self, tmap: TargetMap) -> None:
        """Map the engine's storages (letting go of the last map's)."""
        if self._closed:
            raise RuntimeError("allocconf.transfer: this Writer is closed")
        if not isinstance(tmap, TargetMap):
            raise TypeError(f"allocconf.transfer: open() takes the "
                            f"engine's TargetMap, got {type(tmap).__name__}")
        if self.map is not None and tmap.id == self.map.id:
            return  # announced again (a new channel): already open
        device = self._ops.local(tmap.device)
        storages = [self._ops.open(h, device) for h in tmap.storages]
        views: Dict[str, Tuple[torch.Tensor, _Span]] = {}
        for i, tg in enumerate(tmap.targets):
            if tg.storage < 0:
                empty = torch.empty(tg.shape, dtype=_dtype(tg.dtype),
                                    device=self._ops.torch_device)
                views[tg.name] = (empty, (-1, i, 0))
                continue
            raw = storages[tg.storage][tg.offset:tg.offset + tg.nbytes]
            views[tg.name] = (raw.view(_dtype(tg.dtype)).view(tg.shape),
                              (tg.storage, tg.offset, tg.nbytes))
        self.release()
        self.map, self._storages, self._views = tmap, storages, views

    def release(self) -> None:
        """Let go of the engine's storages (the map, its views, the
        copies made for it)."""
        self.map = None
        self._storages, self._views, self._copies = [], {}, None

    def refuse(self, offer: Offer, error: str) -> Written:
        """The answer to `offer` when nothing (more) will be written: the
        engine takes it as an incomplete sync."""
        return Written(offer.map, offer.sync, self._handle, 0, error)

    def write(self, tensors: Union[Mapping[str, Any],
                                   Iterable[Tuple[str, Any]]],
              offer: Offer, *,
              cast: Optional[Mapping[torch.dtype, torch.dtype]] = None
              ) -> Written:
        """Write `tensors` (a state dict, or (name, tensor) pairs) into
        the engine's targets, after `offer`'s event, and return the
        Written to send back.  Every name must be a target (or another
        name of a target's tensor: a tied weight), every target must be
        given, dtypes (after `cast`, e.g. ``{torch.float32:
        torch.bfloat16}``, converted as ``Tensor.to`` does) and shapes
        must match.  A state dict is checked whole before anything is
        written; pairs (a generator of gathered shards) are copied as they
        come, on the current stream (so their owner may free or refill
        them after), and one that fails part-way leaves the engine's
        weights partly written: the error raised here, and given to the
        engine by :meth:`sync` or :meth:`refuse`, says the sync is
        incomplete.  The copies are queued on the current stream, after
        the engine's offer: the work queued after (an optimizer step)
        runs after them."""
        if self._closed:
            raise RuntimeError("allocconf.transfer: this Writer is closed")
        if not isinstance(offer, Offer) or offer.kind != "offer":
            raise ValueError(f"allocconf.transfer: write() needs the "
                             f"engine's Offer, got {offer!r}")
        if self.map is None or offer.map != self.map.id:
            raise TransferError(
                f"allocconf.transfer: the engine offered map {offer.map}, "
                + (f"this Writer holds map {self.map.id}: stale, not "
                   f"written through (open the engine's new map)"
                   if self.map is not None else
                   "and this Writer holds none (open() the engine's map; "
                   "Targets.serve sends it first)"))
        casts = _casts(cast)
        # On the current stream: after the sources' producers, before the
        # work queued after (an optimizer step), and a source freed by its
        # owner is reused only after its copy, in stream order.  (A copy
        # stream of its own would gain nothing, since that work must wait
        # for the copies anyway, and costs ~0.1 ms of host time a sync.)
        self._ops.wait(offer.event)
        try:
            if isinstance(tensors, Mapping):
                count = self._write_all(tensors, casts)
            else:
                count = self._write_each(tensors, casts)
        finally:
            self._ops.record(self._event)  # after whatever was queued
        self.syncs += 1
        return Written(offer.map, offer.sync, self._handle, count)

    def _write_all(self, tensors: Mapping[str, Any],
                   casts: Dict[torch.dtype, torch.dtype]) -> int:
        c = self._copies
        if c is not None and c.sources.fits(tensors, casts):
            # Replayed before the check, so that the check runs while the
            # device copies: the copies hold their sources, so where the
            # tensors are others, or one moved (.data =), they read
            # valid, stale memory, written again below before the
            # engine's event is recorded.
            c.run()
            if c.sources.still(tensors):
                return c.count
        self._copies = None
        m = _Matcher(self._views, casts, self._ops.torch_device)
        pairs = []
        sources = _Sources(casts)
        for name, t in tensors.items():
            pair = m.match(name, t)
            sources.add(name, t)
            if pair is not None:
                pairs.append(pair)
        m.finish()
        c = _Copies(sources, pairs, m.count, self._ops, self.graph,
                    self.SMALL, self.BRANCHES)
        c.run()
        self._copies = c
        return c.count

    def _write_each(self, items: Iterable[Tuple[str, Any]],
                    casts: Dict[torch.dtype, torch.dtype]) -> int:
        m = _Matcher(self._views, casts, self._ops.torch_device)
        with torch.no_grad():
            for item in items:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise TypeError(f"allocconf.transfer: expected (name, "
                                    f"tensor) pairs, got {item!r}"[:200])
                pair = m.match(*item)
                if pair is not None:
                    dst, src = pair
                    dst.copy_(src)
        m.finish()
        return m.count

    def sync(self, channel: Channel,
             tensors: Union[Mapping[str, Any], Iterable[Tuple[str, Any]]],
             *, cast: Optional[Mapping[torch.dtype, torch.dtype]] = None,
             timeout: Optional[float] = None) -> Written:
        """One sync over `channel`: the engine's map taken when one comes
        (a new one replaces the last), its close honoured, its offer
        waited for (at most `timeout` seconds, the Writer's by default:
        TransferError), the tensors written and the Written sent.  A write
        that fails is answered to the engine as incomplete, then
        raised."""
        wait = self.timeout if timeout is None else timeout
        while True:
            msg = channel.get(wait)
            if isinstance(msg, TargetMap):
                self.open(msg)
            elif isinstance(msg, Offer) and msg.kind == "close":
                if self.map is not None and msg.map == self.map.id:
                    self.release()
            elif isinstance(msg, Offer):
                break
            else:
                raise TransferError(f"allocconf.transfer: expected the "
                                    f"engine's TargetMap or Offer, got "
                                    f"{type(msg).__name__}")
        try:
            written = self.write(tensors, msg, cast=cast)
        except Exception as exc:
            channel.put(self.refuse(msg, f"{type(exc).__name__}: {exc}"))
            raise
        channel.put(written)
        return written

    def close(self) -> None:
        """Let go of the engine's storages; the Writer cannot be used
        again."""
        self.release()
        self._closed = True
