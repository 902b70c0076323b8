"""Where tensors go in a sender's buffers: the layout, bucket after
bucket, and the plan, the sender's record of one layout kept while the
tensors given match it (docs/rl-weight-sync.md, "A plan, made once per
layout")."""
from __future__ import annotations

import uuid
from typing import (Any, Dict, Iterable, Iterator, List, Mapping,
                    NamedTuple, Optional, Tuple)

import torch

from allocconf.transfer._errors import check
from allocconf.transfer._messages import Entry
from allocconf.transfer._tensors import dtype_name, itemsize

#: Byte alignment of every tensor in a buffer: enough for any dtype's
#: view and for vectorised copies.
ALIGN = 256


def align(n: int) -> int:
    """`n` rounded up to a multiple of ALIGN."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Layout:
    """Where tensors go, bucket after bucket, in buffers of `capacity`
    bytes: each at an ALIGN-ed offset; one that does not fit in what is
    left of a bucket starts the next; one larger than a whole buffer is
    split into pieces, the first at the start of a bucket."""

    def __init__(self, capacity: int, fill: int = 0, count: int = 0) -> None:
        check("capacity", capacity, f"an int of at least {ALIGN} bytes",
              isinstance(capacity, int) and not isinstance(capacity, bool)
              and capacity >= ALIGN)
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
            off = align(self.fill)
            if left > self.capacity - off and self.count:
                yield None
                self.fill = self.count = off = 0
            size = min(left, (self.capacity - off) // itemsize * itemsize)
            yield Entry(name, dtype, shape, off, size, start,
                        -1 if size == nbytes else nbytes, aliases)
            self.count += 1
            self.fill = off + size
            start += size
            if start >= nbytes:
                return


def plan(sizes: Iterable[Tuple[str, str, Tuple[int, ...], int]],
         capacity: int) -> List[List[Entry]]:
    """Return the buckets for tensors given as (name, dtype, shape,
    nbytes), in order, in buffers of `capacity` bytes (as
    :meth:`Sender.send` lays them out)."""
    layout = Layout(capacity)
    buckets: List[List[Entry]] = [[]]
    for name, dtype, shape, nbytes in sizes:
        for e in layout.place(name, dtype, tuple(shape), nbytes):
            if e is None:
                buckets.append([])
            else:
                buckets[-1].append(e)
    return buckets


class Key(NamedTuple):
    """A tensor's place in a plan: a sync that gives the same keys in the
    same order follows the plan."""

    name: str
    given: torch.dtype                # its dtype
    sent: torch.dtype                 # the dtype it is sent as (a cast)
    shape: Tuple[int, ...]
    alias: Optional[str]              # the name whose memory it shares
    aliases: Tuple[str, ...]          # its own other names (tied)


# A piece of a tensor in a plan, and whether a bucket ends before it.
Piece = Tuple[bool, Entry]


class Plan:
    """The sender's record of one layout: for each tensor its key, its
    pieces, and the layout's state before it, so that a sync that stops
    following the plan goes on from there."""

    def __init__(self, capacity: int) -> None:
        self.id = uuid.uuid4().hex
        self.capacity = capacity
        self.keys: List[Key] = []
        self.pieces: List[List[Piece]] = []
        self.before: List[Tuple[int, int]] = []
        self.known = False  # the receiver holds every bucket of it

    def place(self, layout: Layout, key: Key, numel: int) -> List[Piece]:
        """Lay one more tensor out, with `layout` where the plan ends."""
        self.before.append((layout.fill, layout.count))
        self.keys.append(key)
        pieces: List[Piece] = []
        if key.alias is None:  # a tied name is sent under its first
            size = itemsize(key.sent)
            brk = False
            for e in layout.place(key.name, dtype_name(key.sent), key.shape,
                                  numel * size, key.aliases, size):
                if e is None:
                    brk = True
                    continue
                pieces.append((brk, e))
                brk = False
        self.pieces.append(pieces)
        return pieces

    def prefix(self, index: int, entries: List[Entry]
               ) -> Tuple["Plan", Layout]:
        """A new plan that starts as this one's first `index` tensors, and
        the layout's state there (`entries`: the bucket being packed)."""
        new = Plan(self.capacity)
        new.keys = self.keys[:index]
        new.pieces = self.pieces[:index]
        new.before = self.before[:index]
        if index < len(self.before):
            fill, count = self.before[index]
        else:  # after the last tensor: where the bucket ends
            fill = entries[-1].offset + entries[-1].nbytes if entries else 0
            count = len(entries)
        return new, Layout(self.capacity, fill, count)


def aliases(tensors: Mapping[str, Any]
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
