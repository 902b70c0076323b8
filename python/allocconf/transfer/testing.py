"""Run the transfer on a CPU: your own trainer and engine wiring (threads
or processes, your queues, your ``load_weights``), bit-exact, with
faults to inject, on a machine without a GPU (docs/rl-weight-sync.md,
"Trying it on a CPU").

Give each side a :class:`HostDevice` as its ``device``::

    from allocconf.transfer import Channel, Receiver, Sender
    from allocconf.transfer.testing import HostDevice

    sender = Sender(1 << 20, device=HostDevice())       # the trainer
    receiver = Receiver(device=HostDevice())            # the engine

and everything else runs as on the GPU: the same plans, buckets,
copies, messages, acknowledgements, timeouts and errors.  Tensors are
CPU tensors.  What the GPU orders with events is already done on the
CPU when a copy returns, so every wait is immediate; a HostDevice only
logs each record, wait and open, in order, for a test to check what
waits for what.

A sender's buffers are files in shared memory (``/dev/shm``), so the
engine may be another process (``multiprocessing``, Ray) on the same
machine; the one-copy mode's targets (:class:`~allocconf.transfer.
Targets`) are shared with a Writer in the same process only (threads).

Faults: :func:`silent_after` makes a peer stop answering (the other side
times out, as with a stuck process), :func:`dead_after` makes it die (the
other side's channel raises at once, as a pipe to an exited process
does)."""
from __future__ import annotations

import itertools
import os
import tempfile
import threading
import uuid
import weakref
from typing import (Any, Callable, Dict, Iterable, List, Optional, Sequence,
                    Tuple)

import torch

from allocconf.transfer._channel import Channel
from allocconf.transfer._device import Device
from allocconf.transfer._errors import TransferError, check, error

__all__ = ["HostDevice", "Device", "silent_after", "dead_after"]

_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_PREFIX = "allocconf-transfer-"

# Tensors shared in this process (the one-copy mode's targets), by key.
_SHARED: Dict[int, torch.Tensor] = {}
# The buffers allocated in this process, by file: opened here, a buffer
# is the same memory at the same address, as CUDA IPC's within a process.
_FILES: "weakref.WeakValueDictionary[str, torch.Tensor]" = (
    weakref.WeakValueDictionary())
_keys = itertools.count()
_lock = threading.Lock()


class HostDevice:
    """A :class:`Device` on the CPU.  `uuid` names its "GPU"; `visible`
    lists the GPUs this process sees, in its own numbering (default: its
    own alone), so that a receiver that does not see the sender's raises
    as on CUDA; `capable` is what the driver would say of the engine's
    memory (False: the one-copy mode refuses it, as memory in an
    expandable segment).  `log`, a list, receives ``("record", event)``,
    ``("wait", handle)`` and ``("open", handle, device)`` in order."""

    torch_device = torch.device("cpu")

    def __init__(self, uuid: str = "host-gpu-0", *,
                 visible: Optional[Sequence[str]] = None,
                 capable: bool = True,
                 log: Optional[List[Any]] = None) -> None:
        check("uuid", uuid, "a str", isinstance(uuid, str), TypeError)
        self.uuid = uuid
        self.visible = [uuid] if visible is None else list(visible)
        self.is_capable = capable
        self.log: List[Any] = [] if log is None else log
        #: The event handles :meth:`forget` was given.
        self.forgotten: List[bytes] = []
        self._files: Dict[int, Tuple[str, int]] = {}  # address -> file

    def local(self, uuid: str) -> int:
        if uuid not in self.visible:
            raise error(TransferError,
                        f"the sender's GPU ({uuid}) is not among the "
                        f"{len(self.visible)} this process sees")
        return self.visible.index(uuid)

    def alloc(self, nbytes: int) -> torch.Tensor:
        path = os.path.join(_ROOT, _PREFIX + uuid.uuid4().hex)
        buf = torch.from_file(path, shared=True, size=nbytes,
                              dtype=torch.uint8)
        # The file goes with the buffer (a process that mapped it keeps
        # its mapping), or at exit.
        weakref.finalize(buf, _unlink, path)
        self._files[buf.data_ptr()] = (path, nbytes)
        _FILES[path] = buf
        return buf

    def share(self, buf: torch.Tensor) -> Any:
        got = self._files.get(buf.data_ptr())
        if got is not None:
            return ("file",) + got
        with _lock:
            key = next(_keys)
            _SHARED[key] = buf
        return ("here", os.getpid(), key)

    def open(self, handle: Any, device: int) -> torch.Tensor:
        self.log.append(("open", handle, device))
        if handle[0] == "file":
            _, path, nbytes = handle
            here = _FILES.get(path)
            if here is not None:
                return here
            return torch.from_file(path, shared=True, size=nbytes,
                                   dtype=torch.uint8)
        _, pid, key = handle
        if pid != os.getpid():
            raise error(TransferError,
                        "a HostDevice shares the engine's own tensors "
                        "(the one-copy mode's targets) within one process "
                        "only: run trainer and engine as threads")
        return _SHARED[key]

    def event(self) -> Tuple[Any, bytes]:
        name = f"ev{uuid.uuid4().hex[:12]}".encode()
        return name, name

    def record(self, ev: Any) -> None:
        self.log.append(("record", ev))

    def wait(self, handle: bytes, device: Optional[int] = None) -> None:
        self.log.append(("wait", handle))

    def forget(self, handles: Iterable[bytes]) -> None:
        self.forgotten.extend(handles)

    def capable(self, t: torch.Tensor) -> bool:
        return self.is_capable

    def graph(self, branches: Sequence[Callable[[], None]]
              ) -> Optional[Callable[[], None]]:
        return None  # no graphs on the CPU: the copies run as they are


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


_CLOSED = "the peer closed the channel (it exited, or closed its end)"


class _Peer:
    """What one end of a channel sees of a peer that takes `after`
    messages from it and then stops: silent (what is put later is never
    read) or dead (this end's puts and gets raise, once what the peer
    answered before is read)."""

    def __init__(self, channel: Channel, after: int, dead: bool) -> None:
        self.outbox = channel.outbox
        self.inbox = channel.inbox
        self.left = after
        self.dead = dead


class _Out:
    def __init__(self, peer: _Peer) -> None:
        self.peer = peer

    def put(self, obj: Any) -> None:
        p = self.peer
        if p.left > 0:
            p.left -= 1
            p.outbox.put(obj)
        elif p.dead:
            raise error(TransferError, _CLOSED)
        # else: the peer no longer reads; what is put is lost


class _In:
    def __init__(self, peer: _Peer) -> None:
        self.peer = peer

    def get(self, timeout: Optional[float] = None) -> Any:
        p = self.peer
        if not (p.dead and p.left <= 0):
            return p.inbox.get(timeout=timeout)
        try:
            return p.inbox.get(timeout=0)  # what it answered before
        except Exception as exc:
            if any(c.__name__ == "Empty" for c in type(exc).__mro__):
                raise error(TransferError, _CLOSED) from None
            raise


def _cut(channel: Channel, after: int, dead: bool) -> Channel:
    check("channel", channel, "a Channel", isinstance(channel, Channel),
          TypeError)
    check("after", after, "an int >= 0",
          isinstance(after, int) and not isinstance(after, bool)
          and after >= 0)
    peer = _Peer(channel, after, dead)
    return Channel(_Out(peer), _In(peer))


def silent_after(channel: Channel, after: int) -> Channel:
    """Return this side's `channel` to a peer that takes `after`
    messages and then stops reading (stuck): what is put later is lost,
    so this side's waits for an answer run out (TransferError after its
    timeout)."""
    return _cut(channel, after, dead=False)


def dead_after(channel: Channel, after: int) -> Channel:
    """Return this side's `channel` to a peer that takes `after`
    messages and then dies: the next put raises TransferError at once,
    and so does a get once what the peer answered before is read, as a
    pipe to an exited process does (:meth:`Channel.pipes`)."""
    return _cut(channel, after, dead=True)


def _host_is_a_device(host: HostDevice) -> Device:
    return host  # mypy --strict checks that HostDevice implements Device
