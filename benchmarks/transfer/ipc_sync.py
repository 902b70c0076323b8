"""Weight sync through CUDA IPC, trainer to engine: the trainer's weights
live in expandable segments (import allocconf); a receiver process
(spawn), the engine, copies what it is sent into its own weights, as an
engine's load_weights does.

  direct      share each expandable tensor as it is (torch >= 2.5 maps
              expandable segments through pidfd_getfd); the engine copies
              out of the trainer's memory: one copy of the weights
  one-by-one  inside ipc_safe(): a classic copy of each tensor, each shared
  pack        inside ipc_safe(): one flat classic buffer, the weights
              copied in each sync, one tensor shared (the hand-made recipe)
  transfer    allocconf.transfer: Sender with --buffers buffers of
              --capacity MiB (2 of 1024 by default), bucket after
              bucket, over a Channel; the engine's Receiver, its weights
              bound once, serves the sync (Receiver.serve)
  one-copy    allocconf.transfer's one-copy mode: the engine's weights
              allocated inside ipc_safe() and exported once as Targets;
              the engine, idle, offers them and waits (Targets.serve), so
              a sync starts with its offer waiting; the trainer's Writer
              writes straight into them (Writer.sync): no buffer
              (--branches N: the parallel lanes of its copies' CUDA
              graph, Writer.BRANCHES; and of the transfer receiver's
              bound copies, Receiver.BRANCHES)
  transfer-no-NAME
              transfer with one of the Sender's mechanisms turned off
              (MECHANISMS below: replay, early, graph, guard, plan,
              runs), to weigh it against transfer in one run
  (one-by-one, pack and transfer copy the weights twice: into classic
  memory, out of it; direct and one-copy once)

Weights: --model uniform (default: --gib GiB of bf16 in --count tensors,
8 and 512 by default; --gib may be a fraction) or
--model llama8b (the parameter shapes of an 8B Llama-style model built
from its config: vocabulary 128256, hidden 4096, 32 layers, 8 KV heads,
MLP 14336, untied head; bf16, about 15 GiB; no real weights).

Each approach gets a fresh receiver.  A sync is timed from the sender's
first copy until the engine's weights all hold the new values (the
receiver synchronised its device and answered).  After each sync, outside
the timed part, the receiver compares every element and zeroes its
weights, so the next sync must write them all again.  The receiver keeps
the previous sync's shared tensors until the next arrives (torch keeps
their mapping).  Cold = the first sync (allocation and handle opening
included); warm = the median of the next ones.  Extra memory = what the
sender holds beyond its weights.  The physical reference is the
device-to-device copy bandwidth, measured in the same run: each warm sync
is given as a multiple of the time that bandwidth needs to copy the
weights once (the floor of any sync into the engine's memory), and of
the time for the copies the approach makes.  "Trainer" is what the
trainer waits for: from the same start until it may run its next
optimizer step, its weights copied out (transfer: every bucket sent and
the device done with the copies into the buffers, the engine still
reading; pack and one-by-one: the staging copy done; one-copy: the
copies into the engine done; direct: the whole sync, since the engine
reads the trainer's memory).
Writes ipc_sync_{model}[_{gib}][_nobody].json (the size named when
--gib is given).

With --as-nobody both processes run as user 65534 (no capabilities, and
so not allowed pidfd_getfd on each other: what containers without ptrace
permission see); an approach that fails there reports the receiver's
error.  With --receiver-device N (two GPUs) the engine's weights are on
its GPU N.

Every message between the two processes, the approaches' own and the
harness's commands and answers, goes over one allocconf.transfer
Channel: over pipes by default (--channel pipes, Channel.pipes(): no
feeder thread; benchmarks/transfer/channel_latency.py), or two multiprocessing
queues (--channel queues, as the sweep of 2026-12-04 was measured).

How the one-copy engine knows its weights hold the sync: by default
(--engine-sees device) it synchronises its device after Targets.serve
queued its stream's wait on the trainer's event, as every other
approach synchronises after its copies; with --engine-sees event it
waits on the host for the trainer's event itself (the copies into its
weights done), its stream's wait queued all the same (Targets.accept).

Usage: python benchmarks/transfer/ipc_sync.py [--out DIR] [--gib N] [--count N]
           [--warm N] [--model uniform|llama8b] [--only a,b]
           [--capacity MIB] [--buffers N] [--branches N] [--as-nobody]
           [--receiver-device N] [--channel queues|pipes]
           [--engine-sees device|event]
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import allocconf  # noqa: E402  (expandable segments on, as in training)
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from common import (cuda_median, machine, median, option,  # noqa: E402
                    out_dir_arg, save)

GiB = 1 << 30


def arg(name: str, default: int) -> int:
    return int(option(name, str(default)))


TOTAL_GIB = float(option("--gib", "8"))
RECEIVER_DEVICE = arg("--receiver-device", -1)
WARM = arg("--warm", 5)
MODEL = option("--model", "uniform")
ONLY = option("--only", "direct,one-by-one,pack,transfer,one-copy").split(",")
NOBODY = "--as-nobody" in sys.argv
COUNT = arg("--count", 512)
CAPACITY_MIB = arg("--capacity", 1024)
BUFFERS = arg("--buffers", 2)
BRANCHES = arg("--branches", 0)  # Writer's, Receiver's (0: their own)
CHANNEL = option("--channel", "pipes")
ENGINE_SEES = option("--engine-sees", "device")
if ENGINE_SEES not in ("device", "event"):
    raise SystemExit(f"--engine-sees: device or event, not {ENGINE_SEES!r}")
#: Copies of the weights a sync makes on the GPU: direct copies out of
#: the trainer's memory into the engine's, one-copy into it; the others
#: copy into classic memory first.
COPIES = {"direct": 1, "one-by-one": 2, "pack": 2, "transfer": 2,
          "one-copy": 1}
#: The Sender's mechanisms that "transfer-no-NAME" turns off, one at a
#: time, to weigh each against "transfer" in the same run (the one line
#: each in docs/design.md says what it gained):
#:   replay  a state dict sent again is checked as a whole and its kept
#:           buckets replayed (every sync walks its tensors one by one
#:           instead, following the plan, its copies found again by
#:           their sources' addresses)
#:   early   the first bucket's kept copies are queued before the check
#:           (the check runs first instead)
#:   graph   kept copies are replayed from a CUDA graph (launched
#:           eagerly instead)
#:   guard   the check by torch's one-call address check and guard (a
#:           Python call per tensor instead)
#:   plan    a known plan is not sent (every message carries its entries)
#:   runs    contiguous pieces copied by one cat / split_with_sizes_copy
#:           (a _foreach_copy_ over them instead)
MECHANISMS = ("replay", "early", "graph", "guard", "plan", "runs")
for _m in MECHANISMS:
    COPIES[f"transfer-no-{_m}"] = 2
for _a in ONLY:
    if _a not in COPIES:
        raise SystemExit(f"--only: {_a!r} is none of {', '.join(COPIES)}")


def channels(ctx: Any) -> Any:
    """The trainer's and the engine's ends of the channel every approach
    uses (its messages, the harness's commands and answers)."""
    from allocconf.transfer import Channel
    if CHANNEL == "pipes":
        return Channel.pipes(timeout=600)
    if CHANNEL != "queues":
        raise SystemExit(f"--channel: queues or pipes, not {CHANNEL!r}")
    to_engine, to_trainer = ctx.Queue(), ctx.Queue()
    return Channel(to_engine, to_trainer), Channel(to_trainer, to_engine)


def llama8b_shapes() -> List[Any]:
    """The parameters of an 8B Llama-style model, from its config."""
    vocab, hidden, layers, inter = 128256, 4096, 32, 14336
    heads, kv_heads = 32, 8
    kv = hidden // heads * kv_heads
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                   (p + "self_attn.k_proj.weight", (kv, hidden)),
                   (p + "self_attn.v_proj.weight", (kv, hidden)),
                   (p + "self_attn.o_proj.weight", (hidden, hidden)),
                   (p + "mlp.gate_proj.weight", (inter, hidden)),
                   (p + "mlp.up_proj.weight", (inter, hidden)),
                   (p + "mlp.down_proj.weight", (hidden, inter)),
                   (p + "input_layernorm.weight", (hidden,)),
                   (p + "post_attention_layernorm.weight", (hidden,))]
    shapes += [("model.norm.weight", (hidden,)),
               ("lm_head.weight", (vocab, hidden))]
    return shapes


def drop_privileges() -> None:
    """Become user 65534: no capabilities, so no pidfd_getfd on another
    process (ptrace access), as in a container without CAP_SYS_PTRACE."""
    if NOBODY and os.getuid() == 0:
        import ctypes

        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE: 0


def receiver(shapes: List[Any], channel: Any, device: int,
             approach: str) -> None:
    """The engine: its own weights (zeros at first), into which every
    approach copies what it is sent, as an engine's load_weights does;
    answers True once they are all in place.  ("check",) compares every
    element (outside the timed sync) and zeroes the weights again, so the
    next sync must write them all."""
    from allocconf.transfer import Receiver, Targets, TransferError

    drop_privileges()
    torch.cuda.init()
    dev = torch.device("cuda", device if device >= 0
                       else torch.cuda.current_device())
    # one-copy: the engine's weights in classic memory, to be shared
    with (allocconf.ipc_safe() if approach == "one-copy"
          else contextlib.nullcontext()):
        engine = [torch.zeros(s, dtype=torch.bfloat16, device=dev)
                  for s in shapes]
    numels = [t.numel() for t in engine]
    named = {f"w{i}": t for i, t in enumerate(engine)}
    if BRANCHES:
        Receiver.BRANCHES = BRANCHES
    rx = Receiver()
    rx.bind(named)
    targets = Targets(named) if approach == "one-copy" else None
    channel.put("ready")

    def idle() -> bool:
        """one-copy: the engine, not reading its weights, offers them for
        the next sync at once and waits for it, as an engine pausing
        between generations would (so the trainer's sync finds the offer
        waiting, and no command goes first); answers True once the
        weights are in place.  False: the trainer said it is done (its
        None came instead of an answer)."""
        assert targets is not None
        try:
            r = targets.serve(channel, timeout=600)
        except TransferError as exc:
            if str(exc).endswith("got None"):
                return False
            raise
        if not r.complete:
            raise RuntimeError(f"the write was incomplete: {r.error}")
        if ENGINE_SEES == "event":
            # The trainer's event, which accept() opened (the only event
            # the engine opens) and queued its stream's wait on.
            for ev in targets._device._events.values():
                ev.synchronize()  # the copies into the weights done
        else:
            torch.cuda.synchronize(dev)
        channel.put(True)
        return True

    if targets is not None and not idle():
        return
    held = None  # the last sync's shared tensors: torch keeps their mapping
    while True:
        try:
            msg = channel.get(None)
            if msg is None:
                return
            kind, payload = msg
            if kind == "check":
                bad = torch.zeros((), dtype=torch.bool, device=dev)
                for i, t in enumerate(engine):
                    bad |= (t != float(i % 200)).any()
                ok = not bool(bad.item())
                torch._foreach_zero_(engine)
                # Done before the answer: the next timed sync must not
                # start with the zeroing still queued.
                torch.cuda.synchronize(dev)
                channel.put(ok)
                if targets is not None and not idle():
                    return
                continue
            if kind == "transfer":  # allocconf.transfer: one whole sync
                if not rx.serve(channel, timeout=600).complete:
                    raise RuntimeError("the sync arrived partial")
            else:
                held = payload
                src = ([v.view(t.shape) for v, t in
                        zip(payload.split(numels), engine)]
                       if kind == "flat" else payload)
                torch._foreach_copy_(engine, src)
            torch.cuda.synchronize(dev)
            channel.put(True)
        except Exception as exc:  # e.g. pidfd_getfd refused
            channel.put(f"{type(exc).__name__}: {exc}")
            return


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth, bytes copied per second (median of
    10 copies of 1 GiB)."""
    src = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_median(lambda d=dst, s=src: d.copy_(s), runs=10)
    del src, dst
    torch.cuda.empty_cache()
    return GiB / seconds


def foreach_copy_ms(weights: List[torch.Tensor]) -> float:
    """One _foreach_copy_ of the weights into a flat classic buffer (the
    copy each staging approach makes on the sender), median of 5."""
    with allocconf.ipc_safe():
        flat = torch.empty(sum(w.numel() for w in weights),
                           dtype=weights[0].dtype, device="cuda")
    views = [v.view(w.shape) for v, w in
             zip(flat.split([w.numel() for w in weights]), weights)]
    seconds = cuda_median(
        lambda v=views: torch._foreach_copy_(v, weights))
    del flat, views
    torch.cuda.empty_cache()
    return seconds * 1e3


def one_sync(approach: str, weights: List[torch.Tensor], state: Dict[str, Any],
             channel: Any) -> Any:
    """Send the weights once; the receiver's answer once they are all in
    its own tensors.  state["trainer"]: when the trainer was free."""
    if approach == "direct":
        channel.put(("list", weights))
    elif approach == "pack":
        if "staging" not in state:
            with allocconf.ipc_safe():
                state["staging"] = torch.empty(
                    sum(w.numel() for w in weights), dtype=weights[0].dtype,
                    device="cuda")
            state["views"] = [v.view(w.shape) for v, w in zip(
                state["staging"].split([w.numel() for w in weights]),
                weights)]
        torch._foreach_copy_(state["views"], weights)
        torch.cuda.synchronize()
        state["trainer"] = time.perf_counter()
        channel.put(("flat", state["staging"]))
    elif approach == "one-by-one":
        if "staging" not in state:
            with allocconf.ipc_safe():
                state["staging"] = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(state["staging"], weights)
        torch.cuda.synchronize()
        state["trainer"] = time.perf_counter()
        channel.put(("list", state["staging"]))
    elif approach == "one-copy":
        from allocconf.transfer import Writer
        if "writer" not in state:
            if BRANCHES:
                Writer.BRANCHES = BRANCHES
            state["writer"] = Writer(timeout=600)
            state["named"] = {f"w{i}": w for i, w in enumerate(weights)}
        # No command: the engine's offer is waiting (receiver's idle()).
        state["writer"].sync(state["named"], channel)
        torch.cuda.current_stream().synchronize()
        state["trainer"] = time.perf_counter()
    else:
        from allocconf.transfer import Sender
        off = approach[len("transfer-no-"):] if approach != "transfer" else ""
        if "sender" not in state:
            state["sender"] = Sender(CAPACITY_MIB << 20, buffers=BUFFERS,
                                     timeout=600)
            state["named"] = {f"w{i}": w for i, w in enumerate(weights)}
            without(off, state["sender"])
        sender = state["sender"]
        channel.put(("transfer", None))
        t0 = time.perf_counter()
        sender.sync(state["named"], channel, wait=False)
        state.setdefault("sent", []).append(time.perf_counter() - t0)
        torch.cuda.current_stream().synchronize()
        state["trainer"] = time.perf_counter()
        sender.drain(channel)
    got = answer(channel)
    if approach == "direct":
        state["trainer"] = time.perf_counter()
    return got


def without(mechanism: str, sender: Any) -> None:
    """Turn `mechanism` (MECHANISMS) off in `sender`, through the
    Sender's private parts: a measurement of them, not an API.  What is
    turned off for the whole process ("guard", "runs") is turned on again
    by restore()."""
    from allocconf.transfer import _copies, _replay
    if mechanism == "replay":
        original = sender.send  # Sender.sync sends through self.send

        def afresh(*args: Any, **kwargs: Any) -> Any:
            sender._kept = None  # nothing kept: tensor by tensor
            return original(*args, **kwargs)
        sender.send = afresh
    elif mechanism == "early":
        sender._kept_program = lambda *args: False
    elif mechanism == "graph":
        sender._device.graph = None  # Program(..., capture=None): eager
    elif mechanism == "guard":
        _replay.PTRS_EQUAL = None
        _replay.TENSOR_GUARDS = None
    elif mechanism == "plan":
        message = sender._message

        def unknown(s: Any, last: bool, p: Any) -> Any:
            p.known = False  # the receiver is sent the entries again
            return message(s, last, p)
        sender._message = unknown
    elif mechanism == "runs":
        _copies.Program.RUNS = False


def restore() -> None:
    """Undo what without() changed for the whole process."""
    from allocconf.transfer import _copies, _replay
    _replay.PTRS_EQUAL = PROCESS_WIDE["PTRS_EQUAL"]
    _replay.TENSOR_GUARDS = PROCESS_WIDE["TENSOR_GUARDS"]
    _copies.Program.RUNS = PROCESS_WIDE["RUNS"]


def _process_wide() -> Dict[str, Any]:
    from allocconf.transfer import _copies, _replay
    return {"PTRS_EQUAL": _replay.PTRS_EQUAL,
            "TENSOR_GUARDS": _replay.TENSOR_GUARDS,
            "RUNS": _copies.Program.RUNS}


PROCESS_WIDE = _process_wide()


def answer(channel: Any) -> Any:
    """The receiver's next answer; its error, raised here."""
    got = channel.get(600)
    if isinstance(got, str):
        raise RuntimeError(got)
    return got


def run(approach: str, weights: List[torch.Tensor]) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    channel, theirs = channels(ctx)
    proc = ctx.Process(target=receiver,
                       args=([tuple(w.shape) for w in weights], theirs,
                             RECEIVER_DEVICE, approach))
    proc.start()
    theirs.close()  # pipes: the engine's end is the engine's alone
    assert channel.get(300) == "ready"
    torch.cuda.synchronize()
    allocated0 = torch.cuda.memory_allocated()
    state: Dict[str, Any] = {}
    times: List[float] = []
    ok: Any = True
    trainer: List[float] = []
    for i in range(1 + WARM):
        t0 = time.perf_counter()
        try:
            got = one_sync(approach, weights, state, channel)
            times.append(time.perf_counter() - t0)
            trainer.append(state.pop("trainer") - t0)
            channel.put(("check", None))  # outside the timed sync
            got = answer(channel)
        except (RuntimeError, ValueError) as exc:  # the receiver's error
            got = str(exc)
            times.append(time.perf_counter() - t0)
        if got is not True:
            ok = got if isinstance(got, str) else False
            break
    sent_ms = (median(state["sent"][1:]) * 1e3
               if len(state.get("sent", ())) > 1 else None)
    if sent_ms is not None:
        print(f"  {approach}: sync(wait=False) returned after "
              f"{sent_ms:.3f} ms (median)", flush=True)
    extra = torch.cuda.memory_allocated() - allocated0
    # An engine that failed has exited: over pipes, telling it fails too.
    with contextlib.suppress(RuntimeError):
        channel.put(None)
    proc.join(timeout=120)
    if proc.exitcode is None:
        proc.kill()
    if "sender" in state:
        shared: Any = state["sender"].buffers[0]
    elif "staging" in state:
        shared = state["staging"]
    elif "writer" in state:  # the engine's memory (it checked it)
        shared = None
        if state["writer"].graphed:
            print("  one-copy: copies replayed from a CUDA graph",
                  flush=True)
    else:
        shared = weights
    first = (None if shared is None else shared
             if isinstance(shared, torch.Tensor) else shared[0])
    result = {
        "cold_ms": times[0] * 1e3,
        "warm_ms": median(times[1:]) * 1e3 if len(times) > 1 else None,
        "warm_all_ms": [t * 1e3 for t in times[1:]],
        "trainer_ms": (median(trainer[1:]) * 1e3 if len(trainer) > 1
                       else None),
        "sent_ms": sent_ms,  # transfer: the trainer's host time
        "extra_gib": extra / GiB,
        "correct": ok,
        "shared_ipc_capable": (True if first is None
                               else allocconf.ipc_capable(first)),
    }
    del state, shared, first
    restore()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    drop_privileges()
    assert allocconf.status().expandable_segments is True
    if MODEL == "llama8b":
        shapes = [shape for _, shape in llama8b_shapes()]
    else:
        # bf16 elements per tensor, a multiple of 64 as a model's are
        per = int(TOTAL_GIB * GiB) // COUNT // 2 // 64 * 64
        shapes = [(per,)] * COUNT
    weights = [torch.full(shape, float(i % 200), dtype=torch.bfloat16,
                          device="cuda") for i, shape in enumerate(shapes)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    bw = copy_bandwidth()
    limit_ms = nbytes / bw * 1e3
    foreach_ms = foreach_copy_ms(weights)
    print(f"{MODEL}: {len(weights)} bf16 tensors, {nbytes / GiB:.2f} GiB, "
          f"in expandable segments; uid {os.getuid()}; device copy "
          f"{bw / 1e9:.0f} GB/s, so {limit_ms:.1f} ms to copy them once "
          f"(one _foreach_copy_ of them into a flat buffer: "
          f"{foreach_ms:.1f} ms)", flush=True)
    results: Dict[str, Any] = {}
    width = max(11, *map(len, ONLY))
    for approach in ONLY:
        r = run(approach, weights)
        r["copies"] = COPIES[approach]
        if r["warm_ms"] is not None:
            r["warm_over_copy_limit"] = r["warm_ms"] / limit_ms
            r["warm_over_own_floor"] = r["warm_ms"] / (limit_ms
                                                       * r["copies"])
            r["trainer_over_copy_limit"] = r["trainer_ms"] / limit_ms
        # An approach named twice (a drift check): both kept, in order.
        results[approach if approach not in results
                else f"{approach}#{len(results)}"] = r
        warm = (f"warm {r['warm_ms']:8.1f} ms (median of {WARM}, "
                f"{r['warm_over_copy_limit']:.2f}x one copy, "
                f"{r['warm_over_own_floor']:.2f}x its {r['copies']}), "
                f"trainer {r['trainer_ms']:.2f} ms "
                f"({r['trainer_over_copy_limit']:.2f}x one copy)"
                if r["warm_ms"] is not None else "no warm sync")
        print(f"{approach:<{width}} cold {r['cold_ms']:9.1f} ms, {warm}, extra "
              f"memory {r['extra_gib']:.2f} GiB, correct {r['correct']}, "
              f"shared memory classic-IPC capable "
              f"{r['shared_ipc_capable']}", flush=True)
    summary: Dict[str, Any] = {"copy_gbps": bw / 1e9,
                               "copy_limit_ms": limit_ms,
                               "foreach_copy_ms": foreach_ms}
    warm = {k: r["warm_ms"] for k, r in results.items()
            if r["warm_ms"] is not None and r["correct"] is True}
    if warm:
        summary["fastest_warm"] = min(warm, key=lambda k: warm[k])
    if "direct" in warm and "pack" in warm:
        summary["warm_ratio_direct_over_pack"] = warm["direct"] / warm["pack"]
    print(f"fastest warm: {summary.get('fastest_warm')}", flush=True)
    record = {"machine": machine(), "gib": nbytes / GiB, "model": MODEL,
              "channel": CHANNEL, "engine_sees": ENGINE_SEES,
              "capacity_mib": CAPACITY_MIB, "buffers": BUFFERS,
              "as_nobody": NOBODY, "receiver_device": RECEIVER_DEVICE,
              "fits_buffers": nbytes <= (CAPACITY_MIB << 20) * BUFFERS,
              "tensors": len(weights), "approaches": results,
              "summary": summary}
    print(json.dumps(record), flush=True)
    try:
        size = f"_{option('--gib', '')}" if "--gib" in sys.argv else ""
        save(f"ipc_sync_{MODEL}{size}{'_nobody' if NOBODY else ''}", record,
             out_dir_arg())
    except OSError as exc:  # as nobody, the directory may be root's
        print(f"not saved: {exc}", flush=True)


if __name__ == "__main__":
    main()
