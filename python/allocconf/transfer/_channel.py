"""Channels: how the two sides' messages travel.  A :class:`Channel` is
two of the application's queues, or two one-way pipes to a child process
(:meth:`Channel.pipes`), every wait bounded."""
from __future__ import annotations

import os
import pickle
import queue
import select
import struct
import threading
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import torch

from allocconf.transfer._errors import (TransferError, check, error,
                                        is_number, seconds)

FRAME = struct.Struct("<Q")  # a pipe message: its length, then its bytes


class Pipe:
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
            raise error(TransferError, f"this channel is broken "
                                       f"({self._broken}); make a new one")
        if self._conn.closed:
            raise error(RuntimeError, "this channel end is closed")
        fd: int = self._conn.fileno()
        if not self._ready:
            os.set_blocking(fd, False)
            self._ready = True
        return fd

    def _cut(self, why: str) -> TransferError:
        self._broken = why
        return error(TransferError, why)

    def put(self, obj: Any) -> None:
        from multiprocessing.reduction import ForkingPickler
        data = ForkingPickler.dumps(obj)  # before anything is written
        with self._lock:
            fd = self._fd()
            view = memoryview(FRAME.pack(len(data)) + bytes(data))
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
            head = self._read(fd, FRAME.size, timeout)
            (n,) = FRAME.unpack(head)
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
        arrive milliseconds late; benchmarks/transfer/channel_latency.py).  A
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
        t = seconds("timeout", timeout)
        check("spin", spin, "a number of seconds from 0 to 1",
              is_number(spin) and 0 <= spin <= 1)
        w = float(spin)
        import multiprocessing
        a_in, b_out = multiprocessing.Pipe(duplex=False)  # (read, write)
        b_in, a_out = multiprocessing.Pipe(duplex=False)
        return (cls(Pipe(a_out, t), Pipe(a_in, t, w)),
                cls(Pipe(b_out, t), Pipe(b_in, t, w)))

    def close(self) -> None:
        """Close this end where it is a pipe end (:meth:`pipes`); a
        channel over the application's queues leaves them be."""
        for box in (self.outbox, self.inbox):
            if isinstance(box, Pipe):
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
                raise error(TransferError,
                            f"nothing came from the peer within {timeout} s "
                            f"(dead, or stuck)") from None
            raise


def check_sync(tensors: Any, channel: Any) -> None:
    """Refuse a sync's arguments of the wrong type at once, by name (two
    swapped would otherwise fail only at the peer's timeout)."""
    check("tensors", tensors,
          "a mapping of names to tensors, or (name, tensor) pairs",
          isinstance(tensors, Mapping)
          or (isinstance(tensors, Iterable)
              and not isinstance(tensors, (Channel, str, bytes,
                                           torch.Tensor))), TypeError)
    check("channel", channel, "a Channel", isinstance(channel, Channel),
          TypeError)
