"""A stand-in for allocconf.transfer's CUDA operations, for the CPU tests:
buffers are CPU tensors found by key in this process (the "transport"),
events are names, GPUs are UUID strings, and every record, wait, open and
copy-stream step is logged in order, so the protocol (which buffer, which
Ack, what waits for what) is checked without a GPU.  The GPU tests
(tests/gpu/test_transfer_gpu.py) prove the real thing."""
import itertools

import torch

from allocconf.transfer import TransferError

_BUFFERS = {}
_keys = itertools.count()


class HostOps:
    device = -1
    torch_device = torch.device("cpu")

    def __init__(self, log=None, uuid="host-gpu-0", visible=None,
                 capable=True):
        self.log = [] if log is None else log
        self.is_capable = capable  # what the driver would say of memory
        self.uuid = uuid
        # The GPUs this "process" sees, in its own numbering.
        self.visible = [uuid] if visible is None else list(visible)
        self.forgotten = []

    def local(self, uuid):
        if uuid not in self.visible:
            raise TransferError(f"allocconf.transfer: the sender's GPU "
                                f"({uuid}) is not among the "
                                f"{len(self.visible)} this process sees")
        return self.visible.index(uuid)

    def alloc(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def share(self, buf):
        key = next(_keys)
        _BUFFERS[key] = buf
        return ("host", key)

    def open(self, handle, device):
        self.log.append(("open", handle, device))
        return _BUFFERS[handle[1]]

    def event(self):
        name = f"ev{next(_keys)}".encode()
        return name, name

    def record(self, ev):
        self.log.append(("record", ev))

    def wait(self, handle, device=None):
        self.log.append(("wait", handle))

    def forget(self, handles):
        self.forgotten.extend(handles)

    # the one-copy mode's (no graph: its copies run eagerly here)

    def capable(self, t):
        return self.is_capable
