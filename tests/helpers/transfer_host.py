"""A stand-in for allocconf.transfer's CUDA operations, for the CPU tests:
buffers are CPU tensors found by key in this process (the "transport"),
events are names, and every record and wait is logged in order, so the
protocol (which buffer, which Ack, what waits for what) is checked without
a GPU.  The GPU tests (tests/gpu/test_transfer.py) prove the real thing."""
import itertools

import torch

_BUFFERS = {}
_keys = itertools.count()


class HostOps:
    device = -1
    torch_device = torch.device("cpu")

    def __init__(self, log=None):
        self.log = [] if log is None else log

    def alloc(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def share(self, buf):
        key = next(_keys)
        _BUFFERS[key] = buf
        return ("host", key)

    def open(self, handle):
        self.log.append(("open", handle))
        return _BUFFERS[handle[1]]

    def event(self):
        name = f"ev{next(_keys)}".encode()
        return name, name

    def record(self, ev):
        self.log.append(("record", ev))

    def wait(self, handle):
        self.log.append(("wait", handle))
