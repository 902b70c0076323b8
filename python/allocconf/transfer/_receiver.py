"""The engine's side of the bucketed mode: :class:`Receiver` opens the
sender's buffers once and takes each bucket: into the engine's tensors,
to its ``load_weights``, or as views."""
from __future__ import annotations

from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Set, Tuple, Union)

import torch

from allocconf.transfer._channel import Channel
from allocconf.transfer._copies import Lanes, Program
from allocconf.transfer._device import Device, device_of
from allocconf.transfer._errors import TransferError, error
from allocconf.transfer._messages import (Abort, Ack, Bucket, Close, Entry,
                                          Message, SyncResult)
from allocconf.transfer._tensors import bytes_of, dtype, dtype_name, piece


class _Bucket:
    """What a receiver keeps per (sender, plan, bucket, buffer): the
    bucket's entries, and the views or bound copies made for it."""

    def __init__(self, entries: Tuple[Entry, ...]) -> None:
        self.entries = entries
        self.views: Optional[List[Tuple[Entry, torch.Tensor]]] = None
        self.bound: Optional[Lanes] = None


class Receiver:
    """The engine's side: opens each sender buffer's handle once (cached),
    on its own device for the sender's GPU (matched by UUID, whatever
    CUDA_VISIBLE_DEVICES numbers it), and for each Bucket waits on its
    event on the current stream (`device`: as the Sender's).  It serves
    one sender at a time: the first message of a new one (a restarted
    trainer) makes it let go of the old one's buffers."""

    LIMIT = 1 << 12  # buckets kept (entries, views, copies) before a reset
    BRANCHES = Lanes.BRANCHES  # parallel lanes of its bound copies' graph

    def __init__(self, device: Union[int, Device, None] = None) -> None:
        self._device = device_of(device)
        self._buffers: Dict[Tuple[str, int], torch.Tensor] = {}
        self._events: Dict[Tuple[str, int], Tuple[Any, bytes]] = {}
        self._plans: Dict[Tuple[str, str], Dict[int, Tuple[Entry, ...]]] = {}
        self._buckets: Dict[Tuple[str, str, int, int], _Bucket] = {}
        self._whole: Dict[Tuple[str, str], torch.Tensor] = {}  # reassembly
        self._seen: Dict[str, Set[bytes]] = {}  # sender -> event handles
        self._bound: Optional[Mapping[str, torch.Tensor]] = None
        #: The sync being received (None between syncs).
        self.sync: Optional[int] = None
        #: The last sync received whole: an engine that sees sync != None
        #: or complete behind the trainer's count holds a partial update.
        self.complete: Optional[int] = None

    # -- buffers and plans ---------------------------------------------

    def _buffer(self, msg: Bucket) -> torch.Tensor:
        key = (msg.sender, msg.buffer)
        buf = self._buffers.get(key)
        if buf is None:
            for old in {s for s, _ in self._buffers} - {msg.sender}:
                self.forget(old)  # a new trainer: let go of the old one
            buf = self._buffers[key] = self._device.open(
                msg.handle, self._device.local(msg.device))
        return buf

    def _entries(self, msg: Bucket) -> Tuple[Entry, ...]:
        plan = self._plans.setdefault((msg.sender, msg.plan), {})
        if msg.entries is not None:
            plan[msg.seq] = msg.entries
            return msg.entries
        got = plan.get(msg.seq)
        if got is None:
            raise error(TransferError,
                        f"bucket {msg.seq} of plan {msg.plan} (sender "
                        f"{msg.sender}) is not known here: this receiver "
                        f"did not see the sync that carried it")
        return got

    def _bucket(self, msg: Bucket) -> _Bucket:
        if not isinstance(msg, Bucket):
            raise error(ValueError, f"{type(msg).__name__} is not a Bucket: "
                                    f"it holds no tensors")
        self.sync = msg.sync
        entries = self._entries(msg)
        key = (msg.sender, msg.plan, msg.seq, msg.buffer)
        b = self._buckets.get(key)
        if b is None or b.entries is not entries:
            if len(self._buckets) >= self.LIMIT:
                self._buckets.clear()
            b = self._buckets[key] = _Bucket(entries)
        return b

    def _wait(self, msg: Bucket) -> None:
        self._device.wait(msg.event, self._device.local(msg.device))
        self._seen.setdefault(msg.sender, set()).add(msg.event)

    def _ack(self, msg: Bucket, error: Optional[str] = None) -> Ack:
        key = (msg.sender, msg.buffer)
        if key not in self._events:
            self._events[key] = self._device.event()
        ev, handle = self._events[key]
        self._device.record(ev)
        if error is not None:
            self.sync = msg.sync  # what was taken of it stays partial
        elif msg.last:
            self.complete, self.sync = msg.sync, None
        return Ack(msg.sender, msg.sync, msg.seq, msg.buffer, handle, error)

    # -- taking a bucket -------------------------------------------------

    def bind(self, targets: Optional[Mapping[str, torch.Tensor]]) -> None:
        """Where `load(msg)` copies to from now on: the engine's tensors
        by name, checked and turned into copies once per bucket layout.
        Bind again after the engine allocates its weights anew (a
        reload): the copies made for the old ones are dropped."""
        self._bound = targets
        for b in self._buckets.values():
            b.bound = None

    def views(self, msg: Bucket) -> Dict[str, torch.Tensor]:
        """Zero-copy views into the sender's buffer, by name (tied names
        each), valid until release(msg).  A tensor split across buckets
        has no view here: named_tensors() reassembles it."""
        b = self._bucket(msg)
        split = [e.name for e in b.entries if not e.whole]
        if split:
            raise error(
                ValueError,
                f"{', '.join(map(repr, split))} "
                f"{'is' if len(split) == 1 else 'are'} split across "
                f"buckets (larger than a buffer); use named_tensors(msg) or "
                f"load(msg, into=...)")
        out = dict(self._views_of(msg, b))
        self._wait(msg)
        return out

    def _views_of(self, msg: Bucket,
                  b: _Bucket) -> List[Tuple[str, torch.Tensor]]:
        if b.views is None:
            buf = self._buffer(msg)
            b.views = [(e, piece(buf, e).view(dtype(e.dtype))
                        .view(e.shape)) for e in b.entries if e.whole]
        return [(n, v) for e, v in b.views for n in (e.name,) + e.aliases]

    def named_tensors(self, msg: Bucket
                      ) -> Iterator[Tuple[str, torch.Tensor]]:
        """``(name, tensor)`` for each tensor complete in this bucket, as
        an engine's ``load_weights`` takes them (vLLM, SGLang): zero-copy
        views into the sender's buffer, valid until ``release(msg)``.  A
        tensor split across buckets is reassembled into a tensor of the
        receiver's (reused by the next sync) and comes with its last
        piece.  Tied names come each, with the same tensor."""
        b = self._bucket(msg)
        buf = self._buffer(msg)
        views = self._views_of(msg, b)
        self._wait(msg)
        pairs: List[Tuple[Entry, torch.Tensor]] = []
        done: List[Tuple[Entry, torch.Tensor]] = []
        for e in b.entries:
            if e.whole:
                continue
            key = (msg.sender, e.name)
            whole = self._whole.get(key)
            if whole is None or whole.numel() != e.size:
                whole = self._whole[key] = torch.empty(
                    e.size, dtype=torch.uint8, device=buf.device)
            flat = whole.view(dtype(e.dtype))
            pairs.append((e, flat))
            if e.ends:
                done.append((e, flat.view(e.shape)))
        if pairs:
            Program(buf, pairs, False).run()
        out = views + [(n, t) for e, t in done
                       for n in (e.name,) + e.aliases]
        return iter(out)

    def release(self, msg: Bucket) -> Ack:
        """The Ack for `msg` once the work queued on the current stream
        (reading its views) is done."""
        return self._ack(msg)

    def load(self, msg: Bucket,
             into: Optional[Mapping[str, torch.Tensor]] = None) -> Ack:
        """Copy each tensor of `msg` into ``into[name]`` (same dtype, shape,
        contiguous; checked before anything is copied), or into the
        targets bound with bind() when `into` is not given, and return
        the Ack.  A tensor's other names (tied weights) get it too where
        `into` holds another tensor under them."""
        b = self._bucket(msg)
        bound = into is None or into is self._bound
        targets = self._bound if into is None else into
        if targets is None:
            raise error(ValueError, "load() needs into=, or targets bound "
                                    "with bind()")
        copies: Union[Lanes, Program, None] = b.bound if bound else None
        if copies is None:
            buf = self._buffer(msg)
            pairs = self._pairs(b, targets)
            if bound:
                # Kept for every sync of this layout: each piece straight
                # into its target, replayed from a CUDA graph where the
                # device can capture it (never split_with_sizes_copy,
                # which a graph cannot replay safely: Program).
                copies = b.bound = Lanes(
                    [(bytes_of(t, e), piece(buf, e))
                     for e, t in pairs if e.nbytes], self._device.graph,
                    branches=self.BRANCHES)
            else:
                copies = Program(buf, pairs, False)
        self._wait(msg)
        copies.run()
        return self._ack(msg)

    def _pairs(self, b: _Bucket, targets: Mapping[str, torch.Tensor]
               ) -> List[Tuple[Entry, torch.Tensor]]:
        """Each entry of bucket `b` with its tensor in `targets`, every
        one checked."""
        pairs: List[Tuple[Entry, torch.Tensor]] = []
        get = targets.get if hasattr(targets, "get") else (lambda n: None)
        for e in b.entries:
            first = get(e.name)
            for name in (e.name,) + e.aliases:
                t = get(name)
                if t is None:
                    if name != e.name:
                        continue  # a tied name the engine does not keep
                    raise error(KeyError, f"{e.name!r} is not in `into`")
                if name != e.name and t is first:
                    continue  # tied in the engine too
                if (dtype_name(t.dtype) != e.dtype
                        or tuple(t.shape) != e.shape
                        or not t.is_contiguous()):
                    raise error(
                        ValueError,
                        f"{name!r} is "
                        f"{dtype_name(t.dtype)}{list(t.shape)}"
                        f"{'' if t.is_contiguous() else ' (not contiguous)'}"
                        f"; the sender sent {e.dtype}{list(e.shape)}")
                pairs.append((e, t))
        return pairs

    def serve(self, channel: Channel, *,
              into: Optional[Mapping[str, torch.Tensor]] = None,
              load_weights: Optional[Callable[[Iterable[Tuple[
                  str, torch.Tensor]]], Any]] = None,
              timeout: Optional[float] = 60.0) -> SyncResult:
        """Take one whole sync from `channel`: each bucket loaded (into
        `into`, or the bound targets; or handed to `load_weights` as
        named tensors) and acknowledged, up to the sync's last.  Returns
        a SyncResult whose ``complete`` is False when the sender aborted
        the sync.  A sender silent for `timeout` seconds raises
        TransferError; a bucket that cannot be taken is answered with an
        Ack that says why (the sender raises it) and raises here too.
        Either way the sync stays partial (``receiver.sync`` names it)."""
        buckets = tensors = 0
        sync: Optional[int] = None
        while True:
            msg: Message = channel.get(timeout)
            if isinstance(msg, Close):
                self.forget(msg.sender)
                continue
            if isinstance(msg, Abort):
                return SyncResult(msg.sync, False, buckets, tensors)
            if not isinstance(msg, Bucket):
                raise error(TransferError, f"expected the sender's Bucket, "
                                           f"got {type(msg).__name__}")
            if sync is not None and msg.sync != sync:
                raise error(TransferError, f"sync {msg.sync} began before "
                                           f"sync {sync} ended")
            sync = msg.sync
            try:
                if load_weights is not None:
                    batch = list(self.named_tensors(msg))
                    load_weights(batch)
                    tensors += len(batch)
                    ack = self.release(msg)
                else:
                    ack = self.load(msg, into)
                    tensors += sum(1 + len(e.aliases)
                                   for e in self._entries(msg) if e.ends)
            except Exception as exc:
                channel.put(self._ack(msg, f"{type(exc).__name__}: {exc}"))
                self._refuse_rest(channel, msg, timeout)
                raise
            channel.put(ack)
            buckets += 1
            if msg.last:
                return SyncResult(msg.sync, True, buckets, tensors)

    def _refuse_rest(self, channel: Channel, failed: Bucket,
                     timeout: Optional[float]) -> None:
        """After a bucket failed: answer the rest of its sync with an
        error too, up to its end, so that the channel holds nothing of it
        for the next sync."""
        msg = failed
        while not msg.last:
            try:
                msg = channel.get(timeout)
            except TransferError:
                return  # the sender is gone: nothing more will come
            if not isinstance(msg, Bucket) or msg.sync != failed.sync:
                return
            channel.put(self._ack(msg, f"bucket {failed.seq} of this sync "
                                       f"failed"))

    # -- letting go ------------------------------------------------------

    def forget(self, sender: str) -> None:
        """Let go of everything of `sender`'s: its buffers' mappings,
        events, plans and copies (a trainer that closed or restarted)."""
        tables: Tuple[Dict[Any, Any], ...] = (
            self._buffers, self._events, self._plans, self._buckets,
            self._whole)
        for table in tables:
            for key in [k for k in table if k[0] == sender]:
                del table[key]
        self._device.forget(self._seen.pop(sender, ()))

    def close(self) -> None:
        """Let go of every sender's buffers."""
        for sender in ({s for s, _ in self._buffers} | set(self._seen)):
            self.forget(sender)
