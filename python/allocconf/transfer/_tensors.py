"""Tensors as the transfer sees them: dtypes by name, raw bytes, the
check of what is given, and casts."""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional

import torch

from allocconf.transfer._errors import error
from allocconf.transfer._messages import Entry

# What to do with a tensor that is not contiguous, where the transfer
# reads it (a copy of it sends the same values).
COPY_IT = "pass t.contiguous()"


@functools.lru_cache(maxsize=None)
def dtype(name: str) -> torch.dtype:
    """The torch dtype named `name` ("bfloat16")."""
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise error(ValueError, f"unknown dtype {name!r}")
    return d


@functools.lru_cache(maxsize=None)
def dtype_name(d: torch.dtype) -> str:
    """The name of dtype `d` as a message carries it ("bfloat16")."""
    return str(d).replace("torch.", "")


@functools.lru_cache(maxsize=None)
def itemsize(d: torch.dtype) -> int:
    return torch.empty((), dtype=d).element_size()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def piece(buf: torch.Tensor, e: Entry) -> torch.Tensor:
    """The bytes of buffer `buf` that entry `e` occupies."""
    return buf[e.offset:e.offset + e.nbytes]


def bytes_of(t: torch.Tensor, e: Entry) -> torch.Tensor:
    """The bytes of contiguous `t` that entry `e` carries (all of them,
    or one piece of a tensor split across buckets), as a uint8 view."""
    raw = as_bytes(t)
    return raw if e.whole else raw[e.start:e.start + e.nbytes]


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def wide(nbytes: int, address: int) -> torch.dtype:
    """The widest integer dtype that tiles `nbytes` bytes at `address`."""
    for width, d in _WIDE:
        if nbytes % width == 0 and address % width == 0:
            return d
    return torch.uint8


def check(name: Any, t: Any, device: torch.device,
          where: str = "this sender's buffers",
          not_contiguous: str = COPY_IT) -> None:
    """Raise a clear error, naming it, for what cannot be sent or written
    (`not_contiguous`: what to do about a tensor that is not)."""
    if not isinstance(name, str):
        raise error(TypeError, f"names must be str, got "
                               f"{type(name).__name__} {name!r}")
    if not isinstance(t, torch.Tensor):
        raise error(TypeError, f"{name!r} is a {type(t).__name__}, not a "
                               f"tensor")
    if t.device != device:
        raise error(ValueError, f"{name!r} is on {t.device}; {where} are "
                                f"on {device}")
    if not t.is_contiguous():
        raise error(ValueError, f"{name!r} is not contiguous (shape "
                                f"{list(t.shape)}, stride "
                                f"{list(t.stride())}); {not_contiguous}")


def casts(cast: Optional[Mapping[torch.dtype, torch.dtype]]
          ) -> Dict[torch.dtype, torch.dtype]:
    """`cast` (a dtype to the one to send it as) checked, as a dict."""
    out = dict(cast or {})
    for a, b in out.items():
        if not (isinstance(a, torch.dtype) and isinstance(b, torch.dtype)):
            raise error(TypeError, f"cast maps dtypes to dtypes, got "
                                   f"{a!r}: {b!r}")
    return out
