"""allocconf.transfer's protocol for real engines, without a
GPU: plans kept while the layout holds, tied weights sent once, tensors
split across buckets reassembled, the sender's GPU found by UUID, casts,
one call a sync over a channel, and the faults (a silent receiver, a
receiver that cannot take a bucket, aborts, restarts, close).  The host
stand-in (allocconf.transfer.testing) logs what the CUDA path would
do; tests/gpu/transfer/test_transfer_gpu.py runs the real thing."""
import os
import pickle
import queue
import sys
import threading
import time

import pytest

from helpers import TESTS_DIR, torch_facts

EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")

torch_facts()  # skips this module without torch
import torch  # noqa: E402

from allocconf import transfer  # noqa: E402
from allocconf.transfer import _copies  # noqa: E402
from allocconf.transfer import (Bucket, Channel, Receiver,  # noqa: E402
                                Sender, TransferError)
from allocconf.transfer.testing import HostDevice  # noqa: E402


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def pair(capacity=4096, buffers=2, **kw):
    log = []
    return (Sender(capacity, buffers, device=HostDevice(log=log), **kw),
            Receiver(device=HostDevice(log=log)), log)


def run(sender, receiver, src, dst=None, **kw):
    """One sync through a pickling channel; the messages as received."""
    msgs, acks = [], []
    for msg in sender.send(src, receive_ack=acks.pop, **kw):
        msg = pickle.loads(pickle.dumps(msg))
        msgs.append(msg)
        ack = (receiver.load(msg, dst) if dst is not None
               else receiver.load(msg))
        acks.insert(0, pickle.loads(pickle.dumps(ack)))
    sender.drain(acks.pop)
    return msgs


def weights(seed=0, n=12, size=37):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(size + i, generator=g) for i in range(n)}


# -- plans ---------------------------------------------------------------------

def test_a_plan_is_taught_once_and_then_messages_carry_no_entries():
    sender, receiver, _ = pair(1024)
    dst = {k: torch.zeros_like(v) for k, v in weights().items()}
    first = run(sender, receiver, weights(0), dst)
    assert all(m.entries is not None for m in first)
    for step in range(1, 4):
        src = weights(step)  # new tensors, the same layout
        later = run(sender, receiver, src, dst)
        assert all(m.entries is None for m in later), step
        assert {m.plan for m in later} == {first[0].plan}
        assert all(same_bits(src[k], dst[k]) for k in src)
    # What travels per bucket no longer holds its tensors.
    assert max(len(pickle.dumps(m)) for m in later) < min(
        len(pickle.dumps(m)) for m in first)
    assert max(len(pickle.dumps(m)) for m in later) < 400


@pytest.mark.parametrize("change", ["a name", "a shape", "one more",
                                    "one fewer", "a dtype"])
def test_a_changed_layout_makes_a_new_plan_and_arrives_whole(change):
    sender, receiver, _ = pair(512)
    base = weights(n=10, size=30)
    run(sender, receiver, base, {k: torch.zeros_like(v)
                                 for k, v in base.items()})
    run(sender, receiver, base, {k: torch.zeros_like(v)
                                 for k, v in base.items()})
    src = dict(base)
    if change == "a name":
        src["w5b"] = src.pop("w5")
    elif change == "a shape":
        src["w5"] = torch.randn(99)
    elif change == "one more":
        src["extra"] = torch.randn(7)
    elif change == "one fewer":
        del src["w9"]
    else:
        src["w3"] = src["w3"].to(torch.float64)
    for _ in range(3):  # the new plan is taught, then used bare
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        msgs = run(sender, receiver, src, dst)
        assert all(same_bits(src[k], dst[k]) for k in src), change
    assert all(m.entries is None for m in msgs)
    assert msgs[0].plan != run(sender, receiver, base, {
        k: torch.zeros_like(v) for k, v in base.items()})[-1].plan


def test_a_receiver_that_does_not_know_the_plan_says_so_and_is_taught():
    sender, first, _ = pair(1024)
    src = weights()
    run(sender, first, src, {k: torch.zeros_like(v) for k, v in src.items()})
    run(sender, first, src, {k: torch.zeros_like(v) for k, v in src.items()})
    fresh = Receiver(device=HostDevice())  # a restarted engine
    to_engine, to_trainer = queue.Queue(), queue.Queue()
    trainer = Channel(to_engine, to_trainer)
    engine = Channel(to_trainer, to_engine)
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    errors = []

    def serve():
        try:
            fresh.serve(engine, into=dst, timeout=10)
        except TransferError as exc:
            errors.append(str(exc))
    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(TransferError, match="receiver could not take sync"):
        sender.sync(src, trainer, timeout=10)
    t.join()
    assert "not known here" in errors[0]
    # The sender teaches its plan again; the fresh engine takes it.
    t = threading.Thread(target=lambda: fresh.serve(engine, into=dst,
                                                    timeout=10))
    t.start()
    sender.sync(src, trainer, timeout=10)
    t.join()
    assert all(same_bits(src[k], dst[k]) for k in src)


# -- tied weights ----------------------------------------------------------------

def test_tied_weights_are_sent_once_and_arrive_under_every_name():
    sender, receiver, _ = pair(1 << 16)
    emb = torch.randn(64, 8)
    src = {"embed.weight": emb, "mid": torch.randn(5), "lm_head.weight": emb}
    (msg,) = list(sender.send(src))
    names = [e.name for e in msg.entries]
    assert names == ["embed.weight", "mid"]  # the bytes once
    assert msg.entries[0].aliases == ("lm_head.weight",)
    got = dict(receiver.named_tensors(msg))
    assert set(got) == set(src)
    assert got["lm_head.weight"] is got["embed.weight"]
    assert same_bits(got["lm_head.weight"], emb)
    sender.acknowledge(receiver.release(msg))
    # Into an engine that keeps them apart: both get it; one that ties
    # them too: one copy.
    apart = {k: torch.zeros_like(v) for k, v in src.items()}
    run(sender, receiver, src, apart)
    assert same_bits(apart["lm_head.weight"], emb)
    tied = torch.zeros_like(emb)
    together = {"embed.weight": tied, "mid": torch.zeros(5),
                "lm_head.weight": tied}
    run(sender, receiver, src, together)
    assert same_bits(tied, emb)


def test_a_refilled_scratch_tensor_needs_eager_and_is_refused_without(
        monkeypatch):
    sender, receiver, log = pair(1 << 16)
    runs = []  # the sender's programs run (each one launch or few)
    real_run = _copies.Program.run

    def counted(program):
        if program.into_buffer:
            runs.append(program)
        real_run(program)
    monkeypatch.setattr(_copies.Program, "run", counted)
    scratch = torch.empty(16)

    def gathered():
        for i in range(5):
            scratch.fill_(float(i))  # the same memory, refilled
            yield f"layer{i}", scratch
    dst = {f"layer{i}": torch.zeros(16) for i in range(5)}
    with pytest.raises(ValueError, match="'layer1' is at the address of an "
                       "earlier tensor whose copy has not run"):
        run(sender, receiver, gathered(), dst)
    assert sender.pending == 0
    del runs[:]
    run(sender, receiver, gathered(), dst, eager=True)
    # Each item's copy was queued before the next item was asked for (on
    # the current stream, so a refill queued after it runs after it).
    assert [float(dst[f"layer{i}"][0]) for i in range(5)] == [0, 1, 2, 3, 4]
    assert len(runs) == 5
    # Fresh tensors (what a gather usually gives) need no eager: their
    # copies wait for the bucket, one launch for many.
    fresh = ((f"layer{i}", torch.full((16,), float(i))) for i in range(5))
    del runs[:]
    run(sender, receiver, fresh, dst)
    assert [float(dst[f"layer{i}"][0]) for i in range(5)] == [0, 1, 2, 3, 4]
    assert len(runs) == 1


# -- split tensors and engine-shaped loading -------------------------------------

def test_named_tensors_reassembles_a_tensor_split_across_buckets():
    sender, receiver, _ = pair(1024, buffers=2)
    src = {"head": torch.randn(10), "big": torch.randn(1000),
           "tail": torch.randn(3)}
    for step in range(3):
        src = {k: torch.randn_like(v) for k, v in src.items()}
        got, acks = {}, []
        for msg in sender.send(src, receive_ack=acks.pop):
            for name, t in receiver.named_tensors(msg):
                assert name not in got
                got[name] = t.clone()  # views end at release
            acks.insert(0, receiver.release(msg))
        sender.drain(acks.pop)
        assert set(got) == set(src)
        assert all(same_bits(src[k], got[k]) for k in src), step
    assert len(receiver._whole) == 1  # one scratch, reused


def test_a_vllm_style_engine_loads_fused_weights_through_load_weights():
    sys.path.insert(0, EXAMPLES)
    from engine_standin import Engine, hf_weights

    hf = hf_weights(layers=3, hidden=16, seed=1)
    engine = Engine(layers=3, hidden=16)
    sender, receiver, _ = pair(2048)  # the embedding is split
    to_engine, to_trainer = queue.Queue(), queue.Queue()
    result = []
    t = threading.Thread(target=lambda: result.append(receiver.serve(
        Channel(to_trainer, to_engine), load_weights=engine.load_weights,
        timeout=10)))
    t.start()
    buckets = sender.sync(hf, Channel(to_engine, to_trainer), timeout=10)
    t.join()
    assert result[0].complete and result[0].buckets == buckets > 2
    assert engine.matches(hf)


# -- devices and casts -------------------------------------------------------------

def test_the_sender_gpu_is_found_by_uuid_in_the_receivers_numbering():
    log = []
    sender = Sender(1024, device=HostDevice("GPU-b", log=log))
    # The engine sees two GPUs, the sender's second (its own
    # CUDA_VISIBLE_DEVICES): it opens the buffer on its device 1.
    receiver = Receiver(device=HostDevice(log=log, visible=["GPU-a", "GPU-b"]))
    src = weights(n=3)
    run(sender, receiver, src, {k: torch.zeros_like(v)
                                for k, v in src.items()})
    assert {op[2] for op in log if op[0] == "open"} == {1}
    elsewhere = Receiver(device=HostDevice(visible=["GPU-a"]))
    (msg,) = list(Sender(1 << 16, device=HostDevice("GPU-b")).send(src))
    with pytest.raises(TransferError, match=r"sender's GPU \(GPU-b\) is not "
                       r"among the 1 this process sees"):
        elsewhere.load(msg, {k: torch.zeros_like(v) for k, v in src.items()})


@pytest.mark.parametrize("route", ["foreach", "copy_"])
def test_a_cast_while_packing_is_bit_exact_to_tensor_to(route, monkeypatch):
    if route == "copy_":
        monkeypatch.setattr(_copies.Program, "BIG", 1)
    g = torch.Generator().manual_seed(7)
    src = {"w": torch.randn(300, generator=g) * 1e3,
           "special": torch.tensor([float("nan"), float("inf"), -0.0,
                                    1e-40, 3.4e38, 1.00390625]),
           "ids": torch.arange(10)}  # int64: not cast
    sender, receiver, _ = pair(1 << 16)
    dst = {"w": torch.zeros(300, dtype=torch.bfloat16),
           "special": torch.zeros(6, dtype=torch.bfloat16),
           "ids": torch.zeros(10, dtype=torch.int64)}
    run(sender, receiver, src, dst, cast={torch.float32: torch.bfloat16})
    for k in src:
        want = src[k].to(torch.bfloat16) if src[k].is_floating_point() \
            else src[k]
        assert same_bits(want, dst[k]), k


@pytest.mark.parametrize("capacity", [transfer.ALIGN, 1001])
def test_a_cast_tensor_larger_than_a_buffer_is_split_and_exact(capacity):
    sender, receiver, _ = pair(capacity)
    src = {"big": torch.randn(1000) * 7, "odd": torch.randn(3)}
    want = {k: v.to(torch.bfloat16) for k, v in src.items()}
    got, acks = {}, []
    for msg in sender.send(src, receive_ack=acks.pop,
                           cast={torch.float32: torch.bfloat16}):
        for e in msg.entries:
            assert e.nbytes % 2 == 0  # whole bf16 elements in each piece
        got.update({k: v.clone() for k, v in receiver.named_tensors(msg)})
        acks.insert(0, receiver.release(msg))
    sender.drain(acks.pop)
    assert all(same_bits(want[k], got[k]) for k in src)


# -- one call a sync, and the faults ------------------------------------------------

def channels():
    to_engine, to_trainer = queue.Queue(), queue.Queue()
    return Channel(to_engine, to_trainer), Channel(to_trainer, to_engine)


def test_a_silent_receiver_raises_within_the_timeout_and_the_sender_recovers():
    sender, receiver, _ = pair(512, buffers=2)
    trainer, engine = channels()
    src = weights(n=8, size=60)  # more buckets than buffers
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="nothing came from the peer "
                       "within 0.3 s"):
        sender.sync(src, trainer, timeout=0.3)
    assert time.monotonic() - t0 < 5
    assert sender.pending == 0
    # The receiver, when it looks, finds a sync that ended early.
    res = receiver.serve(engine, into={k: torch.zeros_like(v)
                                       for k, v in src.items()}, timeout=5)
    assert res.complete is False
    assert receiver.complete is None and receiver.sync is not None
    # The next sync, with a receiver serving, is whole.
    while not engine.inbox.empty():
        engine.inbox.get()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    t = threading.Thread(target=lambda: receiver.serve(engine, into=dst,
                                                       timeout=10))
    t.start()
    sender.sync(src, trainer, timeout=10)
    t.join()
    assert all(same_bits(src[k], dst[k]) for k in src)
    assert receiver.complete == sender._syncs and receiver.sync is None


def test_a_source_that_raises_aborts_the_sync_and_the_engine_knows():
    sender, receiver, _ = pair(512, buffers=4)
    trainer, engine = channels()
    dst = {f"w{i}": torch.zeros(60) for i in range(6)}
    got = []
    t = threading.Thread(target=lambda: got.append(receiver.serve(
        engine, into=dst, timeout=10)))
    t.start()

    def failing():
        for i in range(6):
            if i == 4:
                raise RuntimeError("gather failed")
            yield f"w{i}", torch.full((60,), float(i))
    with pytest.raises(RuntimeError, match="gather failed"):
        sender.sync(failing(), trainer, timeout=10)
    t.join()
    assert got[0].complete is False
    assert receiver.complete is None


def test_a_bucket_the_engine_cannot_take_fails_both_sides_loudly():
    sender, receiver, _ = pair(1 << 16)
    trainer, engine = channels()
    src = {"a": torch.ones(4), "b": torch.ones(3)}
    errors = []

    def serve():
        try:
            receiver.serve(engine, into={"a": torch.zeros(4),
                                         "b": torch.zeros(5)}, timeout=10)
        except ValueError as exc:
            errors.append(str(exc))
    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(TransferError, match=r"'b' is float32\[5\]; the "
                       r"sender sent float32\[3\]"):
        sender.sync(src, trainer, timeout=10)
    t.join()
    assert errors and sender.pending == 0


def test_close_and_a_restarted_trainer_let_go_of_the_old_buffers():
    log = []
    receiver = Receiver(device=HostDevice(log=log))
    old = Sender(1024, device=HostDevice(log=log))
    src = weights(n=4)
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    run(old, receiver, src, dst)
    assert {s for s, _ in receiver._buffers} == {old.id}
    new = Sender(1024, device=HostDevice(log=log))  # the trainer restarted
    run(new, receiver, src, dst)
    assert {s for s, _ in receiver._buffers} == {new.id}
    assert not any(k[0] == old.id for k in receiver._plans)
    trainer, engine = channels()
    new.close(trainer)
    with pytest.raises(TransferError):  # nothing after the close
        receiver.serve(engine, into=dst, timeout=0.2)
    assert receiver._buffers == {} and receiver._plans == {}
    with pytest.raises(RuntimeError, match="closed"):
        list(new.send(src))


def test_bound_targets_are_checked_once_and_rebound_after_a_reload():
    sender, receiver, _ = pair(1024)
    src = weights(n=6)
    engine = {k: torch.zeros_like(v) for k, v in src.items()}
    receiver.bind(engine)
    for step in range(3):
        src = weights(seed=step, n=6)
        run(sender, receiver, src)
        assert all(same_bits(src[k], engine[k]) for k in src)
    reloaded = {k: torch.zeros_like(v) for k, v in src.items()}
    receiver.bind(reloaded)
    run(sender, receiver, src)
    assert all(same_bits(src[k], reloaded[k]) for k in src)
    with pytest.raises(ValueError, match="needs into=, or targets bound"):
        receiver.bind(None)
        run(sender, receiver, src)


def test_the_copies_run_on_the_current_stream_with_their_sources_held():
    import gc
    import weakref

    sender, receiver, log = pair(1 << 16, buffers=2)
    src = weights(n=3)
    alive = [weakref.ref(t) for t in src.values()]
    del log[:]
    (msg,) = list(sender.send(src))
    # On the current stream, no other entered and left: the event
    # recorded after the copies, and an optimizer step queued next runs
    # after them in stream order.
    assert [op[0] for op in log] == ["record"]
    # The caller lets go of its tensors: the sender holds them with the
    # buffer until it is packed again, after the receiver's Ack.
    del src
    gc.collect()
    assert all(r() is not None for r in alive)
    sender.acknowledge(receiver.release(msg))
    for _ in range(2):  # both buffers taken again
        run(sender, receiver, weights(n=1), {"w0": torch.zeros(37)})
    gc.collect()
    assert all(r() is None for r in alive)


def test_a_bucket_that_tiles_as_int64_is_one_launch_each_way(monkeypatch):
    # Tensors of whole int64 words, each at an ALIGN-ed offset: the
    # sender's copies are one torch.cat over the bucket (the alignment
    # gaps filled); the receiver's, into its bound targets, one
    # _foreach_copy_ of them all as int64 (all under _Lanes.SMALL), and
    # into= targets one split_with_sizes_copy; nothing copied tensor by
    # tensor.
    calls = []
    for name in ("cat", "split_with_sizes_copy", "_foreach_copy_"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _n=name, _r=real, **k:
                            calls.append(_n) or _r(*a, **k))
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, *a, **k:
                        calls.append("copy_") or real_copy(self, *a, **k))
    sender, receiver, _ = pair(1 << 16)
    src = {f"w{i}": torch.randn(2 * (5 + i)) for i in range(10)}  # gaps
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    receiver.bind(dst)
    for step in range(3):
        for v in src.values():
            v.add_(1)
        del calls[:]
        (msg,) = run(sender, receiver, src)
        assert calls == ["cat", "_foreach_copy_"], step
        assert all(same_bits(src[k], dst[k]) for k in src), step
    other = {k: torch.zeros_like(v) for k, v in src.items()}
    del calls[:]
    run(sender, receiver, src, other)
    assert calls == ["cat", "split_with_sizes_copy"]
    assert all(same_bits(src[k], other[k]) for k in src)


def test_a_sync_that_does_not_wait_leaves_its_acks_to_the_next():
    sender, receiver, _ = pair(1024, buffers=6)
    trainer, engine = channels()
    src = weights(n=8, size=100)  # 4 buckets: a sync fits the buffers
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    served = []
    t = threading.Thread(target=lambda: served.extend(
        receiver.serve(engine, into=dst, timeout=10) for _ in range(3)))
    t.start()
    for step in range(3):
        for v in src.values():
            v.mul_(2)
        want = {k: v.clone() for k, v in src.items()}
        sent = sender.sync(src, trainer, timeout=10, wait=False)
        assert sent > 1 and sender.pending > 0  # the engine still reading
        if step < 2:  # the next sync takes them when it needs the buffers
            t.join(0.05)
        while receiver.complete != sender._syncs:
            time.sleep(0.01)
        assert all(same_bits(want[k], dst[k]) for k in src), step
    sender.drain(trainer, timeout=10)
    t.join(10)
    assert sender.pending == 0
    assert [r.complete for r in served] == [True] * 3
    with pytest.raises(TransferError, match="within 0.2 s"):
        sender.sync(src, trainer, timeout=0.2)  # nobody serves: loud
    assert sender.pending == 0


# -- what a sync puts when, and what it replays from a CUDA graph --------------

class Logged(Channel):
    """A channel whose puts go into the ops' log, so the order of records
    and puts is seen."""

    def __init__(self, log, outbox, inbox):
        super().__init__(outbox, inbox)
        self.log = log

    def put(self, obj):
        self.log.append(("put", obj.seq, obj.buffer) if isinstance(
            obj, Bucket) else ("put", obj))
        super().put(obj)


def synced(sender, receiver, src, buffers_log, dst=None):
    """One Sender.sync over a logged channel, served in a thread."""
    to_engine, to_trainer = queue.Queue(), queue.Queue()
    trainer = Logged(buffers_log, to_engine, to_trainer)
    engine = Channel(to_trainer, to_engine)
    got = []
    t = threading.Thread(target=lambda: got.append(
        receiver.serve(engine, into=dst, timeout=10)))
    t.start()
    sent = sender.sync(src, trainer, timeout=10)
    t.join(10)
    assert got and got[0].complete and got[0].buckets == sent
    return sent


@pytest.mark.parametrize("buffers, buckets", [(4, 3), (2, 4)])
def test_each_bucket_is_put_once_its_copies_are_queued(buffers, buckets):
    # 3 buckets in 4 buffers (it fits), 4 through 2 (a buffer comes back
    # before it is packed again): either way, each bucket's event is
    # recorded after its copies and its message put at once, before the
    # next bucket is packed, so that the engine reads it while the
    # trainer packs the next and never waits on a message held back.
    sender, receiver, log = pair(1024, buffers=buffers)
    src = weights(n=2 * buckets, size=100)
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    for step in range(2):
        for v in src.values():
            v.add_(1)
        del log[:]
        assert synced(sender, receiver, src, log, dst) == buckets  # no deadlock
        events = [bytes(e) for e, _ in sender._events]
        trainer = [op for op in log if op[0] == "put"
                   or (op[0] == "record" and op[1] in events)]
        puts = [op for op in trainer if op[0] == "put"]
        assert [op[1] for op in puts] == list(range(buckets)), step
        assert trainer == [op for put in puts for op in (
            ("record", events[put[2]]), put)], step
        assert all(same_bits(src[k], dst[k]) for k in src), step


class GraphOps(HostDevice):
    """A HostDevice that "captures" copies the way CUDA's graph does: the
    functions given, run again at each replay, and the capture and each
    replay logged; with `refuse`, capture fails (None)."""

    def __init__(self, log, refuse=False):
        super().__init__(log=log)
        self.refuse = refuse

    def graph(self, branches):
        self.log.append(("capture", len(branches)))
        if self.refuse:
            return None

        def replay():
            self.log.append(("replay",))
            for fn in branches:
                fn()
        return replay


@pytest.mark.parametrize("refuse", [False, True])
def test_kept_copies_are_captured_once_and_replayed(refuse):
    log = []
    # One buffer: every sync packs bucket k into the same buffer, so the
    # copies kept per (bucket, buffer) are all made by the first sync.
    sender = Sender(1024, buffers=1, device=GraphOps(log, refuse))
    receiver = Receiver(device=GraphOps(log, refuse))
    src = weights(n=6, size=100)  # 3 buckets
    src["big"] = torch.randn(600)  # 2400 bytes: split across buckets
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    receiver.bind(dst)
    captures = []
    for step in range(3):
        for v in src.values():
            v.add_(1)
        del log[:]
        msgs = run(sender, receiver, src)
        assert all(same_bits(src[k], dst[k]) for k in src), step
        captures.append(sum(op[0] == "capture" for op in log))
        replays = sum(op[0] == "replay" for op in log)
        # The first sync captures each bucket's copies on both sides
        # (the receiver's lanes: up to 4 branches); later ones replay
        # them, or run them eagerly where capture failed.
        assert replays == (0 if refuse else 2 * len(msgs)), step
    assert captures[0] == 2 * len(msgs) and captures[1:] == [0, 0]
    # What is not kept is never captured: a generator's copies, and a
    # receiver's into= copies.
    del log[:]
    other = {k: torch.zeros_like(v) for k, v in src.items()}
    run(sender, receiver, iter(list(src.items())), other)
    assert all(same_bits(src[k], other[k]) for k in src)
    assert not any(op[0] in ("capture", "replay") for op in log)
    # A tensor given new memory: the first bucket's replay was queued
    # before the check, which sends the sync again from the new memory
    # (new copies, captured); what arrives is the new value.
    src["w0"].data = torch.full_like(src["w0"], 7.0)
    del log[:]
    run(sender, receiver, src)
    assert torch.equal(dst["w0"], torch.full_like(dst["w0"], 7.0))
    assert all(same_bits(src[k], dst[k]) for k in src)


# -- what a sync counts, and arguments refused at once ----------------------------

@pytest.mark.parametrize("how", ["into", "bound", "load_weights"])
def test_sync_result_counts_tensors_not_pieces(how):
    # One tensor over three buckets is one tensor; a tied name counts as
    # the tensor it names (load_weights gets it under both names).
    sender, receiver, _ = pair(1024, buffers=3)
    big = torch.randn(600)  # 2400 bytes: three pieces of a 1 KiB buffer
    src = {"big": big, "small": torch.randn(5), "tied": big}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    got = []
    trainer, engine = channels()
    kw = {"into": dst} if how == "into" else {}
    if how == "bound":
        receiver.bind(dst)
    if how == "load_weights":
        kw = {"load_weights": lambda batch: got.extend(n for n, _ in batch)}
    th = threading.Thread(target=lambda: got.append(
        receiver.serve(engine, timeout=10, **kw)))
    th.start()
    buckets = sender.sync(src, trainer, timeout=10)
    th.join(20)
    result = got.pop()
    assert result.complete and result.buckets == buckets == 3
    assert result.tensors == 3
    if how == "load_weights":
        assert sorted(got) == ["big", "small", "tied"]
    else:
        assert all(same_bits(src[k], dst[k]) for k in src)


@pytest.mark.parametrize("swap", [True, False])
def test_sender_sync_refuses_a_wrong_type_argument_at_once_by_name(swap):
    sender, _, _ = pair(1024)
    trainer, _ = channels()
    src = weights(n=2)
    args, name = (((trainer, src), "tensors") if swap
                  else ((src, queue.Queue()), "channel"))
    t0 = time.monotonic()
    with pytest.raises(TypeError, match=f"{name} must be"):
        sender.sync(*args, timeout=30)
    assert time.monotonic() - t0 < 5  # not after the 30 s timeout
    assert sender.pending == 0 and trainer.outbox.empty()
    # a model's tensor alone is not a state dict either
    with pytest.raises(TypeError, match="tensors must be .* got Tensor"):
        sender.sync(src["w0"], trainer)
