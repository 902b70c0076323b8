"""benchmarks/transfer/ipc_sync.py weighs each of the Sender's mechanisms
by turning it off ("transfer-no-NAME"): each switch must turn off what
it names and nothing of the result, or the A/B it prints measures
nothing.  Checked on the CPU with allocconf.transfer.testing."""
import os
import sys
import threading

import pytest
import torch

from allocconf.transfer import Channel, Receiver, Sender, _copies, _replay
from allocconf.transfer.testing import HostDevice

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def ipc_sync():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "transfer"))
    argv, sys.argv = sys.argv, ["ipc_sync.py"]  # it reads its options
    try:
        import ipc_sync
    finally:
        sys.argv = argv
        sys.path.pop(0)
    return ipc_sync


class GraphDevice(HostDevice):
    """A HostDevice whose copies "capture": counts the captures."""

    def __init__(self):
        super().__init__()
        self.captures = 0

    def graph(self, branches):
        self.captures += 1

        def replay():
            for b in branches:
                b()
        return replay


def three_syncs(ipc_sync, off):
    """Three syncs of one state dict, its values changed before each,
    with `off` turned off: (what the receiver said of each, the engine's
    weights equal the trainer's, whether each message carried entries,
    the order of copies run, checks and messages put in the first
    replay, the captures)."""
    trainer_end, engine_end = Channel.pipes(timeout=30)
    named = {f"w{i}": torch.full((1000 + i,), float(i), dtype=torch.bfloat16)
             for i in range(40)}
    engine = {k: torch.zeros_like(v) for k, v in named.items()}
    receiver = Receiver(device=HostDevice())
    receiver.bind(engine)
    device = GraphDevice()
    sender = Sender(16 << 10, buffers=2, device=device, timeout=30)
    order, entries = [], []
    runs, still = _copies.Program.run, _replay.Sources.still
    put = trainer_end.put

    def run(self):
        order.append("run")
        return runs(self)

    def check(self, tensors):
        order.append("check")
        return still(self, tensors)

    def recorded(msg):
        if type(msg).__name__ == "Bucket":
            entries.append(msg.entries is not None)
            order.append("put")
        put(msg)

    trainer_end.put = recorded
    ipc_sync.without(off, sender)
    served = []
    thread = threading.Thread(target=lambda: served.extend(
        receiver.serve(engine_end, timeout=30).complete for _ in range(3)))
    thread.start()
    try:
        _copies.Program.run, _replay.Sources.still = run, check
        for n in range(3):
            for v in named.values():
                v.add_(1)
            if n == 1:
                order.clear()
            if n == 2:
                first_replay = list(order)
            sender.sync(named, trainer_end, wait=False)
            sender.drain(trainer_end)
        thread.join(30)
    finally:
        _copies.Program.run, _replay.Sources.still = runs, still
        ipc_sync.restore()
    equal = all(torch.equal(engine[k], named[k]) for k in named)
    return served, equal, entries, first_replay, device.captures


def test_each_switch_turns_off_what_it_names_and_the_sync_stays_exact(
        ipc_sync):
    on = three_syncs(ipc_sync, "")
    assert on[0] == [True] * 3 and on[1]
    assert on[2][-1] is False          # a known plan is not sent again
    # The first bucket's copies, then the check; the bucket put, then
    # the next one's copies.
    assert on[3][:4] == ["run", "check", "put", "run"]
    assert on[4] > 0                   # kept copies captured
    for off in ipc_sync.MECHANISMS:
        got = three_syncs(ipc_sync, off)
        assert got[0] == [True] * 3 and got[1], off
        if off == "plan":
            assert all(got[2]), off
        elif off == "early":
            assert got[3][:2] == ["check", "run"], off
        elif off == "replay":
            assert "check" not in got[3], off
        elif off == "graph":
            assert got[4] == 0, off
        else:  # guard, runs: the same steps (checked below)
            assert got[2:] == on[2:], off


def test_the_process_wide_switches_are_undone(ipc_sync):
    before = (_replay.PTRS_EQUAL, _replay.TENSOR_GUARDS,
              _copies.Program.RUNS)
    sender = Sender(1 << 12, device=HostDevice())
    ipc_sync.without("guard", sender)
    ipc_sync.without("runs", sender)
    assert (_replay.PTRS_EQUAL, _replay.TENSOR_GUARDS,
            _copies.Program.RUNS) == (None, None, False)
    ipc_sync.restore()
    assert (_replay.PTRS_EQUAL, _replay.TENSOR_GUARDS,
            _copies.Program.RUNS) == before
