"""The replay check: whether a state dict given again holds the tensors
a sync was made of, unchanged, so that the copies made then are right
again (docs/design.md, "Replay").  Both modes keep their copies by it."""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Mapping, Tuple

import torch

from allocconf.transfer._layout import Plan
from allocconf.transfer._messages import Entry

# torch's own check of many tensors' addresses in one call (the CUDA
# build's; its CUDA graph trees check their inputs with it): a loop in
# C++ where ``t.data_ptr()`` per tensor is a Python call each.
PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
DTYPE = operator.attrgetter("dtype")
SHAPE = operator.attrgetter("shape")
STRIDE = torch.Tensor.stride


def tensor_guards() -> Any:
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


TENSOR_GUARDS = tensor_guards()


class Sources:
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
        # passed the exact check (tensor_guards).
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
        if PTRS_EQUAL is not None:
            if len(self._indices) != len(ts):
                self._indices = list(range(len(ts)))
            if not PTRS_EQUAL(ts, self.ptrs, self._indices):
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
        if not (list(map(DTYPE, ts)) == self.dtypes
                and list(map(SHAPE, ts)) == self.shapes
                and list(map(STRIDE, ts)) == self.strides):
            return False
        self._guard = None
        if TENSOR_GUARDS is not None:
            try:
                self._guard = TENSOR_GUARDS(*ts, dynamic_dims_sizes=None,
                                             dynamic_dims_strides=None)
            except Exception:
                pass
        return True


# A bucket of a kept sync: its entries, (entry, source) pairs, and the
# sources' addresses when it was made.
KeptBucket = Tuple[List[Entry], List[Tuple[Entry, torch.Tensor]],
                   Tuple[int, ...]]


class Kept(Sources):
    """A state dict's sync, kept by the Sender to be sent again as it
    was: its sources, the plan and its buckets.  A sync of the same
    tensors, unchanged, reuses it all: no per-tensor work beyond checking
    them, and the copies made once."""

    def __init__(self, plan: Plan, casts: Dict[torch.dtype, torch.dtype]
                 ) -> None:
        super().__init__(casts)
        self.plan = plan
        self.buckets: List[KeptBucket] = []
