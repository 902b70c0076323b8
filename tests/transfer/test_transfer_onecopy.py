"""allocconf.transfer's one-copy mode without a GPU: the
engine's target map (fused rows, tied names, refusals), the consent
handshake (what waits for what, in order), the checks made before any
copy, the faults (a failure part-way, a silent peer, a stale map, close),
and the copies themselves (bit for bit, casts as Tensor.to).  The host
stand-in (allocconf.transfer.testing) makes storages CPU tensors of
this process and logs each record, wait and stream step; the GPU tests
(tests/gpu/transfer/test_onecopy_gpu.py) prove the real thing across
processes."""
import os
import pickle
import queue
import re
import sys
import threading
import time

import pytest

from helpers import TESTS_DIR, run_json, torch_facts

EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")

torch_facts()  # skips this module without torch
import torch  # noqa: E402

from allocconf.transfer import (Channel, Offer, TargetMap,  # noqa: E402
                                Targets, TransferError, Writer, Written)
from allocconf.transfer.testing import HostDevice  # noqa: E402

sys.path.insert(0, EXAMPLES)
from engine_standin import Engine, hf_weights  # noqa: E402


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


class Link:
    """An engine's Targets and a trainer's Writer over a pickling channel
    (two queues); one log for both sides, each entry tagged.  `small`:
    the Writer's SMALL (bytes under which copies are batched)."""

    def __init__(self, targets, small=None):
        self.log = []
        self.to_trainer, self.to_engine = queue.Queue(), queue.Queue()
        self.engine_ops = HostDevice(log=_Tag(self.log, "engine"))
        self.targets = Targets(targets, device=self.engine_ops)
        writer = (Writer if small is None else
                  type("SmallWriter", (Writer,), {"SMALL": small}))
        self.writer = writer(device=HostDevice(log=_Tag(self.log, "trainer")))
        self.engine_side = Channel(_Pickling(self.to_trainer),
                                   self.to_engine)
        self.trainer_side = Channel(_Pickling(self.to_engine),
                                    self.to_trainer)

    def sync(self, tensors, **kw):
        """One sync: the engine serves in a thread, the trainer writes;
        (the engine's SyncResult, the trainer's Written or exception)."""
        out = {}
        t = threading.Thread(target=lambda: out.setdefault(
            "r", _catch(self.targets.serve, self.engine_side, timeout=10)))
        t.start()
        w = _catch(self.writer.sync, tensors, self.trainer_side, **kw)
        t.join(timeout=20)
        assert not t.is_alive()
        return out["r"], w


class _Tag(list):
    def __init__(self, log, who):
        super().__init__()
        self.shared, self.who = log, who

    def append(self, entry):
        self.shared.append((self.who,) + entry)


class _Pickling:
    """A queue that pickles what is put, as a process boundary would."""

    def __init__(self, q):
        self.q = q

    def put(self, obj):
        self.q.put(pickle.loads(pickle.dumps(obj)))


def _catch(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except Exception as exc:  # returned, to be asserted on
        return exc


def engine(layers=2, hidden=8, vocab=16, dtype=torch.float32):
    return Engine(layers, hidden, vocab, dtype=dtype)


# -- the map -------------------------------------------------------------------


def test_fused_targets_share_one_storage_each_and_the_map_pickles_small():
    e = engine()
    targets = Targets(e.targets(), device=HostDevice())
    m = pickle.loads(pickle.dumps(targets.map))
    assert isinstance(m, TargetMap)
    assert len(m.storages) == len(e.params)  # each parameter's storage once
    byname = {t.name: t for t in m.targets}
    q = byname["model.layers.0.self_attn.q_proj.weight"]
    k = byname["model.layers.0.self_attn.k_proj.weight"]
    assert q.storage == k.storage and k.offset == q.nbytes  # rows follow
    assert "lm_head.weight" not in byname
    assert len(pickle.dumps(m)) < 200 * len(m.targets)


def test_targets_are_refused_with_the_name_and_the_way_out():
    e = engine()
    bad = dict(e.targets())
    w = e.params["model.layers.0.mlp.down_proj.weight"]
    bad["cols"] = w[:, :3]  # columns of a parameter: not one byte range
    with pytest.raises(ValueError, match="'cols' is not contiguous"):
        Targets(bad, device=HostDevice())
    with pytest.raises(ValueError, match=r"'a'.*'b'.*overlap"):
        Targets({"a": w[0:3], "b": w[2:5]}, device=HostDevice())
    with pytest.raises(TypeError, match="names must be str"):
        Targets({1: w}, device=HostDevice())
    with pytest.raises(ValueError) as info:
        Targets(e.targets(), device=HostDevice(capable=False))
    msg = str(info.value)
    assert "'model.embed_tokens.weight'" in msg
    assert "ipc_safe()" in msg and "bucketed mode" in msg


def test_memory_torch_cannot_share_is_refused_naming_the_target():
    class NoShare(HostDevice):
        def share(self, buf):
            raise RuntimeError("cudaIpcGetMemHandle: invalid argument")

    with pytest.raises(ValueError, match=r"'w'.*invalid argument"):
        Targets({"w": torch.zeros(4)}, device=NoShare())


# -- a sync, and what waits for what -------------------------------------------


def test_a_sync_lands_in_fused_rows_bit_for_bit_after_the_engines_consent():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=1)
    r, w = link.sync(hf)
    assert isinstance(w, Written) and w.complete, w
    assert r.complete and r.sync == 1 and r.error is None
    assert e.matches(hf)
    assert link.targets.complete == 1 and link.targets.sync is None
    log = [x for x in link.log if x[1] in ("record", "wait")]
    engine_ev = next(x for x in log if x[:2] == ("engine", "record"))[2]
    # The engine records its event (after its last forward); the trainer's
    # stream waits for it before the copies and records its own after
    # them; the engine's stream waits for that.
    assert log[0] == ("engine", "record", engine_ev)
    assert log[1] == ("trainer", "wait", engine_ev)
    assert log[2][:2] == ("trainer", "record")
    assert log[3] == ("engine", "wait", log[2][2]) and len(log) == 4
    assert w.tensors == len(e.targets())  # lm_head: tied, written once


def test_the_second_sync_replays_the_copies_and_sees_in_place_updates():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=2)
    link.sync(hf)
    copies = link.writer._copies
    with torch.no_grad():
        for t in hf.values():
            t.mul_(3)  # an optimizer step: in place
    r, w = link.sync(hf)
    assert link.writer._copies is copies
    assert r.complete and e.matches(hf)


def test_a_source_given_new_memory_is_written_from_the_new_memory():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=3)
    link.sync(hf)
    copies = link.writer._copies
    name = "model.layers.1.mlp.up_proj.weight"
    hf[name].data = torch.full_like(hf[name], 7.0)  # .data = : new memory
    r, w = link.sync(hf)
    assert r.complete and e.matches(hf)
    assert link.writer._copies is not copies


@pytest.mark.parametrize("change", ["others", "round trip"])
def test_other_tensors_after_a_replay_are_written_from_themselves(change):
    # The copies kept run before the check (while it runs, the device
    # copies); tensors that are not the ones they were made of are then
    # written again from themselves before the engine is told.  A tensor
    # seen with another shape and back again is the same tensor: its
    # copies stay, and carry what was written through the other shape.
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=5)
    link.sync(hf)
    copies = link.writer._copies
    if change == "others":  # as many tensors, each a new one (tied: one)
        made = {}
        hf = {k: made.setdefault(v.data_ptr(), v + 1)
              for k, v in hf.items()}
    else:  # the same memory with another shape, written, then back
        name = "model.layers.0.mlp.up_proj.weight"
        t = hf[name]
        t.data = t.view(t.shape[1], t.shape[0])
        t.fill_(3.0)
        t.data = t.view(t.shape[1], t.shape[0])
    r, w = link.sync(hf)
    assert r.complete and e.matches(hf)
    assert (link.writer._copies is copies) == (change == "round trip")


@pytest.mark.parametrize("replays", [0, 2])
def test_a_tensor_restrided_in_place_is_refused_and_the_engine_told(
        replays):
    # The same object, address, dtype and shape, strides that read other
    # memory: the kept copies (run before the check) wrote its old bytes,
    # so the sync must not count as complete; it is refused as any tensor
    # that is not contiguous is.  After a replay the check is torch's
    # one-call guard, before it tensor by tensor.
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=5)
    for _ in range(1 + replays):
        r, w = link.sync(hf)
        assert r.complete and e.matches(hf)
    assert (link.writer._copies.sources._guard is not None) == (replays > 0)
    t = hf["model.norm.weight"]
    t.set_(t.untyped_storage(), t.storage_offset(), t.shape, (0,))
    r, w = link.sync(hf)
    assert isinstance(w, ValueError), w
    assert "'model.norm.weight' is not contiguous" in str(w)
    assert not r.complete and r.error.startswith("ValueError")


def test_casts_are_bit_exact_to_tensor_to_small_and_large():
    g = torch.Generator().manual_seed(4)
    src = {"big": torch.randn(3000, generator=g) * 1e3,
           "small": torch.randn(7, generator=g),
           "keep": torch.randint(-9, 9, (5,), generator=g)}
    dst = {"big": torch.zeros(3000, dtype=torch.bfloat16),
           "small": torch.zeros(7, dtype=torch.bfloat16),
           "keep": torch.zeros(5, dtype=torch.int64)}
    link = Link(dst, small=4096)  # "big" is its own copy, the rest batched
    r, w = link.sync(src, cast={torch.float32: torch.bfloat16})
    assert r.complete, w
    for n in src:
        want = src[n].to(dst[n].dtype)
        assert same_bits(dst[n], want), n


def test_uncast_copies_keep_nan_payloads_bit_for_bit():
    raw = torch.tensor([0x7FC00001, 0x7F800123, 0xFFC0BEEF, 1],
                       dtype=torch.int64).to(torch.int32)
    src = {"odd": raw.view(torch.float32),
           "half": torch.tensor([0x7E01, 0x7C01, 3],
                                dtype=torch.int16).view(torch.float16)}
    dst = {n: torch.zeros_like(t) for n, t in src.items()}
    link = Link(dst)
    r, w = link.sync(src)
    assert r.complete, w
    for n in src:
        assert same_bits(dst[n], src[n]), n


def test_engine_tied_targets_are_written_once_and_untied_sources_refused():
    shared = torch.zeros(6)
    link = Link({"embed": shared, "head": shared})
    w = torch.arange(6.0)
    r, got = link.sync({"embed": w, "head": w})
    assert r.complete and torch.equal(shared, w)
    copies = link.writer._copies
    assert sum(len(d) if k == "each" else 1
               for lane in copies.lanes_of for k, d, _ in lane) == 1
    r, got = link.sync({"embed": w, "head": w + 1})
    assert isinstance(got, ValueError) and "'head'" in str(got)
    assert not r.complete and "same engine memory" in r.error


# -- checked before any copy ---------------------------------------------------


@pytest.mark.parametrize("change, error, words", [
    (lambda hf: hf.update(extra=torch.zeros(2)), KeyError, "'extra'"),
    (lambda hf: hf.pop("model.norm.weight"), ValueError,
     "'model.norm.weight'"),
    (lambda hf: hf.update({"model.norm.weight": torch.zeros(9)}),
     ValueError, r"'model.norm.weight' is float32\[9\]"),
    (lambda hf: hf.update({"model.norm.weight": torch.zeros(
        8, dtype=torch.float64)}), ValueError, "float64"),
    (lambda hf: hf.update({"model.norm.weight": "w"}), TypeError,
     "not a tensor"),
])
def test_bad_input_is_refused_before_any_copy_and_the_engine_told(
        change, error, words):
    e = engine()
    link = Link(e.targets())
    good = hf_weights(2, 8, 16, seed=5)
    link.sync(good)
    before = {n: t.clone() for n, t in e.params.items()}
    hf = hf_weights(2, 8, 16, seed=6)
    change(hf)
    r, w = link.sync(hf)
    assert isinstance(w, error) and re.search(words, str(w)), w
    assert not r.complete and r.error.startswith(error.__name__)
    assert all(torch.equal(before[n], t) for n, t in e.params.items())
    # The engine knows: the sync is in doubt, the last complete one named.
    assert link.targets.sync == 2 and link.targets.complete == 1
    r, w = link.sync(good)
    assert r.complete and link.targets.sync is None
    assert link.targets.complete == 3 and e.matches(good)


def test_a_generator_failing_part_way_leaves_the_engine_knowing_it():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=7)

    def gathered():
        for i, (n, t) in enumerate(hf.items()):
            if i == 4:
                raise RuntimeError("all-gather failed")
            yield n, t.clone()  # freed by the caller after the yield

    r, w = link.sync(gathered())
    assert isinstance(w, RuntimeError) and "all-gather" in str(w)
    assert not r.complete and "all-gather failed" in r.error
    assert link.targets.sync == 1 and link.targets.complete is None
    # What was copied before the failure is there, the rest is not: the
    # engine's weights are partly written, as it was told.
    emb = e.params["model.embed_tokens.weight"]
    assert torch.equal(emb, hf["model.embed_tokens.weight"])
    assert not e.matches(hf)
    # and the event the engine waits on was recorded after those copies
    assert link.log[-2][:2] == ("trainer", "record")
    r, w = link.sync(iter(hf.items()))
    assert r.complete and e.matches(hf)


# -- consent, faults, lifecycle ------------------------------------------------


def test_offer_twice_and_a_mismatched_answer_are_refused():
    targets = Targets({"w": torch.zeros(3)}, device=HostDevice())
    offer = targets.offer()
    with pytest.raises(RuntimeError, match="sync 1 was offered"):
        targets.offer()
    with pytest.raises(ValueError, match="sync 1 is the one offered"):
        targets.accept(Written(targets.map.id, 2, b"x"))
    with pytest.raises(ValueError, match="not a Written for this map"):
        targets.accept(Written("other", 1, b"x"))
    assert targets.accept(Written(targets.map.id, offer.sync, b"x"))


def test_a_silent_trainer_times_out_and_the_offer_stands_until_answered():
    link = Link({"w": torch.zeros(3)})
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="within 0.2 s"):
        link.targets.serve(link.engine_side, timeout=0.2)
    assert time.monotonic() - t0 < 5
    assert link.targets.sync == 1  # in doubt
    # The trainer answers late: the next serve offers nothing new and
    # takes that answer.
    w = link.writer.sync({"w": torch.ones(3)}, link.trainer_side)
    r = link.targets.serve(link.engine_side, timeout=5)
    assert r.complete and r.sync == w.sync == 1
    assert link.to_trainer.empty()


def test_a_silent_engine_times_out_the_trainer():
    writer = Writer(device=HostDevice(), timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(TransferError, match="within 0.2 s"):
        writer.sync({}, Channel(queue.Queue(), queue.Queue()))
    assert time.monotonic() - t0 < 5


def test_a_reallocated_engine_refuses_to_offer_and_a_stale_map_is_not_written():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=8)
    link.sync(hf)
    old = link.targets
    name = "model.layers.0.self_attn.qkv_proj.weight"
    e.params[name].data = torch.zeros_like(e.params[name])  # a reload
    with pytest.raises(TransferError, match=r"target.*q_proj.*replaced"):
        old.offer()
    stale = Offer(old.map.id, 9, b"ev")
    # The engine re-exports; the trainer takes the new map with the offer.
    old.close(link.engine_side)
    link.targets = Targets(e.targets(), device=link.engine_ops)
    r, w = link.sync(hf)
    assert r.complete and e.matches(hf) and link.writer.map.id != old.map.id
    # An offer of the old map is refused, and nothing written through it.
    with pytest.raises(TransferError, match="stale"):
        link.writer.write(hf, stale)


def test_close_lets_the_trainer_release_its_mappings():
    e = engine()
    link = Link(e.targets())
    link.sync(hf_weights(2, 8, 16, seed=9))
    assert link.writer.map is not None
    link.targets.close(link.engine_side)
    with pytest.raises(TransferError):  # nothing else comes
        link.writer.sync({}, link.trainer_side, timeout=0.2)
    assert link.writer.map is None and not link.writer._views
    with pytest.raises(RuntimeError, match="closed"):
        link.targets.offer()
    link.writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        link.writer.write({}, Offer("m", 1, b""))


def test_the_copies_are_dealt_to_lanes_heaviest_first():
    dst = {f"t{i}": torch.zeros(n) for i, n in
           enumerate([4000, 3000, 2000, 1000, 4, 6, 8])}
    src = {n: torch.randn(t.numel()) for n, t in dst.items()}
    link = Link(dst, small=1024)
    r, w = link.sync(src)
    assert r.complete and all(torch.equal(dst[n], src[n]) for n in src)
    lanes = link.writer._copies.lanes_of
    assert len(lanes) == 4
    # the four large ones, one a lane; the three small ones (whole int64s)
    # batched in one launch
    assert sorted(k for lane in lanes for k, _, _ in lane) == [
        "each"] + ["one"] * 4


HOSTILE = """
import warnings, sys, threading, queue
warnings.simplefilter("error")
sys.path.insert(0, EXAMPLES)
import torch
from allocconf.transfer import Channel, Targets, Writer
from allocconf.transfer.testing import HostDevice
from engine_standin import Engine, hf_weights

class Name(str):
    def __str__(self):
        raise RuntimeError("a __str__ that raises")

e = Engine(1, 8, 16)
t = Targets(e.targets(), device=HostDevice())
w = Writer(device=HostDevice())
a, b = queue.Queue(), queue.Queue()
th = threading.Thread(target=lambda: out.append(
    t.serve(Channel(a, b), timeout=10)))
out = []
th.start()
hf = hf_weights(1, 8, 16)
w.sync(hf, Channel(b, a))
th.join(10)
bad = {Name("nope"): torch.zeros(2), **hf}
th = threading.Thread(target=lambda: out.append(
    t.serve(Channel(a, b), timeout=10)))
th.start()
try:
    w.sync(bad, Channel(b, a))
    err = None
except KeyError as exc:
    err = repr(exc)
th.join(10)
print(json.dumps({"first": out[0].complete, "second": out[1].complete,
                  "error": err, "matches": e.matches(hf)}))
"""


def test_under_warnings_as_errors_with_a_name_whose_str_raises():
    out = run_json(HOSTILE.replace("EXAMPLES", repr(EXAMPLES)), timeout=120)
    assert out["first"] is True and out["second"] is False
    assert "not among the engine's" in out["error"]
    assert out["matches"] is True


def test_the_map_announced_again_is_opened_once():
    e = engine()
    link = Link(e.targets())
    hf = hf_weights(2, 8, 16, seed=10)
    link.sync(hf)
    # A new channel object (a restarted engine loop) sends the map again.
    link.engine_side = Channel(_Pickling(link.to_trainer), link.to_engine)
    r, w = link.sync(hf)
    assert r.complete and e.matches(hf)
    opens = [x for x in link.log if x[:2] == ("trainer", "open")]
    assert len(opens) == len(link.targets.map.storages)  # the first time


def test_a_column_shard_target_is_refused_with_the_way_out_not_a_copy():
    # t.contiguous() of a column shard is a copy: the trainer would write
    # into it and the engine would never read it, while the sync reported
    # complete.  The refusal must not suggest it.
    w = torch.zeros(4, 6)
    with pytest.raises(ValueError) as info:
        Targets({"w_cols": w[:, :3]}, device=HostDevice())
    text = str(info.value)
    assert text.startswith("allocconf.transfer: 'w_cols' is not contiguous")
    assert "pass t.contiguous()" not in text
    assert "engine's own memory" in text and "column shard" in text
    assert "bucketed mode" in text
    # The trainer's own tensors may be copied: there the hint stays.
    link = Link({"w": torch.zeros(3, 2)})
    r, got = link.sync({"w": torch.ones(2, 3).t()})
    assert isinstance(got, ValueError) and "pass t.contiguous()" in str(got)
    assert not r.complete


@pytest.mark.parametrize("swap", [True, False])
def test_writer_sync_takes_tensors_then_channel_and_refuses_others_at_once(
        swap):
    writer = Writer(device=HostDevice(), timeout=30)
    channel = Channel(queue.Queue(), queue.Queue())
    src = {"w": torch.ones(3)}
    args, name = (((channel, src), "tensors") if swap
                  else ((src, queue.Queue()), "channel"))
    t0 = time.monotonic()
    with pytest.raises(TypeError, match=f"allocconf.transfer: {name} must "
                                        f"be .*, got (Channel|Queue)"):
        writer.sync(*args)
    assert time.monotonic() - t0 < 5  # not after the 30 s timeout
    assert channel.outbox.empty() and writer.syncs == 0
