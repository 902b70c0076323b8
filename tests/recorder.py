"""Wrap torch's allocator setter with a recorder that still calls it.

Used inside child processes: `install()` before or after `import torch`;
`CALLS` lists every string handed to torch, in order.  When torch is not
imported yet, the wrap happens as soon as the torch._C extension loads,
before torch's own __init__ (and so before allocconf) can look it up.
"""
import importlib.machinery
import sys

NAME = "_accelerator_setAllocatorSettings"
CALLS = []
REJECT = set()  # strings the recorder refuses, to test torch refusing


def _wrap(torch_c):
    real = getattr(torch_c, NAME)

    def recorder(conf):
        CALLS.append(conf)
        if conf in REJECT:
            raise ValueError(f"recorder refused {conf!r}")
        return real(conf)

    setattr(torch_c, NAME, recorder)


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
    """The last string torch received (torch 2.13+ has a getter)."""
    import torch

    return torch._C._accelerator_getAllocatorSettings()
