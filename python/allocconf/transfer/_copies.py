"""The copies between tensors and buffers, or tensors and tensors, bit
for bit, made once and run (or replayed from a CUDA graph) every sync
that has the same layout (docs/design.md, "How the transfer copies")."""
from __future__ import annotations

from typing import (Any, Callable, Dict, List, Optional, Sequence, Tuple)

import torch

from allocconf.transfer._messages import Entry
from allocconf.transfer._tensors import (as_bytes, bytes_of, dtype,
                                         dtype_name, itemsize, piece, wide)

#: What captures copies in a CUDA graph: given the branches to run in
#: parallel, their replay, or None where capture failed
#: (``_device.Device.graph``).
Capture = Callable[[Sequence[Callable[[], None]]],
                   Optional[Callable[[], None]]]


class Program:
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
      (benchmarks/transfer/copy_methods.py, docs/benchmarks.md).  A run of one
      piece is a ``copy_`` (a memcpy).
    * A piece that does not tile as int64 goes in one ``_foreach_copy_``
      as the widest integers that tile it, never as its dtype: that
      kernel rounds through float and would rewrite NaN payloads.
    * A piece sent in another dtype than its tensor's (a cast) is copied
      typed, which converts as ``Tensor.to`` does: at least BIG bytes
      with its own ``copy_``, smaller ones in one ``_foreach_copy_``.

    The program holds its views of both sides (so the tensors it copies
    stay allocated while it is kept).  With `capture` (the device's graph),
    a program kept to be run again is captured once in a CUDA graph and
    replayed: its launches cost a few microseconds instead of about 0.5
    us per tensor.  Only programs into a buffer are captured: ``cat``
    passes its tensors' addresses in the kernel's parameters, where
    ``split_with_sizes_copy`` stages them through pinned host memory,
    which a replay would read after torch reused it (a receiver's kept
    copies are :class:`Lanes` instead)."""

    BIG = 32 << 20   # bytes: a typed copy_ here is bound by the GPU
    RUNS = True      # False: no runs (the tests' second route)

    def __init__(self, buf: torch.Tensor,
                 pairs: Sequence[Tuple[Entry, torch.Tensor]],
                 into_buffer: bool,
                 capture: Optional[Capture] = None) -> None:
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
            if dtype_name(t.dtype) != e.dtype:  # a cast
                run = self._end(buf, run)
                self._typed(buf, e, t)
                continue
            raw = bytes_of(t, e)
            if (self.RUNS and e.nbytes % 8 == 0 and e.offset % 8 == 0
                    and raw.data_ptr() % 8 == 0):
                if run and e.offset < run[-1][0].offset + run[-1][0].nbytes:
                    run = self._end(buf, run)  # the same piece again (tied)
                run.append((e, raw.view(torch.int64)))
                continue
            run = self._end(buf, run)
            d = wide(e.nbytes, raw.data_ptr())
            theirs = piece(buf, e).view(d)
            mine = raw.view(d)
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
        sent = dtype(e.dtype)
        theirs = piece(buf, e).view(sent)
        if e.whole:
            theirs, mine = theirs.view(e.shape), t
        else:  # a piece holds whole elements (_Layout.place)
            size = itemsize(sent)
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


class Lanes:
    """Copies from tensors straight into other tensors (neither side one
    flat buffer), made once and run as often as asked (docs/design.md,
    "One copy, into the engine's weights"): a copy of at least `small`
    bytes is its own ``copy_`` (a memcpy, or a cast); smaller ones go
    together in one ``_foreach_copy_`` per kind, as the widest integers
    that tile them when uncast (bit for bit: never through float).  The
    copies are dealt to `branches` lanes, heaviest first to the least
    loaded, and with `capture` (the device's graph) captured as one CUDA
    graph of parallel branches where it can; else the lanes run one
    after another.  The one-copy mode's writes, and a receiver's copies
    out of a buffer into the targets bound to it."""

    SMALL = 1 << 20  # bytes: smaller copies are batched
    BRANCHES = 4     # parallel lanes of the captured copies

    def __init__(self, pairs: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                 capture: Optional[Capture], small: int = SMALL,
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
                w = wide(nbytes, dst.data_ptr() | src.data_ptr())
                dst, src = as_bytes(dst).view(w), as_bytes(src).view(w)
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

