"""allocconf.transfer's one-copy mode on the GPU: a trainer
with fp32 master weights in expandable segments writes straight into a
bf16 engine's weights (examples/engine_standin.py: fused qkv/gate_up
rows, a tied lm_head) in another process, which names the GPU by UUID in
its own CUDA_VISIBLE_DEVICES; an engine generating in a loop never sees
a torn weight with the handshake and does without it; a reallocated
engine's stale map is refused and its old memory freed; dead peers fail
within the timeout."""
import os

import pytest

from helpers import TESTS_DIR, run_json

pytestmark = pytest.mark.gpu

EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")

SETUP = f"""
import os, time
PATHS = [{TESTS_DIR!r}, {EXAMPLES!r}]
sys.path[:0] = PATHS
import allocconf, torch
import torch.multiprocessing as mp
from allocconf.transfer import Channel, TransferError, Writer
from engine_standin import hf_weights
from helpers.gpu import bf16_on_cpu as expected, start_on_uuid
from helpers.onecopy_engine import engine_process

LAYERS, HIDDEN, VOCAB = 4, 512, 8192
CAST = {{torch.float32: torch.bfloat16}}
ctx = mp.get_context("spawn")

def start_engine():
    ctl_in, ctl_out = ctx.Queue(), ctx.Queue()
    to_engine, to_trainer = ctx.Queue(), ctx.Queue()
    # The engine names the GPU by UUID in its CUDA_VISIBLE_DEVICES.
    proc = start_on_uuid(ctx, engine_process, (
        ctl_in, ctl_out, to_engine, to_trainer, PATHS))
    return proc, (ctl_in, ctl_out), Channel(to_engine, to_trainer)

def ask(ctl, *cmd):
    ctl[0].put(cmd)
    return ctl[1].get(timeout=300)

"""

SYNCS = SETUP + """
master = hf_weights(LAYERS, HIDDEN, VOCAB, seed=0, device="cuda")  # tied
proc, ctl, channel = start_engine()
report = {"trainer_expandable": not allocconf.ipc_capable(
              master["model.norm.weight"]),
          "refused": ask(ctl, "stand-in", LAYERS, HIDDEN, VOCAB, False),
          "built": ask(ctl, "stand-in", LAYERS, HIDDEN, VOCAB, True),
          "syncs": []}
writer = Writer(timeout=120)
before = torch.cuda.memory_allocated()
for step in range(6):
    with torch.no_grad():  # a training step on the master weights
        for v in master.values():
            v.add_(torch.randn_like(v), alpha=1e-3)
    ctl[0].put(("serve", 120))
    if step == 3:  # fresh tensors from a generator, dropped at once
        src = ((k, v.clone()) for k, v in master.items())
    else:
        src = master
    w = writer.sync(src, channel, cast=CAST)
    served = ctl[1].get(timeout=300)
    report["syncs"].append({"served": served, "tensors": w.tensors,
                            "graphed": writer.graphed,
                            "matches": ask(ctl, "check", expected(master))})
torch.cuda.synchronize()
report["extra"] = torch.cuda.memory_allocated() - before
ctl[0].put(None)
proc.join(timeout=120)
report["exitcode"] = proc.exitcode
print(json.dumps(report))
"""


def test_syncs_land_bit_for_bit_in_fused_bf16_rows_with_nothing_staged():
    out = run_json(SYNCS, timeout=600)
    assert out["trainer_expandable"] is True
    # The engine's weights in an expandable segment: refused, the way out
    # named; inside ipc_safe(): classic memory, exported.
    assert "not share" in out["refused"] and "ipc_safe()" in out["refused"]
    assert out["built"] == "ok"
    for i, s in enumerate(out["syncs"]):
        assert s["served"] == [True, i + 1, None], s
        assert s["matches"] is True, i  # bit for bit, cast as .to() does
        assert s["tensors"] == 4 * 9 + 2  # lm_head tied: written once
    # state dicts replay from a graph; the generator's sync (3) is eager
    assert [s["graphed"] for s in out["syncs"]][4:] == [True, True]
    # No staging memory in the trainer: what it holds more is the CUDA
    # graph's own (1 KiB on the H200), against 2 x 1 GiB of buffers.
    assert 0 <= out["extra"] < 64 << 10, out["extra"]
    assert out["exitcode"] == 0


TEAR = SETUP + """
proc, ctl, channel = start_engine()
MIB, N = 256, 40
writer = Writer(timeout=120)
report = {}
src = torch.empty(MIB << 19, dtype=torch.bfloat16, device="cuda")
# With the handshake: a sync before each forward.
ctl[0].put(("tear", True, N, MIB, 5))
for i in range(N):
    src.fill_(float(i + 1))
    writer.sync({"w": src}, channel)
report["handshake"] = ctl[1].get(timeout=300)
# Without it: the trainer writes through the map whenever it likes.
ctl[0].put(("tear", False, N, MIB, 5))
from allocconf.transfer import TargetMap
tmap = channel.get(60)
while not isinstance(tmap, TargetMap):  # the last run's close, first
    tmap = channel.get(60)
writer.open(tmap)
dst = writer._views["w"][0]
writes = 0
while ctl[1].empty():
    src.fill_(float(writes % 200 + 1))
    dst.copy_(src)
    torch.cuda.synchronize()
    writes += 1
report["free"] = ctl[1].get(timeout=300)
report["free_writes"] = writes
ctl[0].put(None)
proc.join(timeout=120)
print(json.dumps(report))
"""


def test_the_handshake_prevents_the_tearing_seen_without_it():
    out = run_json(TEAR, timeout=600)
    hs = out["handshake"]
    assert hs["torn"] == 0 and hs["exact"] is True, hs
    free = out["free"]
    assert free["torn"] > 0, out  # what the handshake prevents


STALE = SETUP + """
master = hf_weights(LAYERS, HIDDEN, VOCAB, seed=1, device="cuda")
proc, ctl, channel = start_engine()
report = {"built": ask(ctl, "stand-in", LAYERS, HIDDEN, VOCAB, True)}
writer = Writer(timeout=120)
ctl[0].put(("serve", 120))
writer.sync(master, channel, cast=CAST)
report["first"] = ctl[1].get(timeout=300)
old_map = writer.map.id
report["before"] = ask(ctl, "memory")
report["refused"] = ask(ctl, "reallocate")
with torch.no_grad():
    for v in master.values():
        v.mul_(-1)
ctl[0].put(("serve", 120))
writer.sync(master, channel, cast=CAST)  # takes the close and the new map
report["second"] = ctl[1].get(timeout=300)
report["new_map"] = writer.map.id != old_map
report["matches"] = ask(ctl, "check", expected(master))
report["after"] = ask(ctl, "memory")
# A silent trainer: the engine times out, its weights in doubt.
ctl[0].put(("serve", 3))
t0 = time.monotonic()
report["silent"] = ctl[1].get(timeout=300)
report["silent_s"] = time.monotonic() - t0
report["doubt"] = ask(ctl, "in doubt")
# The late answer is still taken; then the engine is killed: the trainer
# times out.
writer.sync(master, channel, cast=CAST)
report["late"] = ask(ctl, "serve", 60)
proc.kill()
proc.join()
t0 = time.monotonic()
try:
    writer.sync(master, channel, cast=CAST, timeout=3)
    report["dead"] = "no error"
except TransferError as exc:
    report["dead"] = str(exc)
report["dead_s"] = time.monotonic() - t0
writer.close()
print(json.dumps(report))
"""


def test_a_reallocated_engine_stale_map_freed_memory_and_dead_peers():
    out = run_json(STALE, timeout=600)
    assert out["built"] == "ok" and out["first"][0] is True
    assert "replaced since this map was made" in out["refused"]
    assert out["second"][0] is True and out["new_map"] is True
    assert out["matches"] is True
    # The old weights' memory came back once both sides let go of it.
    assert out["after"] == out["before"], out
    assert "within 3" in out["silent"] and out["silent_s"] < 30
    assert out["doubt"] == [out["second"][1] + 1, out["second"][1]]
    assert out["late"][0] is True
    assert "within 3" in out["dead"] and out["dead_s"] < 30
