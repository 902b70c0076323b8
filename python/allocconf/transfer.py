"""Bucketed weight transfer over classic CUDA IPC (docs/rl-weight-sync.md).

A trainer (:class:`Sender`) keeps a few reusable buffers of classic
memory, allocated once inside :func:`allocconf.ipc_safe`, packs named
tensors into them a bucket at a time and yields a small picklable
:class:`Message` per bucket; the messages travel over the application's
channel (a multiprocessing queue, Ray, ZMQ; :class:`Channel` wraps two
queues).  An engine (:class:`Receiver`) opens each buffer's IPC handle
once, on its own device (matched by GPU UUID), waits on the bucket's
interprocess CUDA event, copies into its own tensors (``load``), hands
them to its ``load_weights`` (``named_tensors``) or reads zero-copy views,
and returns an :class:`Ack`; a buffer is packed again only after the
receiver acknowledged it, and the sender waits, on the GPU, for the
receiver's reads to finish.

The layout of a sync is a *plan*, made once per layout (names, dtypes,
shapes, casts) and kept while it holds: while the receiver knows the
plan, a bucket's message carries no per-tensor data, and tensors that
share their memory (tied weights) are sent once.

Only classic CUDA IPC is used (``cudaIpcGetMemHandle``, no
``pidfd_getfd``), so it works where sharing memory in expandable segments
does not: containers without ptrace permission over the sender.

``import allocconf.transfer`` imports torch; ``import allocconf`` does not
import this module.
"""
from __future__ import annotations

import functools
import importlib
import operator
import os
import pickle
import queue
import select
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Sequence, Set, Tuple, Union)

import torch

import allocconf

__all__ = ["Entry", "Message", "Ack", "Sender", "Receiver", "Channel",
           "SyncResult", "TransferError", "plan",
           # the one-copy mode (allocconf/_onecopy.py)
           "Target", "TargetMap", "Offer", "Written", "Targets", "Writer"]

#: Byte alignment of every tensor in a buffer: enough for any dtype's
#: view and for vectorised copies.
ALIGN = 256

_cuda: Any = torch.cuda  # its Event is untyped


class TransferError(RuntimeError):
    """A sync could not complete: a peer that stayed silent past the
    timeout (dead, or stuck), a receiver that could not take a bucket, a
    message out of order.  Both sides stay usable: the sender after
    :meth:`Sender.abort`, the receiver after a sync that completes."""


@dataclass(frozen=True)
class Entry:
    """One tensor, or one piece of a tensor split across buckets."""

    name: str
    dtype: str               # torch dtype name as sent, e.g. "bfloat16"
    shape: Tuple[int, ...]
    offset: int              # bytes into the buffer
    nbytes: int              # bytes of this piece
    start: int = 0           # bytes into the tensor where the piece begins
    total: int = -1          # the tensor's bytes (-1: nbytes, unsplit)
    aliases: Tuple[str, ...] = ()  # other names of the same memory

    @property
    def whole(self) -> bool:
        """The piece is the whole tensor."""
        return self.start == 0 and self.nbytes == self.size

    @property
    def size(self) -> int:
        """The whole tensor's bytes."""
        return self.nbytes if self.total < 0 else self.total

    @property
    def ends(self) -> bool:
        """The piece is the tensor's last."""
        return self.start + self.nbytes == self.size


@dataclass(frozen=True)
class Message:
    """What the sender yields for one bucket: picklable, a few hundred
    bytes.  ``entries`` is None once the receiver knows the plan."""

    sender: str              # the Sender's id, to cache buffers by
    sync: int                # which sync, from 1
    seq: int                 # the bucket's index within the sync
    buffer: int              # which of the sender's buffers holds it
    last: bool               # the sync's last bucket
    handle: Any              # the buffer's IPC handle (reduce_tensor's)
    event: bytes             # interprocess event recorded after packing
    device: str              # the sender's GPU, by UUID
    plan: str                # the plan this bucket belongs to
    entries: Optional[Tuple[Entry, ...]] = None
    kind: str = "bucket"     # "bucket"; "abort": the sync ended early;
    #                          "close": the sender is gone


@dataclass(frozen=True)
class Ack:
    """The receiver's word that it is done with a bucket's buffer, or,
    with ``error``, that it could not take it."""

    sender: str
    sync: int
    seq: int
    buffer: int
    event: bytes             # recorded after the receiver's reads
    error: Optional[str] = None


@dataclass(frozen=True)
class SyncResult:
    """What :meth:`Receiver.serve` (or :meth:`Targets.serve`) took: the
    sync's number, whether it arrived whole, its buckets and tensors."""

    sync: int
    complete: bool
    buckets: int
    tensors: int
    error: Optional[str] = None  # one-copy: why the trainer's write failed


def _align(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class _Layout:
    """Where tensors go, bucket after bucket, in buffers of `capacity`
    bytes: each at an ALIGN-ed offset; one that does not fit in what is
    left of a bucket starts the next; one larger than a whole buffer is
    split into pieces, the first at the start of a bucket."""

    def __init__(self, capacity: int, fill: int = 0, count: int = 0) -> None:
        if (not isinstance(capacity, int) or isinstance(capacity, bool)
                or capacity < ALIGN):
            raise ValueError(f"allocconf.transfer: capacity must be an int "
                             f"of at least {ALIGN} bytes, got {capacity!r}")
        self.capacity = capacity
        self.fill = fill    # bytes used in the current bucket
        self.count = count  # entries in it

    def place(self, name: str, dtype: str, shape: Tuple[int, ...],
              nbytes: int, aliases: Tuple[str, ...] = (), itemsize: int = 1
              ) -> Iterator[Optional[Entry]]:
        """Yield the tensor's entries, and None wherever a new bucket
        begins before the next one.  A piece holds whole elements of
        `itemsize` bytes."""
        start = 0
        while True:
            left = nbytes - start
            off = _align(self.fill)
            if left > self.capacity - off and self.count:
                yield None
                self.fill = self.count = off = 0
            piece = min(left, (self.capacity - off) // itemsize * itemsize)
            yield Entry(name, dtype, shape, off, piece, start,
                        -1 if piece == nbytes else nbytes, aliases)
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


@functools.lru_cache(maxsize=None)
def _itemsize(d: torch.dtype) -> int:
    return torch.empty((), dtype=d).element_size()


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def _check(name: Any, t: Any, device: torch.device,
           where: str = "this sender's buffers") -> None:
    """A clear error for what cannot be packed, naming it."""
    if not isinstance(name, str):
        raise TypeError(f"allocconf.transfer: names must be str, got "
                        f"{type(name).__name__} {name!r}")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"allocconf.transfer: {name!r} is a "
                        f"{type(t).__name__}, not a tensor")
    if t.device != device:
        raise ValueError(f"allocconf.transfer: {name!r} is on {t.device}; "
                         f"{where} are on {device}")
    if not t.is_contiguous():
        raise ValueError(
            f"allocconf.transfer: {name!r} is not contiguous (shape "
            f"{list(t.shape)}, stride {list(t.stride())}); pass "
            f"t.contiguous()")


def _casts(cast: Optional[Mapping[torch.dtype, torch.dtype]]
           ) -> Dict[torch.dtype, torch.dtype]:
    """`cast` (a dtype to the one to send it as) checked, as a dict."""
    casts = dict(cast or {})
    for a, b in casts.items():
        if not (isinstance(a, torch.dtype) and isinstance(b, torch.dtype)):
            raise TypeError(f"allocconf.transfer: cast maps dtypes to "
                            f"dtypes, got {a!r}: {b!r}")
    return casts


def _piece(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    return buf[e.offset:e.offset + e.nbytes]


def _bytes_of(t: torch.Tensor, e: Entry) -> torch.Tensor:
    """The bytes of contiguous `t` that entry `e` carries (all of them,
    or one piece of a tensor split across buckets), as a uint8 view."""
    raw = _as_bytes(t)
    return raw if e.whole else raw[e.start:e.start + e.nbytes]


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def _wide(nbytes: int, address: int) -> torch.dtype:
    """The widest integer dtype that tiles `nbytes` bytes at `address`."""
    for width, dtype in _WIDE:
        if nbytes % width == 0 and address % width == 0:
            return dtype
    return torch.uint8


class _Program:
    """The copies of one bucket between a buffer and its tensors, bit for
    bit, in as few launches as the layout allows; made once and run every
    sync that has the same entries and tensors (docs/design.md, "How the
    transfer copies").

    * A *run*: consecutive pieces that tile as int64 (size and both
      addresses multiples of 8), the alignment gaps between them
      included, is one launch: into the buffer one ``torch.cat(out=)``
      (the gaps filled from a zero tensor), out of it one
      ``torch.split_with_sizes_copy(out=)`` (the gaps into a sink).  Both
      kernels copy near memcpy speed where ``_foreach_copy_`` reaches
      two thirds of it and a ``copy_`` per tensor is bound by its launch
      (benchmarks/copy_methods.py, docs/benchmarks.md).  A run of one
      piece is a ``copy_`` (a memcpy).
    * A piece that does not tile as int64 goes in one ``_foreach_copy_``
      as the widest integers that tile it, never as its dtype: that
      kernel rounds through float and would rewrite NaN payloads.
    * A piece sent in another dtype than its tensor's (a cast) is copied
      typed, which converts as ``Tensor.to`` does: at least BIG bytes
      with its own ``copy_``, smaller ones in one ``_foreach_copy_``.

    The program holds its views of both sides (so the tensors it copies
    stay allocated while it is kept).  With `capture` (``_Cuda.graph``),
    a program kept to be run again is captured once in a CUDA graph and
    replayed: its launches cost a few microseconds instead of about 0.5
    us per tensor.  Only programs into a buffer are captured: ``cat``
    passes its tensors' addresses in the kernel's parameters, where
    ``split_with_sizes_copy`` stages them through pinned host memory,
    which a replay would read after torch reused it (a receiver's kept
    copies are :class:`_Lanes` instead)."""

    BIG = 32 << 20   # bytes: a typed copy_ here is bound by the GPU
    RUNS = True      # False: no runs (the tests' second route)

    def __init__(self, buf: torch.Tensor,
                 pairs: Sequence[Tuple[Entry, torch.Tensor]],
                 into_buffer: bool,
                 capture: Optional[Callable[[Sequence[Callable[[], None]]],
                                            Optional[Callable[[], None]]]]
                 = None) -> None:
        self.into_buffer = into_buffer
        # each run: (the buffer's span as int64, pieces in order, sizes)
        self.runs: List[Tuple[torch.Tensor, List[torch.Tensor],
                              List[int]]] = []
        self.each: List[Tuple[torch.Tensor, torch.Tensor]] = []  # dst, src
        self.small: Tuple[List[torch.Tensor], List[torch.Tensor]] = ([], [])
        run: List[Tuple[Entry, torch.Tensor]] = []
        for e, t in pairs:
            if not e.nbytes:
                continue
            if _dtype_name(t.dtype) != e.dtype:  # a cast
                run = self._end(buf, run)
                self._typed(buf, e, t)
                continue
            raw = _bytes_of(t, e)
            if (self.RUNS and e.nbytes % 8 == 0 and e.offset % 8 == 0
                    and raw.data_ptr() % 8 == 0):
                if run and e.offset < run[-1][0].offset + run[-1][0].nbytes:
                    run = self._end(buf, run)  # the same piece again (tied)
                run.append((e, raw.view(torch.int64)))
                continue
            run = self._end(buf, run)
            dtype = _wide(e.nbytes, raw.data_ptr())
            theirs = _piece(buf, e).view(dtype)
            mine = raw.view(dtype)
            self._queue(theirs, mine, False)
        self._end(buf, run)
        self.replay = (capture([self._eager])
                       if capture is not None and into_buffer else None)

    def _queue(self, theirs: torch.Tensor, mine: torch.Tensor,
               alone: bool) -> None:
        dst, src = (theirs, mine) if self.into_buffer else (mine, theirs)
        if alone:
            self.each.append((dst, src))
        else:
            self.small[0].append(dst)
            self.small[1].append(src)

    def _typed(self, buf: torch.Tensor, e: Entry, t: torch.Tensor) -> None:
        sent = _dtype(e.dtype)
        theirs = _piece(buf, e).view(sent)
        if e.whole:
            theirs, mine = theirs.view(e.shape), t
        else:  # a piece holds whole elements (_Layout.place)
            size = _itemsize(sent)
            mine = t.reshape(-1)[e.start // size:
                                 (e.start + e.nbytes) // size]
        self._queue(theirs, mine, e.nbytes >= self.BIG)

    def _end(self, buf: torch.Tensor, run: List[Tuple[Entry, torch.Tensor]]
             ) -> List[Tuple[Entry, torch.Tensor]]:
        """Close `run`: its pieces and the gaps between them, one span."""
        if not run:
            return run
        first, last = run[0][0], run[-1][0]
        span = buf[first.offset:last.offset + last.nbytes].view(torch.int64)
        if len(run) == 1:
            self._queue(span, run[0][1], True)
            return []
        pieces: List[torch.Tensor] = []
        end = first.offset
        gaps = sum(e.offset - (p.offset + p.nbytes)
                   for (p, _), (e, _) in zip(run, run[1:]))
        filler = torch.zeros(gaps // 8, dtype=torch.int64,
                             device=buf.device)
        used = 0
        for e, mine in run:
            gap = (e.offset - end) // 8
            if gap:  # the alignment gap: zeros in, into the sink out
                pieces.append(filler[used:used + gap])
                used += gap
            pieces.append(mine)
            end = e.offset + e.nbytes
        self.runs.append((span, pieces, [p.numel() for p in pieces]))
        return []

    def run(self) -> None:
        """Queue the copies on the current stream."""
        if self.replay is not None:
            self.replay()
        else:
            self._eager()

    def _eager(self) -> None:
        with torch.no_grad():  # a model's parameters may require grad
            for span, pieces, sizes in self.runs:
                if self.into_buffer:
                    torch.cat(pieces, out=span)
                else:
                    torch.split_with_sizes_copy(span, sizes, out=pieces)
            for dst, src in self.each:
                dst.copy_(src)
            if self.small[0]:
                torch._foreach_copy_(self.small[0], self.small[1])


# One copy of a lane: ("one", dst, src) or ("each", dsts, srcs)
_Copy = Tuple[str, Any, Any]


def _lane(copies: Sequence[_Copy]) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():  # a model's parameters may require grad
            for kind, dst, src in copies:
                if kind == "one":
                    dst.copy_(src)
                else:
                    torch._foreach_copy_(dst, src)
    return run


class _Lanes:
    """Copies from tensors straight into other tensors (neither side one
    flat buffer), made once and run as often as asked (docs/design.md,
    "One copy, into the engine's weights"): a copy of at least `small`
    bytes is its own ``copy_`` (a memcpy, or a cast); smaller ones go
    together in one ``_foreach_copy_`` per kind, as the widest integers
    that tile them when uncast (bit for bit: never through float).  The
    copies are dealt to `branches` lanes, heaviest first to the least
    loaded, and with `graph` captured as one CUDA graph of parallel
    branches where the ops can (``_Cuda.graph``); else the lanes run one
    after another.  The one-copy mode's writes, and a receiver's copies
    out of a buffer into the targets bound to it."""

    SMALL = 1 << 20  # bytes: smaller copies are batched
    BRANCHES = 4     # parallel lanes of the captured copies

    def __init__(self, pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                 ops: Any, graph: bool = True, small: int = SMALL,
                 branches: int = BRANCHES) -> None:
        items: List[Tuple[int, _Copy]] = []
        groups: Dict[Tuple[Any, Any], Tuple[List[torch.Tensor],
                                            List[torch.Tensor], List[int]]] = {}
        for dst, src in pairs:
            # A tensor of its own over the source's memory: it stays
            # allocated while the copies are kept, even if the source is
            # given new memory (.data =) before they are run again.
            src = src.detach()
            nbytes = dst.numel() * dst.element_size()
            if nbytes >= small:
                items.append((nbytes, ("one", dst, src)))
                continue
            if dst.dtype == src.dtype:
                wide = _wide(nbytes, dst.data_ptr() | src.data_ptr())
                dst, src = _as_bytes(dst).view(wide), _as_bytes(src).view(wide)
            else:
                dst, src = dst.reshape(-1), src.reshape(-1)
            g = groups.setdefault((dst.dtype, src.dtype), ([], [], [0]))
            g[0].append(dst)
            g[1].append(src)
            g[2][0] += nbytes
        for dsts, srcs, size in groups.values():
            # A batched launch moves its bytes slower than a memcpy: weigh
            # it double when dealing.
            items.append((2 * size[0], ("each", dsts, srcs)))
        items.sort(key=lambda item: -item[0])
        loads = [0] * max(1, branches)
        lanes: List[List[_Copy]] = [[] for _ in loads]
        for weight, copy in items:
            i = loads.index(min(loads))
            loads[i] += weight
            lanes[i].append(copy)
        self.lanes_of = [lane for lane in lanes if lane]
        self.lanes = [_lane(lane) for lane in self.lanes_of]
        capture = getattr(ops, "graph", None) if graph else None
        self.replay = (capture(self.lanes)
                       if capture is not None and self.lanes else None)

    @property
    def graphed(self) -> bool:
        return self.replay is not None

    def run(self) -> None:
        """Queue the copies on the current stream."""
        if self.replay is not None:
            self.replay()
        else:
            for lane in self.lanes:
                lane()


class _Cuda:
    """CUDA: buffers in classic memory, shared by cudaIpcGetMemHandle,
    ordered by interprocess events recorded and waited for on the current
    stream."""

    def __init__(self, device: Optional[int]) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("allocconf.transfer: no CUDA device")
        self.device = (torch.cuda.current_device() if device is None
                       else int(device))
        self.torch_device = torch.device("cuda", self.device)
        self.uuid = self.uuid_of(self.device)
        self._events: Dict[Tuple[int, bytes], Any] = {}
        self._local: Dict[str, int] = {}  # GPU UUID -> index here
        self._branches: List[Any] = []  # streams of captured graphs

    @staticmethod
    def uuid_of(index: int) -> str:
        return str(torch.cuda.get_device_properties(index).uuid)

    def local(self, uuid_: str) -> int:
        """The index, in this process, of the GPU with UUID `uuid_`."""
        got = self._local.get(uuid_)
        if got is not None:
            return got
        for i in range(torch.cuda.device_count()):
            if self.uuid_of(i) == uuid_:
                self._local[uuid_] = i
                return i
        raise TransferError(
            f"allocconf.transfer: the sender's GPU ({uuid_}) is not among "
            f"the {torch.cuda.device_count()} this process sees "
            f"(CUDA_VISIBLE_DEVICES); CUDA IPC needs the same GPU")

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

    def open(self, handle: Any, device: int) -> torch.Tensor:
        """The sender's buffer, opened on this process's `device` (its
        own index for the sender's GPU)."""
        rebuild, args = handle
        args = args[:6] + (device,) + args[7:]  # storage_device
        t: torch.Tensor = rebuild(*args)
        return t

    def event(self) -> Tuple[Any, bytes]:
        ev = _cuda.Event(interprocess=True)
        ev.record(torch.cuda.current_stream(self.device))  # a valid handle
        return ev, bytes(ev.ipc_handle())

    def record(self, ev: Any) -> None:
        ev.record(torch.cuda.current_stream(self.device))

    def wait(self, handle: bytes, device: Optional[int] = None) -> None:
        """The current stream of `device` (this Sender's or Receiver's by
        default) waits for the interprocess event `handle`."""
        device = self.device if device is None else device
        ev = self._events.get((device, handle))
        if ev is None:
            ev = _cuda.Event.from_ipc_handle(device, handle)
            self._events[(device, handle)] = ev
        torch.cuda.current_stream(device).wait_event(ev)

    def forget(self, handles: Iterable[bytes]) -> None:
        """Drop the events opened from these handles."""
        gone = set(handles)
        for k in [k for k in self._events if k[1] in gone]:
            del self._events[k]

    def capable(self, t: torch.Tensor) -> bool:
        """Whether classic CUDA IPC can share `t`'s memory (the one-copy
        mode's targets)."""
        return allocconf.ipc_capable(t)

    def graph(self, branches: Sequence[Callable[[], None]]
              ) -> Optional[Callable[[], None]]:
        """`branches` captured once as parallel branches of one CUDA
        graph; its replay (on the current stream), or None where capture
        failed (the caller runs them eagerly instead).  Captured with
        ``capture_begin(capture_error_mode="thread_local")`` on a side
        stream: the ``torch.cuda.graph`` context would synchronise,
        collect garbage and empty the cache (docs/design.md)."""
        while len(self._branches) < len(branches):
            self._branches.append(_cuda.Stream(self.device))
        g = _cuda.CUDAGraph()
        side = self._branches[0]
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        try:
            with _cuda.stream(side):
                g.capture_begin(capture_error_mode="thread_local")
                try:
                    rest = self._branches[1:len(branches)]
                    for stream, fn in zip(rest, branches[1:]):
                        stream.wait_stream(side)
                        with _cuda.stream(stream):
                            fn()
                    branches[0]()
                    for stream in rest:
                        side.wait_stream(stream)
                finally:
                    g.capture_end()
        except Exception:
            return None
        current.wait_stream(side)
        replay: Callable[[], None] = g.replay
        return replay


class Channel:
    """Messages one way and answers the other, over two queues: anything
    with ``put(obj)`` and ``get(timeout=seconds)`` that raises an
    exception named ``Empty`` when nothing came (``queue.Queue``,
    ``multiprocessing`` queues, Ray's ``ray.util.queue.Queue``).  The
    trainer's is ``Channel(to_engine, from_engine)``, the engine's
    ``Channel(from_engine, to_engine)``.  :meth:`pipes` makes the two ends
    of one over pipes, for an engine in a child process."""

    def __init__(self, outbox: Any, inbox: Any) -> None:
        self.outbox = outbox
        self.inbox = inbox

    @classmethod
    def pipes(cls, timeout: float = 60.0, *, spin: float = 0.002
              ) -> Tuple["Channel", "Channel"]:
        """The two ends of a channel over two one-way pipes, for a peer
        in a child process (give it the second end as an argument of its
        ``Process``; they do not go through Ray).  A message is pickled
        and written in the caller's thread, so it leaves at once: a
        ``multiprocessing`` queue hands it to a feeder thread, which
        waits for the GIL while the caller runs Python (its bytes can
        arrive milliseconds late; benchmarks/channel_latency.py).  A
        write waits at most `timeout` seconds for the peer to make room
        (a message over the pipe's 64 KiB waits for the peer to read it);
        a peer that exited, its end closed, raises TransferError at once
        instead of after the timeout: call :meth:`close` on the child's
        end in the parent once the child has started, so that the parent
        holds no copy of it.

        A get polls the pipe for up to `spin` seconds before it sleeps
        (0: sleeps at once): a peer that answers within it is seen
        without a wake-up through the kernel, which costs each side tens
        of microseconds in a VM (docs/design.md, "Channels"); a wait
        longer than `spin` costs that much CPU time more."""
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                or not timeout > 0):
            raise ValueError(f"allocconf.transfer: timeout must be a "
                             f"number of seconds > 0, got {timeout!r}")
        if (not isinstance(spin, (int, float)) or isinstance(spin, bool)
                or not 0 <= spin <= 1):
            raise ValueError(f"allocconf.transfer: spin must be a number "
                             f"of seconds from 0 to 1, got {spin!r}")
        import multiprocessing
        a_in, b_out = multiprocessing.Pipe(duplex=False)  # (read, write)
        b_in, a_out = multiprocessing.Pipe(duplex=False)
        t, w = float(timeout), float(spin)
        return (cls(_Pipe(a_out, t), _Pipe(a_in, t, w)),
                cls(_Pipe(b_out, t), _Pipe(b_in, t, w)))

    def close(self) -> None:
        """Close this end where it is a pipe end (:meth:`pipes`); a
        channel over the application's queues leaves them be."""
        for box in (self.outbox, self.inbox):
            if getattr(box, "_pipe", False):  # a _Pipe, reloaded or not
                box.close()

    def put(self, obj: Any) -> None:
        self.outbox.put(obj)

    def get(self, timeout: Optional[float]) -> Any:
        try:
            return self.inbox.get(timeout=timeout)
        except Exception as exc:
            # queue.Empty, and Ray's (raised through a RayTaskError that
            # subclasses it).
            if any(c.__name__ == "Empty" for c in type(exc).__mro__):
                raise TransferError(
                    f"allocconf.transfer: nothing came from the peer "
                    f"within {timeout} s (dead, or stuck)") from None
            raise


_FRAME = struct.Struct("<Q")  # a pipe message: its length, then its bytes


class _Pipe:
    """One way of a :meth:`Channel.pipes` channel: one end of a one-way
    ``multiprocessing`` pipe (picklable to a child process), its file
    descriptor used non-blocking so that every wait is bounded.  Each
    message is its length (8 bytes) and its pickle (``ForkingPickler``,
    as a ``multiprocessing`` queue pickles: torch's reductions apply),
    written in one system call where the pipe has room and read in one
    where it holds the message whole (a hand-over's floor is the peer's
    wake-up; each call more costs several microseconds in a VM).
    A write or read cut short (the peer stopped reading, or died
    mid-message) leaves the pipe out of step: the end is then broken and
    refuses to be used again.  One lock per end: threads may share it."""

    _pipe = True

    def __init__(self, conn: Any, timeout: float, spin: float = 0.0) -> None:
        self.__setstate__({"conn": conn, "timeout": timeout, "spin": spin})

    def __getstate__(self) -> Dict[str, Any]:
        return {"conn": self._conn, "timeout": self._timeout,
                "spin": self._spin}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._conn = state["conn"]
        self._timeout: float = state["timeout"]
        self._spin: float = state.get("spin", 0.0)  # the read end's
        self._lock = threading.Lock()
        self._ready = False    # its descriptor made non-blocking here
        self._broken: Optional[str] = None
        self._rest = bytearray()  # bytes read past the last message

    def _fd(self) -> int:
        if self._broken is not None:
            raise TransferError(f"allocconf.transfer: this channel is "
                                f"broken ({self._broken}); make a new one")
        if self._conn.closed:
            raise RuntimeError("allocconf.transfer: this channel end is "
                               "closed")
        fd: int = self._conn.fileno()
        if not self._ready:
            os.set_blocking(fd, False)
            self._ready = True
        return fd

    def _cut(self, why: str) -> TransferError:
        self._broken = why
        return TransferError(f"allocconf.transfer: {why}")

    def put(self, obj: Any) -> None:
        from multiprocessing.reduction import ForkingPickler
        data = ForkingPickler.dumps(obj)  # before anything is written
        with self._lock:
            fd = self._fd()
            view = memoryview(_FRAME.pack(len(data)) + bytes(data))
            while view:
                try:
                    view = view[os.write(fd, view):]
                    continue
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    raise self._cut("the peer closed the channel (it "
                                    "exited, or closed its end)") from None
                if not select.select([], [fd], [], self._timeout)[1]:
                    raise self._cut(f"the peer read nothing for "
                                    f"{self._timeout} s (stuck) while a "
                                    f"message was written")

    def get(self, timeout: Optional[float] = None) -> Any:
        with self._lock:
            fd = self._fd()
            head = self._read(fd, _FRAME.size, timeout)
            (n,) = _FRAME.unpack(head)
            return pickle.loads(self._read(fd, n, self._timeout, True))

    def _read(self, fd: int, n: int, timeout: Optional[float],
              begun: bool = False) -> bytes:
        """`n` bytes; none within `timeout` seconds at the start of a
        message raises queue.Empty (Channel.get's TransferError).  Each
        read takes what the pipe holds, up to 64 KiB: a message's length
        and its bytes in one system call, what follows kept for the next
        read."""
        got = self._rest
        deadline = None if timeout is None else time.monotonic() + timeout
        polls = None  # until when an empty pipe is polled, not slept on
        while len(got) < n:
            try:
                chunk = os.read(fd, max(n - len(got), 1 << 16))
            except BlockingIOError:
                now = time.monotonic()
                if polls is None:
                    polls = now + self._spin
                    if deadline is not None:
                        polls = min(polls, deadline)
                if now < polls:
                    continue
                left = (None if deadline is None
                        else max(0.0, deadline - now))
                if select.select([fd], [], [], left)[0]:
                    continue
                if not got and not begun:
                    raise queue.Empty from None
                raise self._cut(f"a message stopped coming part-way "
                                f"({len(got)} of {n} bytes in "
                                f"{timeout} s)") from None
            if not chunk:
                raise self._cut("the peer closed the channel (it exited, "
                                "or closed its end)")
            got += chunk
            # Once a message has begun, each wait counts from the last
            # bytes that came.
            deadline = time.monotonic() + self._timeout
        self._rest = got[n:]
        return bytes(got[:n])

    def close(self) -> None:
        self._conn.close()


# ---------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------

# A tensor's key in a plan: (name, dtype as given, dtype as sent, shape,
# the name whose memory it shares or None, its own other names).
_Key = Tuple[str, torch.dtype, torch.dtype, Tuple[int, ...], Optional[str],
             Tuple[str, ...]]


class _Plan:
    """The sender's record of one layout: for each tensor its key, its
    pieces (each with whether a bucket ends before it), and the layout's
    state before it, so that a sync that stops following the plan goes on
    from there."""

    def __init__(self, capacity: int) -> None:
        self.id = uuid.uuid4().hex
        self.capacity = capacity
        self.keys: List[_Key] = []
        self.pieces: List[List[Tuple[bool, Entry]]] = []
        self.before: List[Tuple[int, int]] = []
        self.known = False  # the receiver holds every bucket of it

    def place(self, layout: _Layout, key: _Key,
              numel: int) -> List[Tuple[bool, Entry]]:
        """Lay one more tensor out, with `layout` where the plan ends."""
        name, given, sent, shape, alias, aliases = key
        self.before.append((layout.fill, layout.count))
        self.keys.append(key)
        pieces: List[Tuple[bool, Entry]] = []
        if alias is None:  # a tied name is sent under its first
            brk = False
            for e in layout.place(name, _dtype_name(sent), shape,
                                  numel * _itemsize(sent), aliases,
                                  _itemsize(sent)):
                if e is None:
                    brk = True
                    continue
                pieces.append((brk, e))
                brk = False
        self.pieces.append(pieces)
        return pieces

    def prefix(self, index: int, entries: List[Entry]) -> Tuple["_Plan",
                                                                 _Layout]:
        """A new plan that starts as this one's first `index` tensors, and
        the layout's state there (`entries`: the bucket being packed)."""
        new = _Plan(self.capacity)
        new.keys = self.keys[:index]
        new.pieces = self.pieces[:index]
        new.before = self.before[:index]
        if index < len(self.before):
            fill, count = self.before[index]
        else:  # after the last tensor: where the bucket ends
            fill = entries[-1].offset + entries[-1].nbytes if entries else 0
            count = len(entries)
        return new, _Layout(self.capacity, fill, count)


def _aliases(tensors: Mapping[str, Any]
             ) -> Tuple[Dict[str, str], Dict[str, Tuple[str, ...]]]:
    """The tied names of a state dict: which name each shares its memory
    with (the first name of that memory), and each first name's others."""
    first: Dict[Tuple[int, Any, Tuple[int, ...]], str] = {}
    alias_of: Dict[str, str] = {}
    others: Dict[str, Tuple[str, ...]] = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.numel():
            mem = (t.data_ptr(), t.dtype, tuple(t.shape))
            f = first.setdefault(mem, name)
            if f != name:
                alias_of[name] = f
                others[f] = others.get(f, ()) + (name,)
    return alias_of, others


class _Sync:
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


# torch's own check of many tensors' addresses in one call (the CUDA
# build's; its CUDA graph trees check their inputs with it): a loop in
# C++ where ``t.data_ptr()`` per tensor is a Python call each.
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_STRIDE = torch.Tensor.stride


def _tensor_guards() -> Any:
    """torch's check of many tensors' dtypes, devices, shapes and strides
    in one call, a loop in C++ (TorchDynamo guards its compiled frames'
    tensor inputs with it: ``torch._C._dynamo.guards.TensorGuards``), or
    None where this torch has none that answers as it should.  Both
    keywords are always passed: without them its constructor crashes."""
    try:
        from torch._C._dynamo import guards
        # Any: its stub's signature is not the constructor's (CI's mypy
        # refuses the call it types; the call below is how torch makes it)
        cls: Any = getattr(guards, "TensorGuards")
        a, b = torch.empty(2), torch.empty(2, dtype=torch.float64)
        g = cls(a, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        if g.check(a) is True and g.check(b) is False:
            return cls
    except Exception:
        pass
    return None


_TENSOR_GUARDS = _tensor_guards()


class _Sources:
    """The tensors of a state dict as they were when a sync was made of
    them (each with its address, dtype, shape and strides then), and the
    casts: a later sync of the same tensors, unchanged, is made the same
    way."""

    def __init__(self, casts: Dict[torch.dtype, torch.dtype]) -> None:
        self.casts = casts
        self.names: List[str] = []
        self.tensors: List[torch.Tensor] = []
        self.ptrs: List[int] = []
        self.dtypes: List[torch.dtype] = []
        self.shapes: List[torch.Size] = []
        self.strides: List[Tuple[int, ...]] = []
        self._indices: List[int] = []
        # torch's one-call check of the tensors' metadata, made once they
        # passed the exact check (_tensor_guards).
        self._guard: Any = None

    def add(self, name: str, t: torch.Tensor) -> None:
        self.names.append(name)
        self.tensors.append(t)
        self.ptrs.append(t.data_ptr())
        self.dtypes.append(t.dtype)
        self.shapes.append(t.shape)
        self.strides.append(t.stride())

    def fits(self, tensors: Mapping[str, Any],
             casts: Dict[torch.dtype, torch.dtype]) -> bool:
        """As many tensors and the same casts: worth running the copies
        kept before :meth:`still` says whether they were right."""
        return casts == self.casts and len(tensors) == len(self.names)

    def still(self, tensors: Mapping[str, Any]) -> bool:
        """The same names and tensor objects, in order (cheap: no call on
        a tensor), each still at its address, with its dtype, shape and
        strides (``.data =``, ``resize_``, ``set_`` and in-place views
        change them in place).  The metadata is checked in one call by
        torch's guard where it has one; what the guard refuses (it also
        sees the thread's dispatch state, e.g. inference mode) is checked
        tensor by tensor, and guarded anew if it passes."""
        ts = self.tensors
        if not (list(tensors) == self.names
                and all(map(operator.is_, tensors.values(), ts))):
            return False
        if _PTRS_EQUAL is not None:
            if len(self._indices) != len(ts):
                self._indices = list(range(len(ts)))
            if not _PTRS_EQUAL(ts, self.ptrs, self._indices):
                return False
        elif list(map(torch.Tensor.data_ptr, ts)) != self.ptrs:
            return False
        g = self._guard
        if g is not None:
            try:
                if g.check(*ts) is True:
                    return True
            except Exception:
                pass
        if not (list(map(_DTYPE, ts)) == self.dtypes
                and list(map(_SHAPE, ts)) == self.shapes
                and list(map(_STRIDE, ts)) == self.strides):
            return False
        self._guard = None
        if _TENSOR_GUARDS is not None:
            try:
                self._guard = _TENSOR_GUARDS(*ts, dynamic_dims_sizes=None,
                                             dynamic_dims_strides=None)
            except Exception:
                pass
        return True


class _Replay(_Sources):
    """A state dict's sync, kept to be sent again as it was: its sources,
    the plan and its buckets (entries, sources, the sources' addresses).
    A sync of the same tensors, unchanged, reuses it all: no per-tensor
    work beyond checking them, and the copies made once."""

    def __init__(self, plan: "_Plan", casts: Dict[torch.dtype, torch.dtype]
                 ) -> None:
        super().__init__(casts)
        self.plan = plan
        self.buckets: List[Tuple[List[Entry],
                                 List[Tuple[Entry, torch.Tensor]],
                                 Tuple[int, ...]]] = []


class Sender:
    """The trainer's side: `buffers` reusable buffers of `capacity` bytes
    each, allocated once, inside ipc_safe(), on `device` (the current CUDA
    device by default).  `timeout` (seconds) bounds every wait for the
    receiver in :meth:`sync`."""

    def __init__(self, capacity: int = 1 << 30, buffers: int = 2, *,
                 device: Optional[int] = None, timeout: float = 60.0,
                 _ops: Any = None) -> None:
        if not isinstance(buffers, int) or buffers < 1:
            raise ValueError(f"allocconf.transfer: buffers must be an int "
                             f">= 1, got {buffers!r}")
        _Layout(capacity)  # validates it
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                or not timeout > 0):
            raise ValueError(f"allocconf.transfer: timeout must be a "
                             f"number of seconds > 0, got {timeout!r}")
        self.capacity = capacity
        self.timeout = float(timeout)
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
        # buffer -> the sources copied into it, held until it is packed
        # again (their copies are done by then: the receiver read them),
        # so that a source its owner frees stays valid until copied.
        self._held: Dict[int, List[Tuple[Entry, torch.Tensor]]] = {}
        self._sync = 0
        self._next = 0
        # (plan, bucket, buffer) -> (the sources' addresses, the copies)
        self._programs: Dict[Tuple[str, int, int],
                             Tuple[Tuple[int, ...], _Program]] = {}
        self._replay: Optional[_Replay] = None
        self._plan: Optional[_Plan] = None
        self._teaching: Optional[Tuple[int, _Plan]] = None
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
            raise ValueError(f"allocconf.transfer: {ack!r} is not an Ack "
                             f"for this sender ({self.id})")
        if ack.sync <= self._aborted:
            return  # a late answer about a sync given up: nothing to do
        held = self._pending.get(ack.buffer)
        if held != (ack.sync, ack.seq):
            raise ValueError(
                f"allocconf.transfer: Ack for sync {ack.sync} bucket "
                f"{ack.seq} in buffer {ack.buffer}, which holds "
                + (f"sync {held[0]} bucket {held[1]}" if held
                   else "nothing unacknowledged"))
        del self._pending[ack.buffer]
        self._after[ack.buffer] = ack.event
        if ack.error is not None:
            if self._plan is not None:
                self._plan.known = False  # teach it again next time
            self._teaching = None
            raise TransferError(f"allocconf.transfer: the receiver could "
                                f"not take sync {ack.sync} bucket "
                                f"{ack.seq}: {ack.error}")
        if (self._teaching is not None and self._teaching[0] == ack.sync
                and all(s != ack.sync for s, _ in self._pending.values())):
            # Every bucket of the sync that carried the whole plan is in.
            self._teaching[1].known = True
            self._teaching = None

    def _take(self, s: _Sync, receive_ack: Optional[Callable[[], Ack]]
              ) -> None:
        """The next buffer for sync `s`, once the receiver gave it back."""
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
        s.after = self._after.pop(b, None)  # the copies wait for it
        self._held.pop(b, None)
        s.buf = b

    def send(self, tensors: Union[Mapping[str, Any],
                                  Iterable[Tuple[str, Any]]], *,
             receive_ack: Optional[Callable[[], Ack]] = None,
             cast: Optional[Mapping[torch.dtype, torch.dtype]] = None,
             eager: bool = False) -> Iterator[Message]:
        """Pack `tensors` (a state dict, or (name, tensor) pairs: a
        generator of gathered shards is consumed lazily) bucket after
        bucket; yield a Message for each.  When a buffer is still held by
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
            raise RuntimeError("allocconf.transfer: this Sender is closed")
        casts = _casts(cast)
        self._sync += 1
        s = _Sync(self._sync)
        try:
            r = self._replay
            if (isinstance(tensors, Mapping) and not eager and r is not None
                    and r.plan is self._plan and r.fits(tensors, casts)):
                # The first bucket's copies are queued before the check
                # (whether these are the tensors they were made of,
                # unchanged), from memory their program holds, so that
                # the check runs while the device copies; a failed check
                # sends nothing of them (the tensor by tensor path packs
                # that buffer again, after them in stream order).
                last = len(r.buckets) - 1
                for seq, (entries, pairs, sig) in enumerate(r.buckets):
                    self._take(s, receive_ack)
                    assert s.buf is not None
                    if seq == 0:
                        made = self._programs.get((r.plan.id, 0, s.buf))
                        early = made is not None and made[0] == sig
                        if not (early or r.still(tensors)):
                            break  # no copy made: the tensors changed
                    s.entries, s.pairs = list(entries), pairs
                    self._pack(s, r.plan, sig)
                    if seq == 0 and early and not r.still(tensors):
                        break
                    yield self._message(s, seq == last, r.plan)
                else:
                    return
                assert s.buf is not None
                self._next = s.buf  # packed again tensor by tensor
                if s.after is not None:  # not yet waited for
                    self._after[s.buf] = s.after
                s = _Sync(s.sync)
            self._replay = None
            yield from self._send(tensors, receive_ack, casts, eager, s)
        finally:
            if s.buf is not None and s.buf not in self._pending:
                # Taken but never sent (the source raised, or the caller
                # stopped): free again, nothing for the receiver to ack.
                self._next = s.buf
                if s.after is not None:
                    self._after[s.buf] = s.after

    def _send(self, tensors: Union[Mapping[str, Any],
                                   Iterable[Tuple[str, Any]]],
              receive_ack: Optional[Callable[[], Ack]],
              casts: Dict[torch.dtype, torch.dtype], eager: bool,
              s: _Sync) -> Iterator[Message]:
        """send() tensor by tensor: following the last plan while the
        tensors match it, making a new one from where they do not."""
        items: Iterator[Tuple[str, Any]]
        if isinstance(tensors, Mapping):
            mapping = True
            alias_of, others = _aliases(tensors)
            items = iter(tensors.items())
        else:
            mapping = False
            alias_of, others = {}, {}
            items = iter(tensors)
        old = self._plan
        p = old if old is not None and old.capacity == self.capacity else None
        follow = p is not None
        if p is None:
            p = _Plan(self.capacity)
        # A state dict's sync is kept to be replayed (see send()).
        replay = _Replay(p, casts) if mapping and not eager else None
        layout: Optional[_Layout] = None if follow else _Layout(self.capacity)
        device = self._ops.torch_device
        index = 0
        for name, item in items:
            _check(name, item, device)
            t: torch.Tensor = item
            key: _Key = (name, t.dtype, casts.get(t.dtype, t.dtype),
                         tuple(t.shape), alias_of.get(name),
                         others.get(name, ()))
            if follow and not (index < len(p.keys) and p.keys[index] == key):
                follow = False  # the layout changed: a new plan here
                p, layout = p.prefix(index, s.entries)
                s.whole = False
                if replay is not None:
                    replay.plan = p
            if follow:
                pieces = p.pieces[index]
            else:
                assert layout is not None
                pieces = p.place(layout, key, t.numel())
            index += 1
            if replay is not None:
                replay.add(name, t)
            if not mapping and t.numel():
                if t.data_ptr() in s.ptrs:
                    raise ValueError(
                        f"allocconf.transfer: {name!r} is at the address "
                        f"of an earlier tensor whose copy has not run: a "
                        f"source that refills one tensor must be sent "
                        f"with eager=True (tied tensors are sent once "
                        f"from a state dict)")
                s.ptrs.add(t.data_ptr())
            for brk, e in pieces:
                if brk:
                    yield self._flush(s, False, p, replay)
                if s.buf is None:
                    self._take(s, receive_ack)
                s.entries.append(e)
                s.pairs.append((e, t))
            if eager:
                self._run(s)
        if follow and index != len(p.keys):
            p, layout = p.prefix(index, s.entries)  # fewer tensors
            s.whole = False
            if replay is not None:
                replay.plan = p
        if s.buf is None:
            self._take(s, receive_ack)  # an empty sync still says so
        self._plan = p
        yield self._flush(s, True, p, replay)
        self._replay = replay

    def _program(self, s: _Sync, p: _Plan,
                 sig: Optional[Tuple[int, ...]]) -> _Program:
        """The copies of the bucket being sent: made, or the ones made
        before for the same plan, bucket, buffer and sources (`sig`:
        their addresses; None: not kept for a replay)."""
        assert s.buf is not None
        if sig is None:
            return _Program(self._buffers[s.buf], s.pairs, True)
        key = (p.id, s.seq, s.buf)
        got = self._programs.get(key)
        if got is not None and got[0] == sig:
            return got[1]
        if got is None and any(k[0] != p.id for k in self._programs):
            self._programs.clear()  # another plan's: never used again
        # Kept to be run again: replayed from a CUDA graph where the ops
        # can capture it.
        prog = _Program(self._buffers[s.buf], s.pairs, True,
                        getattr(self._ops, "graph", None))
        self._programs[key] = (sig, prog)
        return prog

    def _run(self, s: _Sync, event: Any = None,
             program: Optional[_Program] = None) -> None:
        """Queue the bucket's copies on the current stream, after the
        sources' producers and the receiver's reads of the buffer, and
        record `event` after them; the work queued next (an optimizer
        step, a refill) runs after them in stream order.  (A copy stream
        of its own would order nothing more, since that work must wait
        for the copies anyway, and cost host time to enter and leave:
        docs/design.md.)  The sources are held with the buffer."""
        assert s.buf is not None
        if program is None and s.pairs:
            program = _Program(self._buffers[s.buf], s.pairs, True)
        if s.after is not None:
            self._ops.wait(s.after)
            s.after = None
        if program is not None:
            program.run()
        if event is not None:
            self._ops.record(event)
        self._held.setdefault(s.buf, []).extend(s.pairs)
        s.pairs, s.ptrs = [], set()

    def _pack(self, s: _Sync, p: _Plan,
              sig: Optional[Tuple[int, ...]] = None) -> None:
        """Run the bucket's copies and record its event; `sig`: see
        _program."""
        assert s.buf is not None
        program = self._program(s, p, sig) if s.pairs else None
        self._run(s, self._events[s.buf][0], program)

    def _message(self, s: _Sync, last: bool, p: _Plan) -> Message:
        """The bucket's Message; the buffer is the receiver's until its
        Ack."""
        assert s.buf is not None
        msg = Message(self.id, s.sync, s.seq, s.buf, last,
                      self._handles[s.buf], self._events[s.buf][1],
                      self._ops.uuid, p.id,
                      None if p.known else tuple(s.entries))
        if p.known:
            s.whole = False  # nothing to teach in this sync
        self._pending[s.buf] = (s.sync, s.seq)
        if last and s.whole:
            self._teaching = (s.sync, p)
        s.seq += 1
        s.buf, s.entries = None, []
        return msg

    def _flush(self, s: _Sync, last: bool, p: _Plan,
               replay: Optional[_Replay]) -> Message:
        """Pack the bucket and make its Message; with `replay`, recorded
        there and its copies kept."""
        sig = None
        if replay is not None:
            sig = tuple(t.data_ptr() for _, t in s.pairs)
            replay.buckets.append((s.entries, s.pairs, sig))
        self._pack(s, p, sig)
        return self._message(s, last, p)

    def drain(self, receive_ack: Union[Callable[[], Ack], Channel],
              timeout: Optional[float] = None) -> None:
        """Take Acks until every bucket sent has been acknowledged: from
        `receive_ack()`, or from a Channel (each wait bounded by
        `timeout` seconds, the Sender's by default)."""
        get = self._receiver(receive_ack, timeout)
        while self._pending:
            self.acknowledge(get())

    def _receiver(self, source: Union[Callable[[], Ack], Channel],
                  timeout: Optional[float]) -> Callable[[], Ack]:
        if not isinstance(source, Channel):
            return source
        wait = self.timeout if timeout is None else float(timeout)

        def receive_ack() -> Ack:
            ack: Ack = source.get(wait)
            return ack
        return receive_ack

    def sync(self, tensors: Union[Mapping[str, Any],
                                  Iterable[Tuple[str, Any]]],
             channel: Channel, *,
             cast: Optional[Mapping[torch.dtype, torch.dtype]] = None,
             eager: bool = False, timeout: Optional[float] = None,
             wait: bool = True) -> int:
        """One whole sync over `channel`: every bucket put and, with
        `wait`, every Ack taken; each wait for the receiver bounded by
        `timeout` seconds (the Sender's by default).  Returns the buckets
        sent.  A receiver that stays silent raises TransferError, as does
        one that could not take a bucket; on any error the sync is
        aborted (the receiver told, when it can hear) and the sender is
        usable again.

        ``wait=False`` returns once every bucket is sent, while the engine
        still reads them: the trainer may queue its next optimizer step
        at once (the GPU runs it after the copies out of its weights).
        The Acks are taken by the next sync, or by ``drain(channel)``.

        The buckets' messages are put once the sync's copies are all
        queued, or earlier where a buffer must come back from the
        receiver first, and each says to wait for every copy queued
        before it was put: where the sync fits the free buffers, the
        engine's reads begin after the trainer's last copy instead of
        sharing the GPU with it (two processes' kernels take turns on
        one GPU), so the trainer may step after one copy of its weights
        and the sync takes no longer (docs/design.md)."""
        get = self._receiver(channel, timeout)
        held: List[Message] = []

        def put_held() -> None:
            for msg in held[:-1]:  # the last one's event is the latest
                self._ops.record(self._events[msg.buffer][0])
            for msg in held:
                channel.put(msg)
            held.clear()

        def receive_ack() -> Ack:
            put_held()  # the receiver answers only what it was sent
            return get()

        sent = 0
        try:
            for msg in self.send(tensors, receive_ack=receive_ack,
                                 cast=cast, eager=eager):
                held.append(msg)
                sent += 1
            put_held()
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
        self._aborted = self._sync
        self._pending.clear()
        self._after.clear()
        self._held.clear()
        self._teaching = None
        if self._plan is not None:
            self._plan.known = False
        if channel is not None:
            self._notice(channel, "abort")

    def _notice(self, channel: Channel, kind: str) -> None:
        """Tell the receiver, if it can hear (a dead one cannot)."""
        ev, handle = self._events[0] if self._events else (None, b"")
        try:
            channel.put(Message(self.id, self._sync, -1, -1, True, None,
                                handle, self._ops.uuid, "", None, kind))
        except Exception:
            pass

    def close(self, channel: Optional[Channel] = None) -> None:
        """Free the buffers; with a channel, tell the receiver first, so
        that it lets go of its mappings of them."""
        if self._closed:
            return
        if channel is not None:
            self._notice(channel, "close")
        self._closed = True
        self._pending.clear()
        self._held.clear()
        self._programs.clear()
        self._replay = None
        self._buffers, self._handles, self._events = [], [], []


class _Bucket:
    """What a receiver keeps per (sender, plan, bucket, buffer): the
    bucket's entries, and the views or bound copies made for it."""

    def __init__(self, entries: Tuple[Entry, ...]) -> None:
        self.entries = entries
        self.views: Optional[List[Tuple[Entry, torch.Tensor]]] = None
        self.bound: Optional[_Lanes] = None


class Receiver:
    """The engine's side: opens each sender buffer's handle once (cached),
    on its own device for the sender's GPU (matched by UUID, whatever
    CUDA_VISIBLE_DEVICES numbers it), and for each Message waits on its
    event on the current stream.  It serves one sender at a time: the
    first message of a new one (a restarted trainer) makes it let go of
    the old one's buffers."""

    LIMIT = 1 << 12  # buckets kept (entries, views, copies) before a reset
    BRANCHES = _Lanes.BRANCHES  # parallel lanes of its bound copies' graph

    def __init__(self, device: Optional[int] = None, *,
                 _ops: Any = None) -> None:
        self._ops = _ops if _ops is not None else _Cuda(device)
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

    def _buffer(self, msg: Message) -> torch.Tensor:
        key = (msg.sender, msg.buffer)
        buf = self._buffers.get(key)
        if buf is None:
            for old in {s for s, _ in self._buffers} - {msg.sender}:
                self.forget(old)  # a new trainer: let go of the old one
            buf = self._buffers[key] = self._ops.open(
                msg.handle, self._ops.local(msg.device))
        return buf

    def _entries(self, msg: Message) -> Tuple[Entry, ...]:
        plan = self._plans.setdefault((msg.sender, msg.plan), {})
        if msg.entries is not None:
            plan[msg.seq] = msg.entries
            return msg.entries
        got = plan.get(msg.seq)
        if got is None:
            raise TransferError(
                f"allocconf.transfer: bucket {msg.seq} of plan {msg.plan} "
                f"(sender {msg.sender}) is not known here: this receiver "
                f"did not see the sync that carried it")
        return got

    def _bucket(self, msg: Message) -> _Bucket:
        if msg.kind != "bucket":
            raise ValueError(f"allocconf.transfer: a {msg.kind!r} message "
                             f"holds no bucket")
        self.sync = msg.sync
        entries = self._entries(msg)
        key = (msg.sender, msg.plan, msg.seq, msg.buffer)
        b = self._buckets.get(key)
        if b is None or b.entries is not entries:
            if len(self._buckets) >= self.LIMIT:
                self._buckets.clear()
            b = self._buckets[key] = _Bucket(entries)
        return b

    def _wait(self, msg: Message) -> None:
        self._ops.wait(msg.event, self._ops.local(msg.device))
        self._seen.setdefault(msg.sender, set()).add(msg.event)

    def _ack(self, msg: Message, error: Optional[str] = None) -> Ack:
        key = (msg.sender, msg.buffer)
        if key not in self._events:
            self._events[key] = self._ops.event()
        ev, handle = self._events[key]
        self._ops.record(ev)
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

    def views(self, msg: Message) -> Dict[str, torch.Tensor]:
        """Zero-copy views into the sender's buffer, by name (tied names
        each), valid until release(msg).  A tensor split across buckets
        has no view here: named_tensors() reassembles it."""
        b = self._bucket(msg)
        split = [e.name for e in b.entries if not e.whole]
        if split:
            raise ValueError(
                f"allocconf.transfer: {', '.join(map(repr, split))} "
                f"{'is' if len(split) == 1 else 'are'} split across "
                f"buckets (larger than a buffer); use named_tensors(msg) or "
                f"load(msg, into=...)")
        out = dict(self._views_of(msg, b))
        self._wait(msg)
        return out

    def _views_of(self, msg: Message,
                  b: _Bucket) -> List[Tuple[str, torch.Tensor]]:
        if b.views is None:
            buf = self._buffer(msg)
            b.views = [(e, _piece(buf, e).view(_dtype(e.dtype))
                        .view(e.shape)) for e in b.entries if e.whole]
        return [(n, v) for e, v in b.views for n in (e.name,) + e.aliases]

    def named_tensors(self, msg: Message
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
            flat = whole.view(_dtype(e.dtype))
            pairs.append((e, flat))
            if e.ends:
                done.append((e, flat.view(e.shape)))
        if pairs:
            _Program(buf, pairs, False).run()
        out = views + [(n, t) for e, t in done
                       for n in (e.name,) + e.aliases]
        return iter(out)

    def release(self, msg: Message) -> Ack:
        """The Ack for `msg` once the work queued on the current stream
        (reading its views) is done."""
        return self._ack(msg)

    def load(self, msg: Message,
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
            raise ValueError("allocconf.transfer: load() needs into=, or "
                             "targets bound with bind()")
        copies: Union[_Lanes, _Program, None] = b.bound if bound else None
        if copies is None:
            buf = self._buffer(msg)
            pairs = self._pairs(b, targets)
            if bound:
                # Kept for every sync of this layout: each piece straight
                # into its target, replayed from a CUDA graph where the
                # ops can capture it (never split_with_sizes_copy, which
                # a graph cannot replay safely: _Program).
                copies = b.bound = _Lanes(
                    [(_bytes_of(t, e), _piece(buf, e))
                     for e, t in pairs if e.nbytes], self._ops,
                    branches=self.BRANCHES)
            else:
                copies = _Program(buf, pairs, False)
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
                    raise KeyError(f"allocconf.transfer: {e.name!r} is not "
                                   f"in `into`")
                if name != e.name and t is first:
                    continue  # tied in the engine too
                if (_dtype_name(t.dtype) != e.dtype
                        or tuple(t.shape) != e.shape
                        or not t.is_contiguous()):
                    raise ValueError(
                        f"allocconf.transfer: {name!r} is "
                        f"{_dtype_name(t.dtype)}{list(t.shape)}"
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
            if msg.kind == "close":
                self.forget(msg.sender)
                continue
            if msg.kind == "abort":
                return SyncResult(msg.sync, False, buckets, tensors)
            if sync is not None and msg.sync != sync:
                raise TransferError(
                    f"allocconf.transfer: sync {msg.sync} began before sync "
                    f"{sync} ended")
            sync = msg.sync
            try:
                if load_weights is not None:
                    batch = list(self.named_tensors(msg))
                    load_weights(batch)
                    tensors += len(batch)
                    ack = self.release(msg)
                else:
                    ack = self.load(msg, into)
                    tensors += len(self._entries(msg))
            except Exception as exc:
                channel.put(self._ack(msg, f"{type(exc).__name__}: {exc}"))
                self._refuse_rest(channel, msg, timeout)
                raise
            channel.put(ack)
            buckets += 1
            if msg.last:
                return SyncResult(msg.sync, True, buckets, tensors)

    def _refuse_rest(self, channel: Channel, failed: Message,
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
            if msg.kind != "bucket" or msg.sync != failed.sync:
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
        self._ops.forget(self._seen.pop(sender, ()))

    def close(self) -> None:
        """Let go of every sender's buffers."""
        for sender in ({s for s, _ in self._buffers} | set(self._seen)):
            self.forget(sender)
        self._bound = None


# The one-copy mode: the trainer writes straight into the engine's
# weights.  Last, as it builds on what is above; made again on the new
# classes when this module is reloaded (importlib.reload), so that its
# errors are this module's TransferError.
if "allocconf._onecopy" in sys.modules:
    importlib.reload(sys.modules["allocconf._onecopy"])
from allocconf._onecopy import (Offer, Target, TargetMap,  # noqa: E402
                                Targets, Writer, Written)
