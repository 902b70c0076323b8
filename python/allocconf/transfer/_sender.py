"""The trainer's side of the bucketed mode: :class:`Sender` packs named
tensors into a few reusable buffers, a bucket at a time, and hands each
bucket to the receiver over a channel."""
from __future__ import annotations

import uuid
from typing import (Any, Callable, Dict, Generator, Iterable, Iterator,
                    List, Mapping, Optional, Sequence, Set, Tuple, Union)

import torch

from allocconf.transfer._channel import Channel, check_sync
from allocconf.transfer._copies import Program
from allocconf.transfer._device import Device, device_of
from allocconf.transfer._errors import TransferError, check, error, seconds
from allocconf.transfer._layout import Key, Layout, Plan, aliases
from allocconf.transfer._messages import (Abort, Ack, Bucket, Close, Entry,
                                          Message)
from allocconf.transfer._replay import Kept
from allocconf.transfer._tensors import casts as checked_casts
from allocconf.transfer._tensors import check as check_tensor

Tensors = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]
Casts = Optional[Mapping[torch.dtype, torch.dtype]]
# (plan, bucket, buffer): where a kept Program belongs
ProgramKey = Tuple[str, int, int]


class _Progress:
    """One send()'s progress: the bucket being packed and its copies."""

    def __init__(self, sync: int) -> None:
        self.sync = sync
        self.seq = 0
        self.buf: Optional[int] = None
        self.after: Optional[bytes] = None  # the receiver's reads of buf
        self.entries: List[Entry] = []
        self.pairs: List[Tuple[Entry, torch.Tensor]] = []  # not yet run
        self.ptrs: Set[int] = set()  # sources whose copy is queued
        self.whole = True        # every message carried the final plan


class Sender:
    """The trainer's side: `buffers` reusable buffers of `capacity` bytes
    each, allocated once, inside ipc_safe(), on `device` (the current CUDA
    device by default; a :class:`~allocconf.transfer.testing.HostDevice`
    to run on the CPU).  `timeout` (seconds) bounds every wait for the
    receiver in :meth:`sync`."""

    def __init__(self, capacity: int = 1 << 30, buffers: int = 2, *,
                 device: Union[int, Device, None] = None,
                 timeout: float = 60.0) -> None:
        check("buffers", buffers, "an int >= 1",
              isinstance(buffers, int) and buffers >= 1)
        Layout(capacity)  # checks it
        self.capacity = capacity
        self.timeout = seconds("timeout", timeout)
        self._device = device_of(device)
        # Unique across processes and restarts: a receiver caches the
        # buffers it opened by this id, so a restarted trainer must not
        # reuse one.
        self.id = uuid.uuid4().hex
        self._buffers = [self._device.alloc(capacity)
                         for _ in range(buffers)]
        self._handles = [self._device.share(b) for b in self._buffers]
        self._events = [self._device.event() for _ in range(buffers)]
        # buffer -> (sync, seq) it holds until acknowledged
        self._pending: Dict[int, Tuple[int, int]] = {}
        self._after: Dict[int, bytes] = {}   # buffer -> receiver's event
        # buffer -> the sources copied into it, held until it is packed
        # again (their copies are done by then: the receiver read them),
        # so that a source its owner frees stays valid until copied.
        self._held: Dict[int, List[Tuple[Entry, torch.Tensor]]] = {}
        self._syncs = 0  # syncs begun
        self._next = 0
        # the copies kept, with the sources' addresses they were made of
        self._programs: Dict[ProgramKey, Tuple[Tuple[int, ...], Program]] = {}
        self._kept: Optional[Kept] = None
        self._plan: Optional[Plan] = None
        # (sync, plan): the sync that carried the whole plan, until every
        # bucket of it is acknowledged (then the receiver knows it).
        self._teaching: Optional[Tuple[int, Plan]] = None
        self._aborted = 0  # syncs up to this one were given up
        self._closed = False

    @property
    def buffers(self) -> Sequence[torch.Tensor]:
        """The buffers (uint8), e.g. to register with RDMA or NCCL."""
        return tuple(self._buffers)

    @property
    def pending(self) -> int:
        """Buckets sent and not yet acknowledged."""
        return len(self._pending)

    def acknowledge(self, ack: Ack) -> None:
        """Take the receiver's Ack: its buffer may be packed again (after
        the receiver's reads, which the sender's stream waits for).  An
        Ack that says the receiver could not take the bucket raises
        TransferError (the buffer is free again)."""
        if not isinstance(ack, Ack) or ack.sender != self.id:
            raise error(ValueError, f"{ack!r} is not an Ack for this "
                                    f"sender ({self.id})")
        if ack.sync <= self._aborted:
            return  # a late answer about a sync given up: nothing to do
        held = self._pending.get(ack.buffer)
        if held != (ack.sync, ack.seq):
            raise error(ValueError,
                        f"Ack for sync {ack.sync} bucket {ack.seq} in "
                        f"buffer {ack.buffer}, which holds "
                        + (f"sync {held[0]} bucket {held[1]}" if held
                           else "nothing unacknowledged"))
        del self._pending[ack.buffer]
        self._after[ack.buffer] = ack.event
        if ack.error is not None:
            self._unteach()
            raise error(TransferError, f"the receiver could not take sync "
                                       f"{ack.sync} bucket {ack.seq}: "
                                       f"{ack.error}")
        if (self._teaching is not None and self._teaching[0] == ack.sync
                and all(s != ack.sync for s, _ in self._pending.values())):
            # Every bucket of the sync that carried the whole plan is in.
            self._teaching[1].known = True
            self._teaching = None

    def _unteach(self) -> None:
        """Teach the receiver the plan again with the next sync."""
        if self._plan is not None:
            self._plan.known = False
        self._teaching = None

    def _take(self, s: _Progress, receive_ack: Optional[Callable[[], Ack]]
              ) -> None:
        """The next buffer for sync `s`, once the receiver gave it back."""
        b = self._next
        while b in self._pending:
            if receive_ack is None:
                raise error(RuntimeError,
                            f"all {len(self._buffers)} buffers wait for the "
                            f"receiver's Ack; pass receive_ack= to send(), "
                            f"or call acknowledge() before asking for the "
                            f"next bucket")
            self.acknowledge(receive_ack())
        self._next = (b + 1) % len(self._buffers)
        s.after = self._after.pop(b, None)  # the copies wait for it
        self._held.pop(b, None)
        s.buf = b

    def _untake(self, s: _Progress) -> None:
        """Give back the buffer `s` took and sent nothing in."""
        assert s.buf is not None
        self._next = s.buf
        if s.after is not None:  # not yet waited for
            self._after[s.buf] = s.after

    def send(self, tensors: Tensors, *,
             receive_ack: Optional[Callable[[], Ack]] = None,
             cast: Casts = None, eager: bool = False) -> Iterator[Bucket]:
        """Pack `tensors` (a state dict, or (name, tensor) pairs: a
        generator of gathered shards is consumed lazily) bucket after
        bucket; yield a Bucket for each.  When a buffer is still held by
        the receiver, its Ack is taken from `receive_ack()` (a blocking
        call on the application's channel).

        `cast` maps a dtype to the one to send it as (``{torch.float32:
        torch.bfloat16}`` for fp32 master weights and a bf16 engine),
        converted as ``Tensor.to`` converts.  In a state dict, tensors
        that share their memory (tied weights) are sent once and arrive
        under every name.

        A state dict sent again with the same tensors, unchanged in
        address, dtype and shape (a model's parameters after an optimizer
        step), is sent as before: its plan and its copies are reused, so
        that such a sync costs no per-tensor work beyond checking them.
        The Sender keeps references to the last state dict's tensors
        for that, until another is sent or it is closed.

        The copies of a bucket are queued together, when it is full, on
        the current stream: after the work queued before (the tensors'
        producers), before the work queued after (an optimizer step).  A
        tensor given must keep its values until its bucket is full: an
        iterable that refills one tensor for every item (a gather into a
        scratch buffer) needs ``eager=True``, which queues each item's
        copies before the next item is asked for; without it, a tensor
        that comes back at an address whose copy has not run raises
        ValueError instead of sending what the refill wrote."""
        if self._closed:
            raise error(RuntimeError, "this Sender is closed")
        casts = checked_casts(cast)
        self._syncs += 1
        s = _Progress(self._syncs)
        try:
            kept = self._kept
            if (isinstance(tensors, Mapping) and not eager
                    and kept is not None and kept.plan is self._plan
                    and kept.fits(tensors, casts)):
                if (yield from self._send_kept(kept, tensors, s,
                                               receive_ack)):
                    return
                s = _Progress(s.sync)
            self._kept = None
            yield from self._send(tensors, receive_ack, casts, eager, s)
        finally:
            if s.buf is not None and s.buf not in self._pending:
                # Taken but never sent (the source raised, or the caller
                # stopped): free again, nothing for the receiver to ack.
                self._untake(s)

    def _send_kept(self, kept: Kept, tensors: Mapping[str, Any],
                   s: _Progress, receive_ack: Optional[Callable[[], Ack]]
                   ) -> Generator[Bucket, None, bool]:
        """send() of the state dict sent last, as it was made; False,
        with nothing sent, where these are not the tensors it was made
        of, unchanged (the check, :meth:`Sources.still`).

        The first bucket's kept copies are queued before the check, from
        memory their program holds, so that the check runs while the
        device copies; a failed check sends nothing of them (the tensor
        by tensor path packs that buffer again, after them in stream
        order)."""
        last = len(kept.buckets) - 1
        for seq, (entries, pairs, sig) in enumerate(kept.buckets):
            self._take(s, receive_ack)
            assert s.buf is not None
            early = seq == 0 and self._kept_program(kept.plan, 0, s.buf, sig)
            if seq == 0 and not early and not kept.still(tensors):
                self._untake(s)  # no copy made: the tensors changed
                return False
            s.entries, s.pairs = list(entries), pairs
            self._pack(s, kept.plan, sig)
            if early and not kept.still(tensors):
                self._untake(s)
                return False
            yield self._message(s, seq == last, kept.plan)
        return True

    def _kept_program(self, p: Plan, seq: int, buf: int,
                      sig: Tuple[int, ...]) -> bool:
        """Whether the copies of bucket `seq` in `buf` are kept, made of
        sources at the addresses `sig`."""
        made = self._programs.get((p.id, seq, buf))
        return made is not None and made[0] == sig

    def _send(self, tensors: Tensors,
              receive_ack: Optional[Callable[[], Ack]],
              casts: Dict[torch.dtype, torch.dtype], eager: bool,
              s: _Progress) -> Iterator[Bucket]:
        """send() tensor by tensor: following the last plan while the
        tensors match it, making a new one from where they do not."""
        items: Iterator[Tuple[str, Any]]
        mapping = isinstance(tensors, Mapping)
        if isinstance(tensors, Mapping):
            alias_of, others = aliases(tensors)
            items = iter(tensors.items())
        else:
            alias_of, others = {}, {}
            items = iter(tensors)
        old = self._plan
        p = old if old is not None and old.capacity == self.capacity else None
        follow = p is not None
        if p is None:
            p = Plan(self.capacity)
        # A state dict's sync is kept to be sent again (see send()).
        kept = Kept(p, casts) if mapping and not eager else None
        layout: Optional[Layout] = None if follow else Layout(self.capacity)
        device = self._device.torch_device
        index = 0
        for name, item in items:
            check_tensor(name, item, device)
            t: torch.Tensor = item
            key = Key(name, t.dtype, casts.get(t.dtype, t.dtype),
                      tuple(t.shape), alias_of.get(name),
                      others.get(name, ()))
            if follow and not (index < len(p.keys) and p.keys[index] == key):
                follow = False  # the layout changed: a new plan here
                p, layout = p.prefix(index, s.entries)
                s.whole = False
                if kept is not None:
                    kept.plan = p
            if follow:
                pieces = p.pieces[index]
            else:
                assert layout is not None
                pieces = p.place(layout, key, t.numel())
            index += 1
            if kept is not None:
                kept.add(name, t)
            if not mapping and t.numel():
                if t.data_ptr() in s.ptrs:
                    raise error(ValueError,
                                f"{name!r} is at the address of an earlier "
                                f"tensor whose copy has not run: a source "
                                f"that refills one tensor must be sent with "
                                f"eager=True (tied tensors are sent once "
                                f"from a state dict)")
                s.ptrs.add(t.data_ptr())
            for brk, e in pieces:
                if brk:
                    yield self._flush(s, False, p, kept)
                if s.buf is None:
                    self._take(s, receive_ack)
                s.entries.append(e)
                s.pairs.append((e, t))
            if eager:
                self._run(s)
        if follow and index != len(p.keys):
            p, layout = p.prefix(index, s.entries)  # fewer tensors
            s.whole = False
            if kept is not None:
                kept.plan = p
        if s.buf is None:
            self._take(s, receive_ack)  # an empty sync still says so
        self._plan = p
        yield self._flush(s, True, p, kept)
        self._kept = kept

    def _program(self, s: _Progress, p: Plan,
                 sig: Optional[Tuple[int, ...]]) -> Program:
        """The copies of the bucket being sent: made, or the ones made
        before for the same plan, bucket, buffer and sources (`sig`:
        their addresses; None: not kept to be sent again)."""
        assert s.buf is not None
        if sig is None:
            return Program(self._buffers[s.buf], s.pairs, True)
        key = (p.id, s.seq, s.buf)
        got = self._programs.get(key)
        if got is not None and got[0] == sig:
            return got[1]
        if got is None and any(k[0] != p.id for k in self._programs):
            self._programs.clear()  # another plan's: never used again
        # Kept to be run again: replayed from a CUDA graph where the
        # device can capture it.
        prog = Program(self._buffers[s.buf], s.pairs, True,
                       self._device.graph)
        self._programs[key] = (sig, prog)
        return prog

    def _run(self, s: _Progress, event: Any = None,
             program: Optional[Program] = None) -> None:
        """Queue the bucket's copies on the current stream, after the
        sources' producers and the receiver's reads of the buffer, and
        record `event` after them; the work queued next (an optimizer
        step, a refill) runs after them in stream order.  (A copy stream
        of its own would order nothing more, since that work must wait
        for the copies anyway, and cost host time to enter and leave:
        docs/design.md.)  The sources are held with the buffer."""
        assert s.buf is not None
        if program is None and s.pairs:
            program = Program(self._buffers[s.buf], s.pairs, True)
        if s.after is not None:
            self._device.wait(s.after)
            s.after = None
        if program is not None:
            program.run()
        if event is not None:
            self._device.record(event)
        self._held.setdefault(s.buf, []).extend(s.pairs)
        s.pairs, s.ptrs = [], set()

    def _pack(self, s: _Progress, p: Plan,
              sig: Optional[Tuple[int, ...]] = None) -> None:
        """Run the bucket's copies and record its event; `sig`: see
        _program."""
        assert s.buf is not None
        program = self._program(s, p, sig) if s.pairs else None
        self._run(s, self._events[s.buf][0], program)

    def _message(self, s: _Progress, last: bool, p: Plan) -> Bucket:
        """The bucket's message; the buffer is the receiver's until its
        Ack."""
        assert s.buf is not None
        msg = Bucket(self.id, s.sync, s.seq, s.buf, last,
                     self._handles[s.buf], self._events[s.buf][1],
                     self._device.uuid, p.id,
                     None if p.known else tuple(s.entries))
        if p.known:
            s.whole = False  # nothing to teach in this sync
        self._pending[s.buf] = (s.sync, s.seq)
        if last and s.whole:
            self._teaching = (s.sync, p)
        s.seq += 1
        s.buf, s.entries = None, []
        return msg

    def _flush(self, s: _Progress, last: bool, p: Plan,
               kept: Optional[Kept]) -> Bucket:
        """Pack the bucket and make its message; with `kept`, recorded
        there and its copies kept."""
        sig = None
        if kept is not None:
            sig = tuple(t.data_ptr() for _, t in s.pairs)
            kept.buckets.append((s.entries, s.pairs, sig))
        self._pack(s, p, sig)
        return self._message(s, last, p)

    def drain(self, receive_ack: Union[Callable[[], Ack], Channel],
              timeout: Optional[float] = None) -> None:
        """Take Acks until every bucket sent has been acknowledged: from
        `receive_ack()`, or from a Channel (each wait bounded by
        `timeout` seconds, the Sender's by default)."""
        get = self._acks_from(receive_ack, timeout)
        while self._pending:
            self.acknowledge(get())

    def _acks_from(self, source: Union[Callable[[], Ack], Channel],
                   timeout: Optional[float]) -> Callable[[], Ack]:
        if not isinstance(source, Channel):
            return source
        wait = self.timeout if timeout is None else float(timeout)

        def receive_ack() -> Ack:
            ack: Ack = source.get(wait)
            return ack
        return receive_ack

    def sync(self, tensors: Tensors, channel: Channel, *,
             cast: Casts = None, eager: bool = False,
             timeout: Optional[float] = None, wait: bool = True) -> int:
        """Send one whole sync over `channel`: every bucket put and, with
        `wait`, every Ack taken; each wait for the receiver bounded by
        `timeout` seconds (the Sender's by default).  Returns the buckets
        sent.  A receiver that stays silent raises TransferError, as does
        one that could not take a bucket; on any error the sync is
        aborted (the receiver told, when it can hear) and the sender is
        usable again.  Arguments of the wrong type raise TypeError at
        once, naming the argument.

        ``wait=False`` returns once every bucket is sent, while the engine
        still reads them: the trainer may queue its next optimizer step
        at once (the GPU runs it after the copies out of its weights).
        The Acks are taken by the next sync, or by ``drain(channel)``.

        Each bucket's message is put as soon as its copies are queued,
        and says to wait for them: the engine reads a bucket while the
        trainer packs the next."""
        check_sync(tensors, channel)
        get = self._acks_from(channel, timeout)
        sent = 0
        try:
            for msg in self.send(tensors, receive_ack=get, cast=cast,
                                 eager=eager):
                channel.put(msg)
                sent += 1
            if wait:
                self.drain(get)
        except BaseException:
            self.abort(channel)
            raise
        return sent

    def abort(self, channel: Optional[Channel] = None) -> None:
        """Give up on the buckets not acknowledged (the receiver is dead,
        or will not answer): the sender is usable again, and teaches the
        receiver its plan anew.  With a channel, the receiver is told that
        the sync ended early, so that it never takes it for whole."""
        self._aborted = self._syncs
        self._pending.clear()
        self._after.clear()
        self._held.clear()
        self._unteach()
        if channel is not None:
            self._tell(channel, Abort(self.id, self._syncs))

    def _tell(self, channel: Channel, msg: Message) -> None:
        """Tell the receiver, if it can hear (a dead one cannot)."""
        try:
            channel.put(msg)
        except Exception:
            pass

    def close(self, channel: Optional[Channel] = None) -> None:
        """Free the buffers; with a channel, tell the receiver first, so
        that it lets go of its mappings of them."""
        if self._closed:
            return
        if channel is not None:
            self._tell(channel, Close(self.id))
        self._closed = True
        self._pending.clear()
        self._held.clear()
        self._programs.clear()
        self._kept = None
        self._buffers, self._handles, self._events = [], [], []
