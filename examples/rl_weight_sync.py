"""RL weight sync with allocconf: a trainer that keeps its memory in
expandable segments pushes its weights to an inference worker through
classic CUDA IPC, bucket after bucket, with allocconf.transfer.

    python examples/rl_weight_sync.py [--steps N] [--layers N] [--width N]

The trainer trains (expandable segments: no fragmentation), then for each
sync packs its parameters into two reusable 64 MiB buffers that a Sender
allocated once inside ``allocconf.ipc_safe()`` (classic memory, shareable
by cudaIpcGetMemHandle, no pidfd_getfd needed) and sends a small Message
per bucket with torch.multiprocessing.  The worker (another process, as an
inference engine would be) opens each buffer once, loads every bucket into
its own model and acknowledges it; a buffer is refilled only after its
acknowledgement.  The worker answers each sync with a checksum, which the
trainer checks.  Exits 0 when every sync arrived intact.
"""
from __future__ import annotations

import argparse
import time

import allocconf  # first: expandable segments on for the whole process
import torch
import torch.multiprocessing as mp


def make_model(layers: int, width: int, device: str) -> torch.nn.Module:
    blocks = [torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    return torch.nn.Sequential(*blocks).to(device=device,
                                           dtype=torch.bfloat16)


def checksum(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.float().sum().item() for t in tensors))


def worker(layers: int, width: int, inbox, outbox) -> None:
    """The inference side: load each bucket into its own weights."""
    from allocconf.transfer import Receiver

    model = make_model(layers, width, "cuda")
    weights = dict(model.named_parameters())
    receiver = Receiver()
    while True:
        msg = inbox.get()
        if msg is None:
            return
        with torch.no_grad():
            outbox.put(receiver.load(msg, into=weights))  # the Ack
        if msg.last:
            torch.cuda.synchronize()
            outbox.put(checksum(list(weights.values())))


def main() -> int:
    from allocconf.transfer import Sender

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args()
    assert allocconf.status().expandable_segments, allocconf.status().reason

    model = make_model(args.layers, args.width, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # Two reusable buffers, allocated once inside ipc_safe().
    sender = Sender(64 << 20, buffers=2)

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=worker,
                       args=(args.layers, args.width, inbox, outbox))
    proc.start()
    ok = True
    for step in range(args.steps):
        x = torch.randn(64, args.width, device="cuda", dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        weights = {n: p.detach() for n, p in model.named_parameters()}
        for msg in sender.send(weights, receive_ack=outbox.get):
            inbox.put(msg)
        sender.drain(outbox.get)
        got = outbox.get(timeout=300)
        ms = (time.perf_counter() - t0) * 1e3
        want = checksum(list(weights.values()))
        same = abs(got - want) <= 1e-6 * max(1.0, abs(want))
        ok &= same
        print(f"step {step}: loss {loss.item():.4f}, sync {ms:.1f} ms, "
              f"worker checksum {'matches' if same else 'DIFFERS'}")
    inbox.put(None)
    proc.join(timeout=120)
    print(f"{'all syncs intact' if ok else 'SYNC FAILED'}; segments: "
          f"trainer weights expandable, sync buffers classic "
          f"(ipc_capable={allocconf.ipc_capable(sender.buffers[0])})")
    return 0 if ok and proc.exitcode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
