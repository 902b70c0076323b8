"""Peers in child processes for tests/transfer/test_transfer_channel.py:
each takes the child's end of a Channel.pipes() channel as its Process
argument."""
import os


def echo(channel):
    """Send back what comes, until None."""
    while True:
        msg = channel.get(60)
        if msg is None:
            return
        channel.put(msg)


def engine(channel, names_shapes):
    """A Receiver (the /dev/shm stand-in for CUDA IPC) bound to zeros;
    serves one sync, answers with its result and the weights' sums, then
    exits without closing anything (as a crashed engine would)."""
    import torch

    from allocconf.transfer import Receiver
    from allocconf.transfer.testing import HostDevice

    weights = {n: torch.zeros(s) for n, s in names_shapes}
    rx = Receiver(device=HostDevice())
    rx.bind(weights)
    r = rx.serve(channel, timeout=60)
    channel.put((r.complete, r.buckets,
                 {n: float(t.sum()) for n, t in weights.items()}))
    channel.get(60)  # the trainer's word to go
    os._exit(0)
