"""A stand-in for allocconf.transfer's CUDA operations that works across
processes on one machine, for the CPU tests with real process
boundaries (Ray actors): each buffer is a file in /dev/shm mapped shared
by both sides (the "IPC handle" is its path), events are names and every
wait is a no-op (CPU copies are done when they return).  The GPU tests
prove the CUDA path."""
import os
import tempfile
import uuid

import torch

from allocconf.transfer import TransferError

ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
PREFIX = "allocconf-test-"


class ShmOps:
    device = -1
    torch_device = torch.device("cpu")
    uuid = "host-gpu-0"

    def local(self, uuid_):
        if uuid_ != self.uuid:
            raise TransferError(f"allocconf.transfer: the sender's GPU "
                                f"({uuid_}) is not here")
        return 0

    def __init__(self):
        self._paths = {}  # buffer address -> its file

    def alloc(self, nbytes):
        path = os.path.join(ROOT, PREFIX + uuid.uuid4().hex)
        buf = torch.from_file(path, shared=True, size=nbytes,
                              dtype=torch.uint8)
        self._paths[buf.data_ptr()] = path
        return buf

    def share(self, buf):
        return ("shm", self._paths[buf.data_ptr()], buf.numel())

    def open(self, handle, device):
        _, path, nbytes = handle
        return torch.from_file(path, shared=True, size=nbytes,
                               dtype=torch.uint8)

    def event(self):
        name = uuid.uuid4().hex.encode()
        return name, name

    def record(self, ev):
        pass

    def wait(self, handle, device=None):
        pass

    def forget(self, handles):
        pass


def cleanup():
    """Remove the buffer files this machine's tests left."""
    for name in os.listdir(ROOT):
        if name.startswith(PREFIX):
            os.unlink(os.path.join(ROOT, name))
