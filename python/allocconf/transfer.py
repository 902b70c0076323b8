"""Bucketed weight transfer over classic CUDA IPC (docs/rl-weight-sync.md).

A trainer (:class:`Sender`) keeps a few reusable buffers of classic
memory, allocated once inside :func:`allocconf.ipc_safe`, packs named
tensors into them a bucket at a time and yields a small picklable
:class:`Message` per bucket; the application ships it over its own
channel (a multiprocessing queue, Ray, ZMQ).  An engine
(:class:`Receiver`) opens each buffer's IPC handle once, waits on the
bucket's interprocess CUDA event, copies into its own tensors (or hands
out zero-copy views) and returns an :class:`Ack`; a buffer is packed
again only after the receiver acknowledged it, and the sender's stream
waits, on the GPU, for the receiver's copies to finish.

Only classic CUDA IPC is used (``cudaIpcGetMemHandle``, no
``pidfd_getfd``), so it works where sharing memory in expandable segments
does not: containers without ptrace permission over the sender.

``import allocconf.transfer`` imports torch; ``import allocconf`` does not
import this module.
"""
from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Tuple, Union)

import torch

import allocconf

__all__ = ["Entry", "Message", "Ack", "Sender", "Receiver", "plan"]

#: Byte alignment of every tensor in a buffer: enough for any dtype's
#: view and for vectorised copies.
ALIGN = 256

_cuda: Any = torch.cuda  # its Event is untyped


@dataclass(frozen=True)
class Entry:
    """One tensor, or one piece of a tensor split across buckets."""

    name: str
    dtype: str               # torch dtype name, e.g. "bfloat16"
    shape: Tuple[int, ...]
    offset: int              # bytes into the buffer
    nbytes: int              # bytes of this piece
    start: int = 0           # bytes into the tensor where the piece begins
    total: int = -1          # the tensor's bytes (-1: nbytes, unsplit)

    @property
    def whole(self) -> bool:
        """The piece is the whole tensor."""
        return self.start == 0 and self.nbytes == self.size

    @property
    def size(self) -> int:
        """The whole tensor's bytes."""
        return self.nbytes if self.total < 0 else self.total


@dataclass(frozen=True)
class Message:
    """What the sender yields for one bucket: picklable, a few hundred
    bytes plus the layout."""

    sender: str              # the Sender's id, to cache handles by
    sync: int                # which send() call, from 1
    seq: int                 # the bucket's index within the sync
    buffer: int              # which of the sender's buffers holds it
    entries: Tuple[Entry, ...]
    last: bool               # the sync's last bucket
    handle: Any              # the buffer's IPC handle (reduce_tensor's)
    event: bytes             # interprocess event recorded after packing
    device: int


@dataclass(frozen=True)
class Ack:
    """The receiver's word that it is done with a bucket's buffer."""

    sender: str
    sync: int
    seq: int
    buffer: int
    event: bytes             # recorded after the receiver's reads


def _align(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class _Layout:
    """Where tensors go, bucket after bucket, in buffers of `capacity`
    bytes: each at an ALIGN-ed offset; one that does not fit in what is
    left of a bucket starts the next; one larger than a whole buffer is
    split into pieces, the first at the start of a bucket."""

    def __init__(self, capacity: int) -> None:
        if (not isinstance(capacity, int) or isinstance(capacity, bool)
                or capacity < ALIGN):
            raise ValueError(f"allocconf.transfer: capacity must be an int "
                             f"of at least {ALIGN} bytes, got {capacity!r}")
        self.capacity = capacity
        self.fill = 0    # bytes used in the current bucket
        self.count = 0   # entries in it

    def place(self, name: str, dtype: str, shape: Tuple[int, ...],
              nbytes: int) -> Iterator[Optional[Entry]]:
        """Yield the tensor's entries, and None wherever a new bucket
        begins before the next one."""
        start = 0
        while True:
            left = nbytes - start
            off = _align(self.fill)
            if left > self.capacity - off and self.count:
                yield None
                self.fill = self.count = off = 0
            piece = min(left, self.capacity - off)
            yield Entry(name, dtype, shape, off, piece, start,
                        -1 if piece == nbytes else nbytes)
            self.count += 1
            self.fill = off + piece
            start += piece
            if start >= nbytes:
                return


def plan(sizes: Iterable[Tuple[str, str, Tuple[int, ...], int]],
         capacity: int) -> List[List[Entry]]:
    """The buckets for tensors given as (name, dtype, shape, nbytes), in
    order, into buffers of `capacity` bytes (see Sender.send)."""
    layout = _Layout(capacity)
    buckets: List[List[Entry]] = [[]]
    for name, dtype, shape, nbytes in sizes:
        for e in layout.place(name, dtype, tuple(shape), nbytes):
            if e is None:
                buckets.append([])
            else:
                buckets[-1].append(e)
    return buckets


@functools.lru_cache(maxsize=None)
def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"allocconf.transfer: unknown dtype {name!r}")
    return d


@functools.lru_cache(maxsize=None)
def _dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def _check(name: Any, t: Any, device: torch.device) -> None:
    """A clear error for what cannot be packed, naming it."""
    if not isinstance(name, str):
        raise TypeError(f"allocconf.transfer: names must be str, got "
                        f"{type(name).__name__} {name!r}")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"allocconf.transfer: {name!r} is a "
                        f"{type(t).__name__}, not a tensor")
    if t.device != device:
        raise ValueError(f"allocconf.transfer: {name!r} is on {t.device}; "
                         f"this sender's buffers are on {device}")
    if not t.is_contiguous():
        raise ValueError(
            f"allocconf.transfer: {name!r} is not contiguous (shape "
            f"{list(t.shape)}, stride {list(t.stride())}); pass "
            f"t.contiguous()")


def _piece(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    return buf[e.offset:e.offset + e.nbytes]


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def _wide(nbytes: int, address: int) -> torch.dtype:
    """The widest integer dtype that tiles `nbytes` bytes at `address`."""
    for width, dtype in _WIDE:
        if nbytes % width == 0 and address % width == 0:
            return dtype
    return torch.uint8


class _Copies:
    """The copies of one bucket, bit for bit.  A piece of at least BIG
    bytes is copied on its own with Tensor.copy_ (a device-to-device
    memcpy, the fastest copy there is for it, but one launch each); the
    smaller ones go in one _foreach_copy_ (one launch for many) as the
    widest integers that tile them, never as their dtype: that kernel
    rounds through float and would rewrite NaN payloads.  The buffer's
    side of each copy is made once per (buffer, offset, bytes, dtype,
    shape) and kept in `views`, so a repeated sync creates no tensor on
    that side.  benchmarks/copy_methods.py measured the choices
    (docs/benchmarks.md)."""

    BIG = 32 << 20   # bytes: copy_ here is bound by the GPU, not its launch
    LIMIT = 1 << 16  # cached views before the cache starts again

    def __init__(self, views: Dict[Any, torch.Tensor]) -> None:
        self.views = views
        self.big: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.small: Tuple[List[torch.Tensor], List[torch.Tensor]] = ([], [])

    def add(self, key: Any, buf: torch.Tensor, e: Entry, t: torch.Tensor,
            into_buffer: bool) -> None:
        """Queue the copy of entry `e` of tensor `t` between `buf` (known
        as `key`) and `t`: into the buffer, or out of it."""
        big = e.nbytes >= self.BIG
        typed = big and e.whole  # copied as itself: copy_ is a memcpy
        if typed:
            dtype, mine = t.dtype, t
        else:
            raw = _as_bytes(t)
            if not e.whole:
                raw = raw[e.start:e.start + e.nbytes]
            dtype = torch.uint8 if big else _wide(e.nbytes, raw.data_ptr())
            mine = raw if dtype == torch.uint8 else raw.view(dtype)
        k = (key, e.offset, e.nbytes, dtype, e.shape)
        theirs = self.views.get(k)
        if theirs is None:
            if len(self.views) >= self.LIMIT:
                self.views.clear()
            theirs = _piece(buf, e).view(dtype)
            if typed:
                theirs = theirs.view(e.shape)
            self.views[k] = theirs
        dst, src = (theirs, mine) if into_buffer else (mine, theirs)
        if big:
            self.big.append((dst, src))
        else:
            self.small[0].append(dst)
            self.small[1].append(src)

    def run(self) -> None:
        with torch.no_grad():  # a model's parameters may require grad
            for dst, src in self.big:
                dst.copy_(src)
            if self.small[0]:
                torch._foreach_copy_(self.small[0], self.small[1])
        self.big, self.small = [], ([], [])


class _Cuda:
    """CUDA: buffers in classic memory, shared by cudaIpcGetMemHandle,
    ordered by interprocess events."""

    def __init__(self, device: Optional[int]) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("allocconf.transfer: no CUDA device")
        self.device = (torch.cuda.current_device() if device is None
                       else int(device))
        self.torch_device = torch.device("cuda", self.device)
        self._events: Dict[bytes, Any] = {}

    def alloc(self, nbytes: int) -> torch.Tensor:
        with allocconf.ipc_safe():
            buf = torch.empty(nbytes, dtype=torch.uint8,
                              device=self.torch_device)
        if not allocconf.ipc_capable(buf):
            raise RuntimeError(
                "allocconf.transfer: a buffer allocated inside ipc_safe() "
                "is in an expandable segment (" + allocconf.status().reason
                + ")")
        return buf

    def share(self, buf: torch.Tensor) -> Any:
        from torch.multiprocessing import reductions
        r: Any = reductions  # untyped in torch
        return r.reduce_tensor(buf)

    def open(self, handle: Any) -> torch.Tensor:
        rebuild, args = handle
        t: torch.Tensor = rebuild(*args)
        return t

    def event(self) -> Tuple[Any, bytes]:
        ev = _cuda.Event(interprocess=True)
        ev.record(torch.cuda.current_stream(self.device))  # a valid handle
        return ev, bytes(ev.ipc_handle())

    def record(self, ev: Any) -> None:
        ev.record(torch.cuda.current_stream(self.device))

    def wait(self, handle: bytes) -> None:
        ev = self._events.get(handle)
        if ev is None:
            ev = _cuda.Event.from_ipc_handle(self.device, handle)
            self._events[handle] = ev
        torch.cuda.current_stream(self.device).wait_event(ev)


class Sender:
    """The trainer's side: `buffers` reusable buffers of `capacity` bytes
    each, allocated once, inside ipc_safe(), on `device` (the current CUDA
    device by default)."""

    def __init__(self, capacity: int = 1 << 30, buffers: int = 2, *,
                 device: Optional[int] = None, _ops: Any = None) -> None:
        if not isinstance(buffers, int) or buffers < 1:
            raise ValueError(f"allocconf.transfer: buffers must be an int "
                             f">= 1, got {buffers!r}")
        _Layout(capacity)  # validates it
        self.capacity = capacity
        self._ops = _ops if _ops is not None else _Cuda(device)
        # Unique across processes and restarts: a receiver caches the
        # buffers it opened by this id, so a restarted trainer must not
        # reuse one.
        self.id = uuid.uuid4().hex
        self._buffers = [self._ops.alloc(capacity) for _ in range(buffers)]
        self._handles = [self._ops.share(b) for b in self._buffers]
        self._events = [self._ops.event() for _ in range(buffers)]
        # buffer -> (sync, seq) it holds until acknowledged
        self._pending: Dict[int, Tuple[int, int]] = {}
        self._after: Dict[int, bytes] = {}   # buffer -> receiver's event
        self._sync = 0
        self._next = 0
        self._views: Dict[Any, torch.Tensor] = {}  # see _Copies

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
        the receiver's reads, which the sender's stream waits for)."""
        if not isinstance(ack, Ack) or ack.sender != self.id:
            raise ValueError(f"allocconf.transfer: {ack!r} is not an Ack "
                             f"for this sender ({self.id})")
        held = self._pending.get(ack.buffer)
        if held != (ack.sync, ack.seq):
            raise ValueError(
                f"allocconf.transfer: Ack for sync {ack.sync} bucket "
                f"{ack.seq} in buffer {ack.buffer}, which holds "
                + (f"sync {held[0]} bucket {held[1]}" if held
                   else "nothing unacknowledged"))
        del self._pending[ack.buffer]
        self._after[ack.buffer] = ack.event

    def _take(self, receive_ack: Optional[Callable[[], Ack]]) -> int:
        b = self._next
        while b in self._pending:
            if receive_ack is None:
                raise RuntimeError(
                    f"allocconf.transfer: all {len(self._buffers)} buffers "
                    f"wait for the receiver's Ack; pass receive_ack= to "
                    f"send(), or call acknowledge() before asking for the "
                    f"next bucket")
            self.acknowledge(receive_ack())
        self._next = (b + 1) % len(self._buffers)
        after = self._after.pop(b, None)
        if after:
            self._ops.wait(after)  # the receiver's reads come first
        return b

    def send(self, tensors: Union[Mapping[str, Any],
                                  Iterable[Tuple[str, Any]]], *,
             receive_ack: Optional[Callable[[], Ack]] = None
             ) -> Iterator[Message]:
        """Pack `tensors` (a state dict, or (name, tensor) pairs: a
        generator of gathered shards is consumed lazily) bucket after
        bucket; yield a Message for each.  When a buffer is still held by
        the receiver, its Ack is taken from `receive_ack()` (a blocking
        call on the application's channel)."""
        self._sync += 1
        sync = self._sync
        items = iter(tensors.items() if isinstance(tensors, Mapping)
                     else tensors)
        seq = 0
        buf: Optional[int] = None
        layout = _Layout(self.capacity)
        copies = _Copies(self._views)
        entries: List[Entry] = []

        def flush(last: bool) -> Message:
            nonlocal buf, seq, entries
            assert buf is not None
            copies.run()
            ev, handle = self._events[buf]
            self._ops.record(ev)
            msg = Message(self.id, sync, seq, buf, tuple(entries), last,
                          self._handles[buf], handle, self._ops.device)
            self._pending[buf] = (sync, seq)
            seq += 1
            buf, entries = None, []
            return msg

        try:
            for name, t in items:
                _check(name, t, self._ops.torch_device)
                for e in layout.place(name, _dtype_name(t.dtype),
                                      tuple(t.shape),
                                      t.numel() * t.element_size()):
                    if e is None:
                        yield flush(False)
                        continue
                    if buf is None:
                        buf = self._take(receive_ack)
                    entries.append(e)
                    if e.nbytes:
                        copies.add(buf, self._buffers[buf], e, t, True)
            if buf is None:
                buf = self._take(receive_ack)  # an empty sync still says so
            yield flush(True)
        finally:
            if buf is not None and buf not in self._pending:
                # Taken but never sent (the source raised, or the caller
                # stopped): free again, nothing for the receiver to ack.
                self._next = buf

    def drain(self, receive_ack: Callable[[], Ack]) -> None:
        """Take Acks until every bucket sent has been acknowledged."""
        while self._pending:
            self.acknowledge(receive_ack())


class Receiver:
    """The engine's side: opens each sender buffer's handle once (cached),
    and for each Message waits on its event on the current stream."""

    def __init__(self, device: Optional[int] = None, *,
                 _ops: Any = None) -> None:
        self._ops = _ops if _ops is not None else _Cuda(device)
        self._buffers: Dict[Tuple[str, int], torch.Tensor] = {}
        self._events: Dict[Tuple[str, int], Tuple[Any, bytes]] = {}
        self._views: Dict[Any, torch.Tensor] = {}  # see _Copies

    def _buffer(self, msg: Message) -> torch.Tensor:
        key = (msg.sender, msg.buffer)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self._ops.open(msg.handle)
        return buf

    def _ack(self, msg: Message) -> Ack:
        key = (msg.sender, msg.buffer)
        if key not in self._events:
            self._events[key] = self._ops.event()
        ev, handle = self._events[key]
        self._ops.record(ev)
        return Ack(msg.sender, msg.sync, msg.seq, msg.buffer, handle)

    def views(self, msg: Message) -> Dict[str, torch.Tensor]:
        """Zero-copy views into the sender's buffer, by name, valid until
        release(msg).  Tensors split across buckets have no view here."""
        split = [e.name for e in msg.entries if not e.whole]
        if split:
            raise ValueError(
                f"allocconf.transfer: {', '.join(map(repr, split))} "
                f"{'is' if len(split) == 1 else 'are'} split across "
                f"buckets (larger than a buffer); use load(msg, into=...)")
        buf = self._buffer(msg)
        self._ops.wait(msg.event)
        return {e.name: _piece(buf, e).view(_dtype(e.dtype)).view(e.shape)
                for e in msg.entries}

    def release(self, msg: Message) -> Ack:
        """The Ack for `msg` once the work queued on the current stream
        (reading its views) is done."""
        return self._ack(msg)

    def load(self, msg: Message, into: Mapping[str, torch.Tensor]) -> Ack:
        """Copy each tensor of `msg` into ``into[name]`` (same dtype, shape,
        contiguous; checked before anything is copied), and return the
        Ack."""
        buf = self._buffer(msg)
        key = (msg.sender, msg.buffer)
        copies = _Copies(self._views)
        for e in msg.entries:
            t = into.get(e.name) if hasattr(into, "get") else None
            if t is None:
                raise KeyError(f"allocconf.transfer: {e.name!r} is not in "
                               f"`into`")
            if (_dtype_name(t.dtype) != e.dtype or tuple(t.shape) != e.shape
                    or not t.is_contiguous()):
                raise ValueError(
                    f"allocconf.transfer: {e.name!r} is "
                    f"{_dtype_name(t.dtype)}{list(t.shape)}"
                    f"{'' if t.is_contiguous() else ' (not contiguous)'}; "
                    f"the sender sent {e.dtype}{list(e.shape)}")
            if e.nbytes:
                copies.add(key, buf, e, t, False)
        self._ops.wait(msg.event)
        copies.run()
        return self._ack(msg)
