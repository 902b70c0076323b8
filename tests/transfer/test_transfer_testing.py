"""allocconf.transfer.testing, the public CPU stand-in: a user's own
wiring (threads, their queues, their load_weights) syncs bit-exact on a
CPU through the public API alone, and the faults it injects (a silent
peer, a dead one) fail the way a real one does: after the timeout, or at
once.  (Processes: tests/transfer/test_transfer_channel.py and
tests/transfer/test_transfer_ray.py run engines on it in children and
actors.)"""
import os
import queue
import sys
import threading
import time

import pytest

from helpers import TESTS_DIR, torch_facts

torch_facts()  # skips this module without torch
import torch  # noqa: E402

from allocconf.transfer import (Channel, Receiver, Sender,  # noqa: E402
                                Targets, TransferError, Writer)
from allocconf.transfer.testing import (Device, HostDevice,  # noqa: E402
                                        dead_after, silent_after)

sys.path.insert(0, os.path.join(os.path.dirname(TESTS_DIR), "examples"))
from engine_standin import Engine, hf_weights  # noqa: E402


def channels():
    to_engine, to_trainer = queue.Queue(), queue.Queue()
    return Channel(to_engine, to_trainer), Channel(to_trainer, to_engine)


def serve_in_thread(fn, *args, **kw):
    out = []
    th = threading.Thread(target=lambda: out.append(_catch(fn, *args, **kw)))
    th.start()
    return th, out


def _catch(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except Exception as exc:
        return exc


def test_a_host_device_is_a_device_and_a_bad_one_is_refused():
    assert isinstance(HostDevice(), Device)
    with pytest.raises(TypeError, match="uuid must be a str"):
        HostDevice(3)


def test_your_own_wiring_and_load_weights_sync_bit_exact_in_both_modes():
    hf = hf_weights(layers=2, hidden=16, vocab=40, seed=1)
    # buckets: the engine's load_weights fuses q/k/v and gate/up
    engine = Engine(layers=2, hidden=16, vocab=40)
    sender, receiver = Sender(4096, device=HostDevice()), Receiver(
        device=HostDevice())
    trainer, engine_side = channels()
    th, out = serve_in_thread(receiver.serve, engine_side,
                              load_weights=engine.load_weights, timeout=10)
    sender.sync(hf, trainer, timeout=10)
    th.join(20)
    assert out[0].complete and engine.matches(hf)
    # one copy: the trainer writes straight into the engine's tensors
    engine = Engine(layers=2, hidden=16, vocab=40)
    targets = Targets(engine.targets(), device=HostDevice())
    writer = Writer(device=HostDevice(), timeout=10)
    th, out = serve_in_thread(targets.serve, engine_side, timeout=10)
    written = writer.sync(hf, trainer)
    th.join(20)
    assert out[0].complete and written.complete and engine.matches(hf)


def test_a_silent_peer_times_out_and_a_dead_one_fails_at_once():
    src = {f"w{i}": torch.full((100,), float(i)) for i in range(6)}
    sender = Sender(1024, buffers=2, device=HostDevice())  # 3 buckets
    trainer, engine_side = channels()
    receiver = Receiver(device=HostDevice())
    th, out = serve_in_thread(receiver.serve, engine_side,
                              into={k: torch.zeros_like(v)
                                    for k, v in src.items()}, timeout=1)
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="nothing came from the peer "
                                            "within 0.3 s"):
        sender.sync(src, silent_after(trainer, 2), timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5
    th.join(20)  # the engine got two buckets, then nothing
    assert isinstance(out[0], TransferError) and receiver.sync == 1
    # A dead engine: the next put fails at once, far within the timeout.
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="closed the channel"):
        sender.sync(src, dead_after(trainer, 0), timeout=30)
    assert time.monotonic() - t0 < 5 and sender.pending == 0
    # A restarted engine on a new channel gets a whole sync.
    trainer, engine_side = channels()
    fresh = Receiver(device=HostDevice())
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    th, out = serve_in_thread(fresh.serve, engine_side, into=dst,
                              timeout=10)
    sender.sync(src, trainer, timeout=10)
    th.join(20)
    assert out[0].complete and all(torch.equal(src[k], dst[k]) for k in src)


def test_a_dead_peers_earlier_answers_are_still_read():
    got = Channel(queue.Queue(), queue.Queue())
    got.inbox.put("answer")
    dead = dead_after(got, 1)
    dead.put("question")  # taken by the peer before it died
    assert got.outbox.get_nowait() == "question"
    assert dead.get(5) == "answer"
    with pytest.raises(TransferError, match="closed the channel"):
        dead.get(5)
    with pytest.raises(TransferError, match="closed the channel"):
        dead.put("another")


def test_fault_arguments_and_one_copy_across_processes_are_refused():
    with pytest.raises(TypeError, match="channel must be a Channel"):
        silent_after(queue.Queue(), 1)
    with pytest.raises(ValueError, match="after must be an int >= 0"):
        dead_after(Channel(queue.Queue(), queue.Queue()), -1)
    # An engine's own tensor is shared within its process only.
    with pytest.raises(TransferError, match="within one process only"):
        HostDevice().open(("here", os.getpid() + 1, 0), 0)
