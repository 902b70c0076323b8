"""allocconf's pools: where ``ipc_safe()`` windows of the opener's scope
send what the opening thread allocates.

A pool is a ``torch.cuda.MemPool`` whose allocator is the extension's own
(``allocconf_pool_malloc`` / ``allocconf_pool_free`` in allocconf._C's
file, csrc/driver/alloc.c): classic device memory, shareable by classic
CUDA IPC whatever the rest of the process does.  The windows themselves
are in C (csrc/api/scoped.c); this module only looks torch over when it
is attached and makes a pool when a window first needs one on a device.
"""
from __future__ import annotations

from allocconf import _C

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Tuple, Union

# What the routing takes from torch: torch.cuda.use_mem_pool's own calls,
# made from C without its Python frame, and the pool and allocator types.
_NEEDS = (
    "torch._C._cuda_beginAllocateCurrentThreadToPool",
    "torch._C._cuda_endAllocateToPool",
    "torch._C._cuda_releasePool",
    "torch._C._cuda_getDevice",
    "torch.cuda.MemPool",
    "torch.cuda.memory.CUDAPluggableAllocator",
)


def _lookup(torch: ModuleType, dotted: str) -> Any:
    obj: Any = torch
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def probe(torch: ModuleType,
          user_config: str) -> Union[Tuple[Any, ...], str]:
    """The routing for ``_C._set_pools``, or why windows must hold
    expandable segments off process-wide instead.  Makes no pool and
    does not initialise CUDA."""
    # The version as allocconf read it at attach (str() of torch's own
    # object runs once, outside the lock: csrc/torchio/attach.c).
    version = _C._internals()["torch_version"] or "?"
    if getattr(getattr(torch, "version", None), "hip", None):
        return (f"torch {version} is a ROCm build: allocconf's pools "
                f"allocate through the CUDA driver")
    if not getattr(torch._C, "_has_cuda", False):
        return f"torch {version} is built without CUDA"
    try:
        backend = _C.parse(user_config).get("backend")
    except ValueError:
        backend = None
    if backend == "cudaMallocAsync":
        return ("backend:cudaMallocAsync is configured: torch's pools "
                "(MemPool) work with its native allocator only")
    found = []
    for dotted in _NEEDS:
        try:
            found.append(_lookup(torch, dotted))
        except AttributeError:
            return (f"torch {version} has no {dotted} (torch 2.8 and newer "
                    f"route one thread's allocations to a pool)")
    begin, end, release, device, pool_type, allocator_type = found
    allocator = allocator_type(_C.__file__, _C.POOL_MALLOC, _C.POOL_FREE)

    def make(index: int) -> Any:
        """A new pool of allocconf's on device `index`."""
        with torch.cuda.device(index):
            return pool_type(allocator.allocator())

    return (begin, end, release, device, torch.cuda.is_initialized, make)


def attach(torch: ModuleType, user_config: str) -> None:
    """Hand the routing (or why there is none) to the C core."""
    try:
        found = probe(torch, user_config)
    except Exception as exc:  # inside the user's `import torch`
        found = f"allocconf could not look torch's pools over: {exc!r}"
    if isinstance(found, str):
        _C._set_pools(None, f"windows hold expandable segments off for the "
                            f"whole process: {found}")
    else:
        _C._set_pools(found, "windows route the opening thread's "
                             "allocations to allocconf's pools")
