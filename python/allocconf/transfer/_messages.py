"""What goes over a channel, one frozen type per kind, and what a sync
returns.

The wire types are NamedTuples: they pickle as their class and their
fields' values (no field names, no per-object dict), a few hundred bytes
for a bucket, so that a hand-over costs the channel little.  A receiver
tells them apart by type.  Handles and events are opaque here: what the
device (``_device.Device``) made of a buffer or an event."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple, Union


class Entry(NamedTuple):
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


# -- the bucketed mode: Sender to Receiver, and the Ack back ---------------

class Bucket(NamedTuple):
    """One bucket of a sync, packed in a sender's buffer (what
    :meth:`Sender.send` yields).  ``entries`` is None once the receiver
    knows the plan."""

    sender: str              # the Sender's id, to cache buffers by
    sync: int                # which sync, from 1
    seq: int                 # the bucket's index within the sync
    buffer: int              # which of the sender's buffers holds it
    last: bool               # the sync's last bucket
    handle: Any              # the buffer's IPC handle (the device's)
    event: bytes             # interprocess event recorded after packing
    device: str              # the sender's GPU, by UUID
    plan: str                # the plan this bucket belongs to
    entries: Optional[Tuple[Entry, ...]] = None


class Abort(NamedTuple):
    """Sync `sync` ended early: the receiver must not take it for whole."""

    sender: str
    sync: int


class Close(NamedTuple):
    """The sender is gone: the receiver lets go of its buffers."""

    sender: str


#: What a Sender puts on its channel.
Message = Union[Bucket, Abort, Close]


class Ack(NamedTuple):
    """The receiver's word that it is done with a bucket's buffer, or,
    with ``error``, that it could not take it."""

    sender: str
    sync: int
    seq: int
    buffer: int
    event: bytes             # recorded after the receiver's reads
    error: Optional[str] = None


# -- the one-copy mode: Targets (the engine) and Writer (the trainer) ------

class Target(NamedTuple):
    """Where one name lands in the engine: `nbytes` bytes at `offset` in
    the map's storage number `storage` (-1: an empty tensor)."""

    name: str
    storage: int
    offset: int
    dtype: str               # torch dtype name, e.g. "bfloat16"
    shape: Tuple[int, ...]
    nbytes: int


class TargetMap(NamedTuple):
    """What the trainer needs to write into an engine: its GPU (by UUID),
    one IPC handle per storage and the targets.  A new map (new ``id``)
    each time the engine exports."""

    id: str
    device: str
    storages: Tuple[Any, ...]
    targets: Tuple[Target, ...]


class Offer(NamedTuple):
    """The engine's consent to one sync: its weights are not read after
    `event` until it accepts the Written that answers."""

    map: str
    sync: int
    event: bytes


class MapClosed(NamedTuple):
    """The engine let go of map `map`: the trainer lets go of its
    mappings of it."""

    map: str


class Written(NamedTuple):
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


@dataclass(frozen=True)
class SyncResult:
    """What :meth:`Receiver.serve` (or :meth:`Targets.serve`) took: the
    sync's number, whether it arrived whole, its buckets, and its
    tensors (each once, however many buckets it spans; tied names each)."""

    sync: int
    complete: bool
    buckets: int
    tensors: int
    error: Optional[str] = None  # one-copy: why the trainer's write failed
