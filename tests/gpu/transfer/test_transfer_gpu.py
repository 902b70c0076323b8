"""allocconf.transfer on the GPU, trainer and engine in two processes:
the trainer's tensors live in expandable segments, the
buckets go through classic CUDA IPC, and what the engine holds is
compared bit for bit (SHA-256 of the bytes) after every sync."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

LAYOUT = """
import allocconf, torch
import torch.multiprocessing as mp
from helpers.transfer_engine import digests, engine, spec_of

SHAPES = [(4096, 4097), (3,), (), (0,), (1, 7, 9), (128256, 64), (11, 13),
          (6 << 20,)] * 3  # the last one is larger than a buffer

def model(g):
    # random bytes, bf16, fp32 and int8 in turn
    out = {}
    for i, shape in enumerate(SHAPES):
        dtype = (torch.bfloat16, torch.float32, torch.int8)[i % 3]
        n = int(torch.Size(shape).numel())
        raw = torch.randint(0, 256, (n * torch.empty((), dtype=dtype)
                                     .element_size(),),
                            generator=g, device="cuda", dtype=torch.uint8)
        out[f"p{i}"] = raw.view(dtype).reshape(shape)
    return out
"""

SYNCS = LAYOUT + """
from allocconf.transfer import Sender

def weights_of(seed):
    out = model(torch.Generator(device="cuda").manual_seed(seed))
    if MODE == "views":  # a tensor split across buckets has no view
        out = {k: v for k, v in out.items()
               if v.numel() * v.element_size() <= 16 << 20}
    return out

ctx = mp.get_context("spawn")
inbox, outbox = ctx.Queue(), ctx.Queue()
weights = weights_of(0)
proc = ctx.Process(target=engine, args=(spec_of(weights), inbox, outbox,
                                        MODE))
proc.start()
sender = Sender(16 << 20, buffers=2)
report = {"expandable_weights": not any(
              allocconf.ipc_capable(t) for t in weights.values()
              if t.numel()),
          "buffers_ipc_capable": all(allocconf.ipc_capable(b)
                                     for b in sender.buffers),
          "syncs": [], "failed_sync": None}
for step in range(10):
    weights = weights_of(step)
    items = list(weights.items())
    if step == FAIL_AT:
        def failing():
            for i, kv in enumerate(items):
                if i == 5:
                    raise RuntimeError("gather failed")
                yield kv
        try:
            for msg in sender.send(failing(), receive_ack=outbox.get):
                inbox.put(msg)
        except RuntimeError as exc:
            report["failed_sync"] = str(exc)
        sender.drain(outbox.get)
        continue
    n = 0
    for msg in sender.send(items, receive_ack=outbox.get):
        inbox.put(msg)
        n += 1
    sender.drain(outbox.get)
    inbox.put("digests")
    report["syncs"].append([n, outbox.get(timeout=120) == digests(weights)])
inbox.put(None)
proc.join(timeout=120)
report["exitcode"] = proc.exitcode
print(json.dumps(report))
"""


@pytest.mark.parametrize("mode", ["load", "views"])
def test_ten_syncs_bit_for_bit_with_a_failure_in_the_middle(mode):
    out = run_json(SYNCS.replace("MODE", repr(mode))
                   .replace("FAIL_AT", "5"), timeout=600)
    assert out["expandable_weights"] is True
    assert out["buffers_ipc_capable"] is True
    assert out["failed_sync"] == "gather failed"
    assert len(out["syncs"]) == 9
    assert all(same for _, same in out["syncs"]), out["syncs"]
    assert all(n > 3 for n, _ in out["syncs"])  # several buckets each
    assert out["exitcode"] == 0


KEPT = LAYOUT + """
from allocconf.transfer import Channel, Sender

g = torch.Generator(device="cuda").manual_seed(0)
weights = model(g)
ctx = mp.get_context("spawn")
inbox, outbox = ctx.Queue(), ctx.Queue()
proc = ctx.Process(target=engine, args=(spec_of(weights), inbox, outbox,
                                        "bound"))
proc.start()
sender = Sender(16 << 20, buffers=2, timeout=120)
channel = Channel(inbox, outbox)
report = {"syncs": []}
for step in range(10):
    for t, new in zip(weights.values(), model(g).values()):
        t.copy_(new)  # a training step: in place
    if step == 4:  # a tensor given new memory (and values) between syncs
        weights["p0"].data = weights["p0"].clone()
        weights["p0"].view(-1).view(torch.uint8).add_(1)
    if step == 7:
        inbox.put("reload")
        assert outbox.get(timeout=120) == "reloaded"
    n = sender.sync(weights, channel)
    inbox.put("digests")
    report["syncs"].append([n, outbox.get(timeout=120) == digests(weights)])
report["sender_graphed"] = [p.replay is not None
                            for _, p in sender._programs.values()]
inbox.put("graphed")
report["receiver_graphed"] = outbox.get(timeout=120)
inbox.put(None)
proc.join(timeout=120)
report["exitcode"] = proc.exitcode
print(json.dumps(report))
"""


def test_kept_copies_replay_from_cuda_graphs_bit_for_bit():
    # A state dict updated in place (its copies kept and replayed from a
    # CUDA graph on the sender), into targets bound on the receiver (each
    # bucket's copies kept, graphed lanes), through Sender.sync (each
    # sync's messages put after its copies); a tensor given new memory
    # at sync 4, the engine's weights allocated anew at sync 7.
    out = run_json(KEPT, timeout=600)
    assert len(out["syncs"]) == 10
    assert all(same for _, same in out["syncs"]), out["syncs"]
    assert all(n > 3 for n, _ in out["syncs"])
    assert out["sender_graphed"] and all(out["sender_graphed"])
    assert out["receiver_graphed"] and all(out["receiver_graphed"])
    assert out["exitcode"] == 0
