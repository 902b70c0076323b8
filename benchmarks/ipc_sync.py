"""Weight sync through CUDA IPC, trainer to engine: the trainer's weights
live in expandable segments (import allocconf), a receiver process
(spawn) rebuilds what it is sent and checks every element.

  direct      share each expandable tensor as it is (torch >= 2.5 maps
              expandable segments through pidfd_getfd)
  one-by-one  inside ipc_safe(): a classic copy of each tensor, each shared
  pack        inside ipc_safe(): one flat classic buffer, the weights
              copied in each sync, one tensor shared (the hand-made recipe)
  transfer    allocconf.transfer: Sender with 2 buffers of 1 GiB, bucket
              after bucket, the receiver reading zero-copy views and
              acknowledging each bucket

Weights: --model uniform (default: --gib GiB of bf16 in 512 tensors) or
--model llama8b (the parameter shapes of an 8B Llama-style model built
from its config: vocabulary 128256, hidden 4096, 32 layers, 8 KV heads,
MLP 14336, untied head; bf16, about 15 GiB; no real weights).

Each approach gets a fresh receiver.  A sync is timed from the sender's
first copy until the receiver has rebuilt and checked everything; the
receiver keeps the previous sync's tensors until the next arrives, as an
inference engine keeps its weights.  Cold = the first sync (allocation
and handle opening included); warm = the median of the next ones.  Extra
memory = what the sender holds beyond its weights.  The physical
reference is the device-to-device copy bandwidth, measured in the same
run: each warm sync is also given as a multiple of the time that
bandwidth needs for the bytes a sync must copy (the weights, once).
Writes ipc_sync.json.

With --as-nobody both processes run as user 65534 (no capabilities, and
so not allowed pidfd_getfd on each other: what containers without ptrace
permission see); an approach that fails there reports the receiver's
error.  With --receiver-device N (two GPUs) the receiver copies every
tensor onto its own GPU N before checking.

Usage: python benchmarks/ipc_sync.py [--out DIR] [--gib N] [--warm N]
           [--model uniform|llama8b] [--only a,b] [--as-nobody]
           [--receiver-device N]
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import allocconf  # noqa: E402  (expandable segments on, as in training)
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from common import machine, median, out_dir_arg, save  # noqa: E402

GiB = 1 << 30


def arg(name: str, default: int) -> int:
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def sarg(name: str, default: str) -> str:
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


TOTAL_GIB = arg("--gib", 8)
RECEIVER_DEVICE = arg("--receiver-device", -1)
WARM = arg("--warm", 5)
MODEL = sarg("--model", "uniform")
ONLY = sarg("--only", "direct,one-by-one,pack,transfer").split(",")
NOBODY = "--as-nobody" in sys.argv
COUNT = 512


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


def receiver(inbox: Any, outbox: Any, device: int) -> None:
    """Rebuild what arrives (copied onto `device` unless it is -1), check
    every element, answer: True/False, or the error's text."""
    from allocconf.transfer import Receiver

    drop_privileges()
    torch.cuda.init()
    outbox.put("ready")
    rx = Receiver()
    bad = torch.zeros((), dtype=torch.bool, device="cuda")

    def check(tensors: List[torch.Tensor], first: int) -> None:
        nonlocal bad
        if device >= 0:
            tensors = [t.to(f"cuda:{device}") for t in tensors]
        for i, t in enumerate(tensors, first):
            bad |= (t != float(i % 200)).any().to(bad.device)

    while True:
        # `msg` and `tensors` keep the last sync's tensors (and so torch's
        # cached IPC mapping) alive until the next sync replaces them.
        try:
            msg = inbox.get()
            if msg is None:
                return
            kind, payload, sizes = msg
            if kind == "bucket":  # allocconf.transfer
                views = rx.views(payload)
                check(list(views.values()), sizes)  # sizes: first index
                outbox.put(rx.release(payload))
                if payload.last:
                    outbox.put(not bool(bad.item()))
                    bad.zero_()
                continue
            tensors = (list(payload.split(sizes)) if kind == "flat"
                       else payload)
            check(tensors, 0)
            outbox.put(not bool(bad.item()))
            bad.zero_()
        except Exception as exc:  # e.g. pidfd_getfd refused
            outbox.put(f"{type(exc).__name__}: {exc}")
            return


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth, bytes copied per second (median of
    10 copies of 1 GiB)."""
    src = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(11):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return GiB / median(times[1:])


def one_sync(approach: str, weights: List[torch.Tensor], state: Dict[str, Any],
             inbox: Any, outbox: Any) -> Any:
    """Send the weights once; the receiver's answer."""
    sizes = [w.numel() for w in weights]
    if approach == "direct":
        inbox.put(("list", weights, sizes))
    elif approach == "pack":
        if "staging" not in state:
            with allocconf.ipc_safe():
                state["staging"] = torch.empty(sum(sizes),
                                               dtype=weights[0].dtype,
                                               device="cuda")
            state["views"] = list(state["staging"].split(sizes))
        torch._foreach_copy_(state["views"], weights)
        torch.cuda.synchronize()
        inbox.put(("flat", state["staging"], sizes))
    elif approach == "one-by-one":
        if "staging" not in state:
            with allocconf.ipc_safe():
                state["staging"] = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(state["staging"], weights)
        torch.cuda.synchronize()
        inbox.put(("list", state["staging"], sizes))
    else:
        from allocconf.transfer import Sender
        if "sender" not in state:
            state["sender"] = Sender(GiB, buffers=2)
        sender = state["sender"]
        index = {f"w{i}": i for i in range(len(weights))}
        for msg in sender.send(((f"w{i}", w) for i, w in enumerate(weights)),
                               receive_ack=lambda: answer(outbox)):
            inbox.put(("bucket", msg, index[msg.entries[0].name]))
        sender.drain(lambda: answer(outbox))
    return outbox.get(timeout=600)


def answer(outbox: Any) -> Any:
    """The receiver's next answer; its error, raised here."""
    got = outbox.get(timeout=600)
    if isinstance(got, str):
        raise RuntimeError(got)
    return got


def run(approach: str, weights: List[torch.Tensor]) -> Dict[str, Any]:
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver,
                       args=(inbox, outbox, RECEIVER_DEVICE))
    proc.start()
    assert outbox.get(timeout=300) == "ready"
    torch.cuda.synchronize()
    allocated0 = torch.cuda.memory_allocated()
    state: Dict[str, Any] = {}
    times: List[float] = []
    ok: Any = True
    for i in range(1 + WARM):
        t0 = time.perf_counter()
        try:
            got = one_sync(approach, weights, state, inbox, outbox)
        except RuntimeError as exc:
            got = str(exc)
        times.append(time.perf_counter() - t0)
        if got is not True:
            ok = got if isinstance(got, str) else False
            break
    extra = torch.cuda.memory_allocated() - allocated0
    inbox.put(None)
    proc.join(timeout=120)
    if proc.exitcode is None:
        proc.kill()
    if "sender" in state:
        shared: Any = state["sender"].buffers[0]
    elif "staging" in state:
        shared = state["staging"]
    else:
        shared = weights
    first = shared if isinstance(shared, torch.Tensor) else shared[0]
    result = {
        "cold_ms": times[0] * 1e3,
        "warm_ms": median(times[1:]) * 1e3 if len(times) > 1 else None,
        "warm_all_ms": [t * 1e3 for t in times[1:]],
        "extra_gib": extra / GiB,
        "correct": ok,
        "shared_ipc_capable": allocconf.ipc_capable(first),
    }
    del state, shared, first
    torch.cuda.empty_cache()
    return result


def main() -> None:
    drop_privileges()
    assert allocconf.status().expandable_segments is True
    if MODEL == "llama8b":
        shapes = [shape for _, shape in llama8b_shapes()]
    else:
        per = TOTAL_GIB * GiB // COUNT // 2  # bf16 elements per tensor
        shapes = [(per,)] * COUNT
    weights = [torch.full(shape, float(i % 200), dtype=torch.bfloat16,
                          device="cuda") for i, shape in enumerate(shapes)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    bw = copy_bandwidth()
    limit_ms = nbytes / bw * 1e3
    print(f"{MODEL}: {len(weights)} bf16 tensors, {nbytes / GiB:.2f} GiB, "
          f"in expandable segments; uid {os.getuid()}; device copy "
          f"{bw / 1e9:.0f} GB/s, so {limit_ms:.1f} ms to copy them once",
          flush=True)
    results: Dict[str, Any] = {}
    for approach in ONLY:
        r = run(approach, weights)
        if r["warm_ms"] is not None:
            r["warm_over_copy_limit"] = r["warm_ms"] / limit_ms
        results[approach] = r
        warm = (f"warm {r['warm_ms']:8.1f} ms (median of {WARM}, "
                f"{r['warm_over_copy_limit']:.2f}x the copy limit)"
                if r["warm_ms"] is not None else "no warm sync")
        print(f"{approach:<11} cold {r['cold_ms']:9.1f} ms, {warm}, extra "
              f"memory {r['extra_gib']:.2f} GiB, correct {r['correct']}, "
              f"shared memory classic-IPC capable "
              f"{r['shared_ipc_capable']}", flush=True)
    summary: Dict[str, Any] = {"copy_gbps": bw / 1e9,
                               "copy_limit_ms": limit_ms}
    warm = {k: r["warm_ms"] for k, r in results.items()
            if r["warm_ms"] is not None and r["correct"] is True}
    if warm:
        summary["fastest_warm"] = min(warm, key=lambda k: warm[k])
    if "direct" in warm and "pack" in warm:
        summary["warm_ratio_direct_over_pack"] = warm["direct"] / warm["pack"]
    print(f"fastest warm: {summary.get('fastest_warm')}", flush=True)
    record = {"machine": machine(), "gib": nbytes / GiB, "model": MODEL,
              "as_nobody": NOBODY, "receiver_device": RECEIVER_DEVICE,
              "tensors": len(weights), "approaches": results,
              "summary": summary}
    print(json.dumps(record), flush=True)
    try:
        save(f"ipc_sync_{MODEL}{'_nobody' if NOBODY else ''}", record,
             out_dir_arg())
    except OSError as exc:  # as nobody, the directory may be root's
        print(f"not saved: {exc}", flush=True)


if __name__ == "__main__":
    main()
