"""Wrap torch's allocator setter with a recorder that still calls it.

Used inside child processes: `install()` before or after `import torch`;
`CALLS` lists every string handed to torch, in order.  When torch is not
imported yet, the wrap happens as soon as the torch._C extension loads,
before torch's own __init__ (and so before allocconf) can look it up.
The setter wrapped is torch's own, by capability: the 2.10+ one, else the
2.1-2.9 CUDA one.
"""
import importlib.machinery
import os
import sys

NAMES = ("_accelerator_setAllocatorSettings",
         "_cuda_cudaCachingAllocator_set_allocator_settings")
CALLS = []
REJECT = set()  # strings the recorder refuses, to test torch refusing


def _wrap(torch_c):
    name = next(n for n in NAMES if hasattr(torch_c, n))
    real = getattr(torch_c, name)

    def recorder(conf):
        CALLS.append(conf)
        if conf in REJECT:
            raise ValueError(f"recorder refused {conf!r}")
        return real(conf)

    setattr(torch_c, name, recorder)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "torch._C":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            _wrap(module)

        loader.exec_module = exec_module
        sys.meta_path.remove(self)
        return spec


def install():
    if "torch" in sys.modules:
        _wrap(sys.modules["torch"]._C)
    else:
        sys.meta_path.insert(0, _Finder())


def live():
    """The string torch holds: its own getter (torch 2.13+); before that,
    the last string it received through the recorded setter, else the
    variable it reads."""
    import torch

    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        return getter()
    if CALLS:
        return CALLS[-1]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                "PYTORCH_ALLOC_CONF"):
        if var in os.environ:
            return os.environ[var]
    return ""
