"""allocconf.transfer without a GPU: the layout, the packing and loading
with CPU buffers in one process (allocconf.transfer.testing stands in for
CUDA IPC and its events), the acknowledgement protocol, messages that
pickle, and clear errors.  tests/gpu/transfer/test_transfer_gpu.py runs
sender and receiver in two processes on a GPU."""
import pickle

import pytest

from helpers import run_json, torch_facts

torch_facts()  # skips this module without torch
import torch  # noqa: E402

from allocconf import transfer  # noqa: E402
from allocconf.transfer import _copies, _replay, _sender  # noqa: E402
from allocconf.transfer import ALIGN, Ack, Receiver, Sender, plan  # noqa: E402
from allocconf.transfer.testing import HostDevice  # noqa: E402

DTYPES = [torch.bfloat16, torch.float32, torch.int8, torch.bool,
          torch.float64, torch.int64, torch.float16, torch.uint8]


def tensors(seed=0, n=24):
    """Mixed dtypes and odd shapes, scalars and empties among them."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n):
        dtype = DTYPES[i % len(DTYPES)]
        shape = [(), (0,), (7,), (3, 5), (2, 3, 7), (129,), (1, 1, 1, 1),
                 (33, 17)][i % 8]
        raw = torch.randint(0, 256, (int(torch.Size(shape).numel())
                                     * torch.empty((), dtype=dtype)
                                     .element_size(),), generator=g,
                            dtype=torch.uint8)
        t = raw.view(dtype).reshape(shape) if dtype != torch.bool else (
            (raw % 2).view(torch.bool).reshape(shape))
        out[f"layer{i}.w"] = t
    return out


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def pair(capacity=4096, buffers=2):
    log = []
    return (Sender(capacity, buffers, device=HostDevice(log=log)),
            Receiver(device=HostDevice(log=log)), log)


def sync(sender, receiver, src, dst):
    """One sync through a pickling channel; returns the messages."""
    msgs = []
    acks = []
    for msg in sender.send(src, receive_ack=acks.pop):
        msg = pickle.loads(pickle.dumps(msg))
        msgs.append(msg)
        acks.insert(0, pickle.loads(pickle.dumps(receiver.load(msg, dst))))
    sender.drain(acks.pop)
    return msgs


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------

def test_plan_aligns_orders_and_fills_buckets():
    sizes = [("a", "float32", (3,), 12), ("b", "int8", (300,), 300),
             ("c", "bfloat16", (750,), 1500), ("d", "int8", (1,), 1)]
    buckets = plan(sizes, 2048)
    assert [[e.name for e in b] for b in buckets] == [["a", "b"],
                                                      ["c", "d"]]
    for b in buckets:
        for e in b:
            assert e.offset % ALIGN == 0
            assert e.offset + e.nbytes <= 2048
            assert e.whole
        ends = [e.offset + e.nbytes for e in b]
        assert all(x <= y.offset for x, y in zip(ends, b[1:]))


def test_plan_splits_a_tensor_larger_than_a_buffer():
    buckets = plan([("small", "int8", (10,), 10),
                    ("big", "float32", (2500,), 10_000),
                    ("after", "int8", (5,), 5)], 4096)
    pieces = [e for b in buckets for e in b if e.name == "big"]
    assert len(pieces) == 3
    assert [p.start for p in pieces] == [0, 4096, 8192]
    assert sum(p.nbytes for p in pieces) == 10_000
    assert all(p.offset == 0 and p.size == 10_000 and not p.whole
               for p in pieces)
    # The small one stays alone; the last piece shares with what follows.
    assert [e.name for e in buckets[0]] == ["small"]
    assert [e.name for e in buckets[-1]] == ["big", "after"]


@pytest.mark.parametrize("capacity", [0, ALIGN - 1, 1.5e9, "1G", True])
def test_plan_refuses_a_bad_capacity_naming_it(capacity):
    with pytest.raises(ValueError, match=f"capacity .* got {capacity!r}"):
        plan([], capacity)


# ---------------------------------------------------------------------------
# Packing and loading
# ---------------------------------------------------------------------------

@pytest.fixture(params=["runs", "foreach"])
def route(request, monkeypatch):
    """Each test twice: pieces that tile as int64 copied in runs (one
    torch.cat / split_with_sizes_copy per run), and every piece in the
    bucket's one _foreach_copy_ of the widest integers that tile it."""
    if request.param == "foreach":
        monkeypatch.setattr(_copies.Program, "RUNS", False)
    return request.param


@pytest.mark.parametrize("capacity", [ALIGN, 1024, 1 << 20])
def test_round_trip_is_bit_for_bit(capacity, route):
    sender, receiver, _ = pair(capacity)
    src = tensors()
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    msgs = sync(sender, receiver, src, dst)
    assert all(same_bits(src[k], dst[k]) for k in src)
    assert msgs[-1].last and not any(m.last for m in msgs[:-1])
    assert [m.seq for m in msgs] == list(range(len(msgs)))


def test_tensors_at_odd_addresses_round_trip(route):
    # Small pieces are copied as the widest integers that tile them: a
    # tensor that starts at an odd byte, or whose size is odd, must still
    # arrive whole.
    base = torch.arange(64, dtype=torch.uint8)
    src = {"odd": base[1:],                                   # odd address
           "h": torch.arange(9, dtype=torch.float16)[1:],     # 2-aligned
           "f": torch.arange(7, dtype=torch.float32)[1:],     # 4-aligned
           "d": torch.arange(5, dtype=torch.float64),         # 8-aligned
           "seven": torch.arange(7, dtype=torch.uint8)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    sync(*pair(1024)[:2], src, dst)
    assert all(same_bits(src[k], dst[k]) for k in src)


def test_buffers_are_reused_across_syncs_and_opened_once(route):
    sender, receiver, log = pair(1024, buffers=2)
    for step in range(10):
        src = tensors(seed=step)
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        msgs = sync(sender, receiver, src, dst)
        assert all(same_bits(src[k], dst[k]) for k in src), step
        assert {m.sync for m in msgs} == {step + 1}
    assert len(sender.buffers) == 2
    assert sum(1 for op in log if op[0] == "open") == 2
    assert sender.pending == 0


def test_a_changed_layout_is_never_served_a_stale_view(route):
    # Typed views into the buffers are cached by offset, dtype and shape:
    # the same bytes sent as another dtype or shape must not reuse them.
    sender, receiver, _ = pair(1024)
    g = torch.Generator().manual_seed(3)
    for layout in [{"a": (torch.float32, (4, 4))},
                   {"a": (torch.bfloat16, (32,))},
                   {"a": (torch.float32, (2, 8))},
                   {"b": (torch.int8, (64,)), "a": (torch.float32, (4, 4))},
                   {"a": (torch.float32, (4, 4))}]:
        src = {k: torch.randint(0, 256, (torch.Size(shape).numel()
                                         * torch.empty((), dtype=d)
                                         .element_size(),), generator=g,
                                dtype=torch.uint8).view(d).reshape(shape)
               for k, (d, shape) in layout.items()}
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        sync(sender, receiver, src, dst)
        assert all(same_bits(src[k], dst[k]) for k in src), layout


@pytest.mark.parametrize("branches", [1, 3])
def test_the_receivers_bound_copies_run_in_its_branches(branches):
    # Receiver.BRANCHES deals a bucket's bound copies (each >= SMALL its
    # own) to that many lanes, as Writer.BRANCHES does the one-copy
    # mode's; the sync lands whole either way.
    class Rx(Receiver):
        BRANCHES = branches
    big = _copies.Lanes.SMALL // 4  # float32 elements of SMALL bytes
    src = {f"w{i}": torch.full((big,), float(i)) for i in range(5)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    log = []
    sender = Sender(8 * _copies.Lanes.SMALL, 1, device=HostDevice(log=log))
    receiver = Rx(device=HostDevice(log=log))
    receiver.bind(dst)
    sync(sender, receiver, src, None)
    assert all(same_bits(src[k], dst[k]) for k in src)
    (b,) = [b.bound for b in receiver._buckets.values() if b.bound]
    assert len(b.lanes_of) == branches
    assert sorted(len(lane) for lane in b.lanes_of) == (
        [5] if branches == 1 else [1, 2, 2])


_alive = []  # the programs compared, kept so that no id is reused


def programs(sender, receiver):
    mine = [p for _, p in sender._programs.values()]
    theirs = [b.bound for b in receiver._buckets.values()
              if b.bound is not None]
    _alive.extend(mine + theirs)
    return {id(p) for p in mine}, {id(p) for p in theirs}


def test_a_repeated_sync_reuses_its_copies_and_checks_no_tensor(
        route, monkeypatch):
    sender, receiver, _ = pair(1024)
    receiver.bind(dst := {k: torch.zeros_like(v)
                          for k, v in tensors().items()})
    src = tensors()
    for _ in range(2):  # buckets take the buffers in turn: both layouts
        sync(sender, receiver, src, None)
    made = programs(sender, receiver)
    assert made[0] and made[1]
    checked = []
    real = _sender.check_tensor
    monkeypatch.setattr(_sender, "check_tensor",
                        lambda *a: checked.append(a[0]) or real(*a))
    for step in range(3):  # the optimizer's step: new values, in place
        for k, v in tensors(seed=step + 1).items():
            src[k].copy_(v)
        sync(sender, receiver, src, None)
        assert all(same_bits(src[k], dst[k]) for k in src), step
    assert programs(sender, receiver) == made and checked == []
    # New tensors in the same layout: checked, copied from where they are
    # now; the receiver's copies into its bound targets stay.
    src = tensors(seed=9)
    sync(sender, receiver, src, None)
    assert all(same_bits(src[k], dst[k]) for k in src)
    assert len(checked) == len(src)
    now = programs(sender, receiver)
    assert now[1] == made[1] and now[0] - made[0]  # the sender's anew


CHANGES = ["data", "resize", "view", "dtype", "new", "others", "renamed",
           "cast"]


def changed_in_place(change, src):
    """`src` changed as `change` says; the cast to send it with."""
    if change == "data":    # the same tensor object, new memory
        src["w1"].data = torch.full((64,), 7.0)
    elif change == "resize":  # the same object, smaller at its address
        src["w1"].resize_(32)
        src["w1"].fill_(7.0)
    elif change == "view":  # the same memory, another shape
        src["w1"].data = src["w1"].view(8, 8)
        src["w1"].fill_(7.0)
    elif change == "dtype":
        src["w1"].data = torch.full((64,), 7, dtype=torch.float64)
    elif change == "new":   # a new tensor under the name
        src["w1"] = torch.full((64,), 7.0)
    elif change == "others":  # as many tensors, none of them the same
        for k in list(src):
            src[k] = src[k] + 10
    elif change == "renamed":  # the same tensors under other names
        for k in list(src):
            src["x" + k] = src.pop(k)
    else:                   # the same tensors, another cast
        return {torch.float32: torch.bfloat16}
    return None


def sent_as_they_are_now(sender, receiver, src, change):
    """`src` changed as `change` says, then sent: the receiver holds it
    bit for bit as it is now (cast where the change is a cast)."""
    cast = changed_in_place(change, src)
    dst = {k: torch.zeros_like(v.to(torch.bfloat16) if cast else v)
           for k, v in src.items()}
    acks = []
    for msg in sender.send(src, receive_ack=acks.pop, cast=cast):
        acks.insert(0, receiver.load(msg, dst))
    sender.drain(acks.pop)
    want = {k: v.to(torch.bfloat16) if cast else v for k, v in src.items()}
    assert all(same_bits(want[k], dst[k]) for k in src), change


@pytest.mark.parametrize("replays", [0, 2])
@pytest.mark.parametrize("buffers", [1, 2])
@pytest.mark.parametrize("change", CHANGES)
def test_a_state_dict_changed_in_place_is_never_replayed_stale(
        change, buffers, replays):
    # With one buffer the first bucket's copies were made for it and are
    # queued before the check; with two, the next sync packs the other
    # buffer, whose copies are made only after the check.  After a replay
    # the check is torch's guard (one call), before it tensor by tensor.
    sender, receiver, _ = pair(1 << 16, buffers=buffers)
    src = {f"w{i}": torch.full((64,), float(i)) for i in range(4)}
    for _ in range(1 + replays):
        sync(sender, receiver, src, {k: torch.zeros_like(v)
                                     for k, v in src.items()})
    assert (sender._kept._guard is not None) == (replays > 0)
    sent_as_they_are_now(sender, receiver, src, change)


@pytest.mark.parametrize("replays", [0, 2])
def test_a_tensor_restrided_in_place_is_refused_not_replayed(replays):
    # The same object, address, dtype and shape, but strides that read
    # other memory (here every element reads the first): a replay would
    # send the bytes, not the values; the tensor is refused as any
    # tensor that is not contiguous is.
    sender, receiver, _ = pair(1 << 16, buffers=1)
    src = {f"w{i}": torch.arange(64.0) + i for i in range(4)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    for _ in range(1 + replays):
        sync(sender, receiver, src, dst)
    w = src["w1"]
    w.set_(w.untyped_storage(), 0, (64,), (0,))
    with pytest.raises(ValueError, match="'w1' is not contiguous"):
        sync(sender, receiver, src, dst)


def test_the_replay_check_is_one_guard_call_once_it_passed(monkeypatch):
    # The first replay checks dtypes, shapes and strides tensor by tensor
    # and then guards them with torch's TensorGuards (in the CPU build
    # too); later replays ask the guard alone.  A guard that refuses
    # (another dispatch state: inference mode) is followed by the check
    # tensor by tensor, and a new guard: still replayed, still right.
    assert _replay.TENSOR_GUARDS is not None, "torch has no TensorGuards"
    looked = []
    monkeypatch.setattr(_replay, "DTYPE",
                        lambda t: looked.append(t) or t.dtype)
    sender, receiver, _ = pair(1 << 16, buffers=1)
    src = {f"w{i}": torch.full((64,), float(i)) for i in range(4)}
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    sync(sender, receiver, src, dst)
    made = sender._kept
    sync(sender, receiver, src, dst)
    assert len(looked) == 4 and made._guard is not None
    for step in range(3):
        for t in src.values():
            t.add_(1.0)
        sync(sender, receiver, src, dst)
        assert all(same_bits(src[k], dst[k]) for k in src), step
    assert len(looked) == 4 and sender._kept is made
    guard = made._guard
    with torch.inference_mode():
        assert guard.check(*src.values()) is False  # its dispatch state
        sync(sender, receiver, src, dst)
    assert len(looked) == 8 and sender._kept is made
    assert made._guard is not guard and all(
        same_bits(src[k], dst[k]) for k in src)


@pytest.mark.parametrize("change", CHANGES)
def test_the_replay_check_through_torchs_address_check(change, monkeypatch):
    # torch's CUDA build checks many tensors' addresses in one call
    # (torch._C._tensors_data_ptrs_at_indices_equal; the CPU build has
    # none): a stand-in with its contract, from torch/csrc/cuda/Module.cpp,
    # records what the check asks of it; the GPU suite runs the real one.
    calls = []

    def ptrs_equal(tensors, data_ptrs, indices):
        calls.append((list(tensors), list(data_ptrs), list(indices)))
        return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)
    monkeypatch.setattr(_replay, "PTRS_EQUAL", ptrs_equal)
    sender, receiver, _ = pair(1 << 16, buffers=1)
    src = {f"w{i}": torch.full((64,), float(i)) for i in range(4)}
    sync(sender, receiver, src, {k: torch.zeros_like(v)
                                 for k, v in src.items()})
    assert not calls  # the first sync had nothing to check
    sync(sender, receiver, src, {k: torch.zeros_like(v)
                                 for k, v in src.items()})
    assert [c[1:] for c in calls] == [
        ([t.data_ptr() for t in src.values()], [0, 1, 2, 3])]
    assert all(a is b for a, b in zip(calls[0][0], src.values()))
    sent_as_they_are_now(sender, receiver, src, change)


def test_the_copies_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(transfer.Receiver, "LIMIT", 4)
    sender, receiver, _ = pair(1 << 16)
    for n in range(1, 12):
        src = {f"t{i}": torch.full((n + i,), float(i)) for i in range(3)}
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        receiver.bind(dst)
        sync(sender, receiver, src, None)
        assert all(same_bits(src[k], dst[k]) for k in src), n
        # one bucket a sync: one program per buffer at most, this plan's
        assert len(sender._programs) <= 2
        assert len(receiver._buckets) <= 4


def test_a_restarted_sender_is_not_taken_for_the_old_one():
    # The receiver caches opened buffers by the sender's id: a trainer
    # restarted in a new process must never present the same id.
    code = ("import sys; sys.path.insert(0, 'tests');"
            "from allocconf.transfer.testing import HostDevice;"
            "from allocconf.transfer import Sender;"
            "import json; print(json.dumps(Sender(1024, device=HostDevice()).id))")
    ids = {run_json(code) for _ in range(2)}
    ids.add(Sender(1024, device=HostDevice()).id)
    assert len(ids) == 3


def test_views_are_zero_copy_until_released():
    sender, receiver, _ = pair(1 << 16)
    src = tensors(n=8)
    (msg,) = list(sender.send(src))
    views = receiver.views(msg)
    assert all(same_bits(src[k], views[k]) for k in src)
    buf = sender.buffers[msg.buffer]
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
    assert all(lo <= v.data_ptr() < hi or v.numel() == 0
               for v in views.values())
    sender.acknowledge(receiver.release(msg))
    assert sender.pending == 0


def test_views_refuse_a_split_tensor():
    sender, receiver, _ = pair(ALIGN)
    gen = sender.send({"big": torch.zeros(100, dtype=torch.float32)})
    msg = next(gen)
    with pytest.raises(ValueError, match="'big' is split across buckets"):
        receiver.views(msg)


def test_a_generator_of_shards_is_consumed_lazily():
    sender, receiver, _ = pair(1024)
    seen = []

    def shards():
        for i in range(6):
            seen.append(i)
            yield f"s{i}", torch.full((200,), i, dtype=torch.float32)
    gen = sender.send(shards(), receive_ack=lambda: None)
    next(gen)
    assert seen == [0, 1]  # 800 bytes each: the third starts bucket two


# ---------------------------------------------------------------------------
# The acknowledgement protocol
# ---------------------------------------------------------------------------

def test_a_buffer_is_reused_only_after_its_ack():
    sender, receiver, log = pair(1024, buffers=2)
    src = {f"t{i}": torch.full((200,), i, dtype=torch.float32)
           for i in range(3)}  # three buckets, two buffers
    gen = sender.send(src)
    m0, m1 = next(gen), next(gen)
    assert (m0.buffer, m1.buffer) == (0, 1)
    with pytest.raises(RuntimeError, match="all 2 buffers wait for the "
                       "receiver's Ack; pass receive_ack="):
        next(gen)
    # With the Ack taken from the channel, the third bucket goes into
    # buffer 0, after the sender waited for the receiver's reads.
    sender2, receiver2, log2 = pair(1024, buffers=2)
    dst = {k: torch.zeros_like(v) for k, v in src.items()}
    acks, taken = [], []

    def receive_ack():
        taken.append(acks.pop(0))
        return taken[-1]
    msgs = []
    for msg in sender2.send(src, receive_ack=receive_ack):
        msgs.append(msg)
        acks.append(receiver2.load(msg, dst))
    assert all(same_bits(src[k], dst[k]) for k in src)
    assert [m.buffer for m in msgs] == [0, 1, 0]
    assert [(a.sync, a.seq) for a in taken] == [(1, 0)]
    # The sender's stream waited for the receiver's event (recorded after
    # its reads of bucket 0) before packing bucket 2 into that buffer.
    wait = log2.index(("wait", taken[0].event))
    packed = max(i for i, op in enumerate(log2)
                 if op == ("record", msgs[2].event))
    assert log2.index(("record", taken[0].event)) < wait < packed
    assert sender2.pending == 2  # the last two, not needed yet


def test_acks_that_do_not_match_are_refused():
    sender, receiver, _ = pair(1024, buffers=2)
    src = {"a": torch.zeros(10)}
    (msg,) = list(sender.send(src))
    ack = receiver.release(msg)
    other = Sender(1024, device=HostDevice())
    with pytest.raises(ValueError, match="not an Ack for this sender"):
        other.acknowledge(ack)
    with pytest.raises(ValueError, match="not an Ack"):
        sender.acknowledge("ack")
    wrong = Ack(ack.sender, ack.sync, ack.seq + 1, ack.buffer, ack.event)
    with pytest.raises(ValueError, match="holds sync 1 bucket 0"):
        sender.acknowledge(wrong)
    sender.acknowledge(ack)
    with pytest.raises(ValueError, match="holds nothing unacknowledged"):
        sender.acknowledge(ack)


def test_messages_and_acks_pickle_small():
    sender, receiver, _ = pair(1 << 16)
    (msg,) = list(sender.send(tensors(n=8)))
    data = pickle.dumps(msg)
    assert pickle.loads(data) == msg
    assert len(data) < 4096
    ack = receiver.release(msg)
    assert pickle.loads(pickle.dumps(ack)) == ack


# ---------------------------------------------------------------------------
# Errors, and both sides usable after them
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    (torch.zeros(4, 6).t(), "'bad' is not contiguous"),
    ([1.0, 2.0], "'bad' is a list, not a tensor"),
    (torch.zeros(3, device="meta"), "'bad' is on meta"),
])
def test_bad_inputs_are_named_and_the_sender_stays_usable(bad, match):
    sender, receiver, _ = pair(1024)
    src = {"ok": torch.ones(3), "bad": bad}
    with pytest.raises((ValueError, TypeError), match=match):
        list(sender.send(src))
    assert sender.pending == 0
    good = {"ok": torch.arange(5.0)}
    dst = {"ok": torch.zeros(5)}
    sync(sender, receiver, good, dst)
    assert same_bits(good["ok"], dst["ok"])


def test_a_name_that_is_not_a_str_is_refused():
    sender, _, _ = pair(1024)
    with pytest.raises(TypeError, match="names must be str, got int 3"):
        list(sender.send([(3, torch.zeros(2))]))


def test_an_exception_mid_sync_leaves_both_sides_usable(route):
    sender, receiver, _ = pair(1024, buffers=3)
    dst = {f"t{i}": torch.zeros(200) for i in range(6)}

    def failing():
        for i in range(6):
            if i == 4:
                raise RuntimeError("gather failed")
            yield f"t{i}", torch.full((200,), float(i))
    acks = []
    with pytest.raises(RuntimeError, match="gather failed"):
        for msg in sender.send(failing(), receive_ack=lambda: acks.pop(0)):
            acks.append(receiver.load(msg, dst))
    sender.drain(lambda: acks.pop(0))
    assert sender.pending == 0
    src = {k: torch.full((200,), 9.0) for k in dst}
    sync(sender, receiver, src, dst)
    assert all(same_bits(src[k], dst[k]) for k in src)


def test_load_checks_every_destination_before_copying():
    sender, receiver, _ = pair(1 << 16)
    src = {"a": torch.ones(4), "b": torch.ones(3, dtype=torch.bfloat16)}
    (msg,) = list(sender.send(src))
    dst = {"a": torch.zeros(4), "b": torch.zeros(3)}  # b: wrong dtype
    with pytest.raises(ValueError, match="'b' is float32\\[3\\]; the sender "
                       "sent bfloat16\\[3\\]"):
        receiver.load(msg, dst)
    assert torch.equal(dst["a"], torch.zeros(4))  # nothing copied
    with pytest.raises(KeyError, match="'b' is not in `into`"):
        receiver.load(msg, {"a": dst["a"]})
    sender.acknowledge(receiver.release(msg))


@pytest.mark.parametrize("buffers", [0, -1, 1.0, None])
def test_sender_refuses_a_bad_buffer_count(buffers):
    with pytest.raises(ValueError, match=f"buffers must be an int >= 1, "
                       f"got {buffers!r}"):
        Sender(1024, buffers, device=HostDevice())


def test_import_allocconf_does_not_import_the_transfer_or_torch():
    out = run_json("""
        import allocconf
        print(json.dumps(["allocconf.transfer" in sys.modules,
                          "torch" in sys.modules]))
    """)
    assert out == [False, False]


def test_no_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        transfer.Sender(1024)


def test_parameters_that_require_grad_go_both_ways(route):
    sender, receiver, _ = pair(1 << 16)
    src = dict(torch.nn.Linear(8, 4).named_parameters())
    dst = dict(torch.nn.Linear(8, 4).named_parameters())
    sync(sender, receiver, src, dst)
    assert all(same_bits(src[k].detach(), dst[k].detach()) for k in src)
    assert all(p.requires_grad for p in dst.values())
