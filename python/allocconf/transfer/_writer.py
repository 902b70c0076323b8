"""The trainer's side of the one-copy mode: :class:`Writer` opens an
engine's TargetMap and writes each sync straight into the engine's
weights, after the engine's offer (the handshake: ``_targets``)."""
from __future__ import annotations

from typing import (Any, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Set, Tuple, Union)

import torch

from allocconf.transfer._channel import Channel, check_sync
from allocconf.transfer._copies import Capture, Lanes
from allocconf.transfer._device import Device, device_of
from allocconf.transfer._errors import TransferError, error, seconds
from allocconf.transfer._messages import (MapClosed, Offer, TargetMap,
                                          Written)
from allocconf.transfer._replay import Sources
from allocconf.transfer._tensors import casts as checked_casts
from allocconf.transfer._tensors import check, dtype, dtype_name

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
        check(name, t, self.device, "the engine's targets")
        mem = (t.data_ptr(), t.dtype, tuple(t.shape))
        got = self.views.get(name)
        if got is None:
            self.others.append((name, mem))
            return None
        dst, span = got
        want = self.casts.get(t.dtype, t.dtype)
        if dst.dtype != want or dst.shape != t.shape:
            cast = f" (sent as {dtype_name(want)})" if want != t.dtype else ""
            raise error(ValueError,
                        f"{name!r} is {dtype_name(t.dtype)}{list(t.shape)}"
                        f"{cast}; the engine's target is "
                        f"{dtype_name(dst.dtype)}{list(dst.shape)}")
        self.covered.add(name)
        self.count += 1
        if not span[2]:
            return None
        self.memory.add(mem)
        prev = self.spans.get(span)
        if prev is not None:
            if prev[1] == (t.data_ptr(), t.dtype):
                return None  # tied here and in the engine: written once
            raise error(ValueError,
                        f"{name!r} and {prev[0]!r} land in the same engine "
                        f"memory (tied there) but are different tensors "
                        f"here")
        self.spans[span] = (name, (t.data_ptr(), t.dtype))
        return dst, t

    def finish(self) -> None:
        """Raise for names the engine does not hold and for targets not
        written."""
        unknown = [n for n, mem in self.others if mem not in self.memory]
        if unknown:
            raise error(KeyError,
                        f"{', '.join(map(repr, unknown[:3]))}"
                        f"{', ...' if len(unknown) > 3 else ''} "
                        f"{'is' if len(unknown) == 1 else 'are'} not among "
                        f"the engine's {len(self.views)} targets")
        missing = [n for n, (_, span) in self.views.items()
                   if n not in self.covered and span not in self.spans]
        if missing:
            raise error(ValueError,
                        f"{len(missing)} of the engine's targets were not "
                        f"given ({', '.join(map(repr, missing[:3]))}"
                        f"{', ...' if len(missing) > 3 else ''}); a sync "
                        f"writes every target")


class _Copies(Lanes):
    """The copies of one sync layout, made once and replayed while the
    sources stay as they were (docs/design.md, "One copy, into the
    engine's weights"): :class:`Lanes` of (target, source) pairs, with
    the sources they were made of and the tensors the sync counts."""

    def __init__(self, sources: Sources,
                 pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                 count: int, capture: Optional[Capture], small: int,
                 branches: int) -> None:
        super().__init__(pairs, capture, small, branches)
        self.sources = sources
        self.count = count


class Writer:
    """The trainer's side: opens an engine's TargetMap (each storage once,
    on this process's device for the engine's GPU, matched by UUID) and
    writes each sync straight into the targets, after the engine's offer,
    on the current stream (`device`: as the Sender's).  `timeout`
    (seconds) bounds each wait for
    the engine in :meth:`sync`.  With `graph` (the default) the copies of
    a state dict are captured once in a CUDA graph and replayed while its
    tensors stay where they were; ``graph=False`` runs them eagerly.  One
    thread at a time."""

    SMALL = Lanes.SMALL        # bytes: smaller copies are batched
    BRANCHES = Lanes.BRANCHES  # parallel lanes of the captured copies

    def __init__(self, *, device: Union[int, Device, None] = None,
                 timeout: float = 60.0, graph: bool = True) -> None:
        self.timeout = seconds("timeout", timeout)
        self.graph = bool(graph)
        self._device = device_of(device)
        self._event: Any
        self._handle: bytes
        self._event, self._handle = self._device.event()
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
            raise error(RuntimeError, "this Writer is closed")
        if not isinstance(tmap, TargetMap):
            raise error(TypeError, f"open() takes the engine's TargetMap, "
                                   f"got {type(tmap).__name__}")
        if self.map is not None and tmap.id == self.map.id:
            return  # announced again (a new channel): already open
        device = self._device.local(tmap.device)
        storages = [self._device.open(h, device) for h in tmap.storages]
        views: Dict[str, Tuple[torch.Tensor, _Span]] = {}
        for i, tg in enumerate(tmap.targets):
            if tg.storage < 0:
                empty = torch.empty(tg.shape, dtype=dtype(tg.dtype),
                                    device=self._device.torch_device)
                views[tg.name] = (empty, (-1, i, 0))
                continue
            raw = storages[tg.storage][tg.offset:tg.offset + tg.nbytes]
            views[tg.name] = (raw.view(dtype(tg.dtype)).view(tg.shape),
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
            raise error(RuntimeError, "this Writer is closed")
        if not isinstance(offer, Offer):
            raise error(ValueError, f"write() needs the engine's Offer, "
                                    f"got {offer!r}")
        if self.map is None or offer.map != self.map.id:
            raise error(TransferError,
                        f"the engine offered map {offer.map}, "
                        + (f"this Writer holds map {self.map.id}: stale, "
                           f"not written through (open the engine's new "
                           f"map)" if self.map is not None else
                           "and this Writer holds none (open() the "
                           "engine's map; Targets.serve sends it first)"))
        casts = checked_casts(cast)
        # On the current stream: after the sources' producers, before the
        # work queued after (an optimizer step), and a source freed by its
        # owner is reused only after its copy, in stream order.  (A copy
        # stream of its own would gain nothing, since that work must wait
        # for the copies anyway, and costs ~0.1 ms of host time a sync.)
        self._device.wait(offer.event)
        try:
            if isinstance(tensors, Mapping):
                count = self._write_all(tensors, casts)
            else:
                count = self._write_each(tensors, casts)
        finally:
            self._device.record(self._event)  # after whatever was queued
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
        m = _Matcher(self._views, casts, self._device.torch_device)
        pairs = []
        sources = Sources(casts)
        for name, t in tensors.items():
            pair = m.match(name, t)
            sources.add(name, t)
            if pair is not None:
                pairs.append(pair)
        m.finish()
        c = _Copies(sources, pairs, m.count,
                    self._device.graph if self.graph else None,
                    self.SMALL, self.BRANCHES)
        c.run()
        self._copies = c
        return c.count

    def _write_each(self, items: Iterable[Tuple[str, Any]],
                    casts: Dict[torch.dtype, torch.dtype]) -> int:
        m = _Matcher(self._views, casts, self._device.torch_device)
        with torch.no_grad():
            for item in items:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise error(TypeError, f"expected (name, tensor) pairs, "
                                           f"got {item!r}"[:180])
                pair = m.match(*item)
                if pair is not None:
                    dst, src = pair
                    dst.copy_(src)
        m.finish()
        return m.count

    def sync(self, tensors: Union[Mapping[str, Any],
                                  Iterable[Tuple[str, Any]]],
             channel: Channel, *,
             cast: Optional[Mapping[torch.dtype, torch.dtype]] = None,
             timeout: Optional[float] = None) -> Written:
        """Write one sync over `channel` (the arguments in
        :meth:`Sender.sync`'s order): the engine's map taken when one
        comes (a new one replaces the last), its close honoured, its
        offer waited for (at most `timeout` seconds, the Writer's by
        default: TransferError), the tensors written and the Written
        sent.  A write that fails is answered to the engine as
        incomplete, then raised.  Arguments of the wrong type raise
        TypeError at once, naming the argument."""
        check_sync(tensors, channel)
        wait = self.timeout if timeout is None else timeout
        while True:
            msg = channel.get(wait)
            if isinstance(msg, TargetMap):
                self.open(msg)
            elif isinstance(msg, MapClosed):
                if self.map is not None and msg.map == self.map.id:
                    self.release()
            elif isinstance(msg, Offer):
                break
            else:
                raise error(TransferError, f"expected the engine's "
                                           f"TargetMap or Offer, got "
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
