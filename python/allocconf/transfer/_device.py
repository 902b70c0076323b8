"""The device the transfer runs on: the interface both sides use
(:class:`Device`), and its CUDA implementation (:class:`Cuda`).
``allocconf.transfer.testing`` implements it on the CPU."""
from __future__ import annotations

from typing import (Any, Callable, Dict, Iterable, List, Optional,
                    Protocol, Sequence, Tuple, Union, runtime_checkable)

import torch

import allocconf
from allocconf.transfer._errors import TransferError, error

_cuda: Any = torch.cuda  # its Event and CUDAGraph are untyped


@runtime_checkable
class Device(Protocol):
    """What the Sender, Receiver, Targets and Writer do on a device.
    Structural: an implementation defines these and nothing else.
    Handles (of a buffer, of an event) are opaque and picklable: what
    one process's :meth:`share` or :meth:`event` made, another's
    :meth:`open` or :meth:`wait` takes."""

    #: The torch device whose tensors this device's buffers are.
    torch_device: torch.device
    #: This device's GPU, by a name every process agrees on (its UUID).
    uuid: str

    def local(self, uuid: str) -> int:
        """Return the index, in this process, of the GPU `uuid` names;
        TransferError where this process does not see it."""

    def alloc(self, nbytes: int) -> torch.Tensor:
        """Return a new uint8 buffer of `nbytes` that :meth:`share` can
        share."""

    def share(self, buf: torch.Tensor) -> Any:
        """Return a handle to `buf`'s memory for another process."""

    def open(self, handle: Any, device: int) -> torch.Tensor:
        """Return the memory `handle` names, on this process's GPU
        `device` (:meth:`local` of the sharer's)."""

    def event(self) -> Tuple[Any, bytes]:
        """Return a new interprocess event, recorded once, and its
        handle."""

    def record(self, ev: Any) -> None:
        """Record `ev` on the current stream."""

    def wait(self, handle: bytes, device: Optional[int] = None) -> None:
        """Make the current stream of `device` (this one's by default)
        wait for the event `handle` names."""

    def forget(self, handles: Iterable[bytes]) -> None:
        """Drop the events opened from these handles."""

    def capable(self, t: torch.Tensor) -> bool:
        """Return whether :meth:`share` can share `t`'s memory (the
        one-copy mode's targets)."""

    def graph(self, branches: Sequence[Callable[[], None]]
              ) -> Optional[Callable[[], None]]:
        """Return the replay of `branches` captured once as parallel
        branches of one graph, or None where they cannot be (the caller
        runs them as they are)."""


class Cuda:
    """CUDA: buffers in classic memory, shared by cudaIpcGetMemHandle,
    ordered by interprocess events recorded and waited for on the current
    stream."""

    def __init__(self, device: Optional[int]) -> None:
        if not torch.cuda.is_available():
            raise error(RuntimeError, "no CUDA device")
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

    def local(self, uuid: str) -> int:
        got = self._local.get(uuid)
        if got is not None:
            return got
        for i in range(torch.cuda.device_count()):
            if self.uuid_of(i) == uuid:
                self._local[uuid] = i
                return i
        raise error(TransferError,
                    f"the sender's GPU ({uuid}) is not among the "
                    f"{torch.cuda.device_count()} this process sees "
                    f"(CUDA_VISIBLE_DEVICES); CUDA IPC needs the same GPU")

    def alloc(self, nbytes: int) -> torch.Tensor:
        # The buffer's device current while the window opens, so that a
        # window of the opener's scope routes that device to its pool.
        with torch.cuda.device(self.torch_device), allocconf.ipc_safe():
            buf = torch.empty(nbytes, dtype=torch.uint8,
                              device=self.torch_device)
        if not allocconf.ipc_capable(buf):
            st = allocconf.status()
            raise error(RuntimeError,
                        f"a buffer allocated inside ipc_safe() is in memory "
                        f"classic CUDA IPC cannot share (windows' scope: "
                        f"{st.window_scope}, {st.window_scope_reason}; "
                        f"{st.reason})")
        return buf

    def share(self, buf: torch.Tensor) -> Any:
        from torch.multiprocessing import reductions
        r: Any = reductions  # untyped in torch
        return r.reduce_tensor(buf)

    def open(self, handle: Any, device: int) -> torch.Tensor:
        # The index is this process's own for the sharer's GPU: it can
        # differ from the sharer's where the two see different
        # CUDA_VISIBLE_DEVICES.
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
        device = self.device if device is None else device
        ev = self._events.get((device, handle))
        if ev is None:
            ev = _cuda.Event.from_ipc_handle(device, handle)
            self._events[(device, handle)] = ev
        torch.cuda.current_stream(device).wait_event(ev)

    def forget(self, handles: Iterable[bytes]) -> None:
        gone = set(handles)
        for k in [k for k in self._events if k[1] in gone]:
            del self._events[k]

    def capable(self, t: torch.Tensor) -> bool:
        return allocconf.ipc_capable(t)

    def graph(self, branches: Sequence[Callable[[], None]]
              ) -> Optional[Callable[[], None]]:
        """Captured with ``capture_begin(capture_error_mode=
        "thread_local")`` on a side stream: the ``torch.cuda.graph``
        context would synchronise, collect garbage and empty the cache
        (docs/design.md)."""
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


def _cuda_is_a_device(cuda: Cuda) -> Device:
    return cuda  # mypy --strict checks that Cuda implements Device


def device_of(device: Union[int, Device, None]) -> Device:
    """The device a Sender, Receiver, Targets or Writer runs on: a CUDA
    device by index (the current one for None), or a :class:`Device`
    given as it is (``allocconf.transfer.testing``'s)."""
    if isinstance(device, Device):
        return device
    return Cuda(device)
