"""RL weight sync with allocconf: a trainer that keeps its memory in
expandable segments pushes its weights to an inference worker through
classic CUDA IPC, bucket after bucket, with allocconf.transfer.

    python examples/rl_weight_sync.py [--steps N] [--layers N] [--width N]
                                      [--one-copy]

The trainer trains (expandable segments: no fragmentation), then for each
sync packs its parameters into two reusable 64 MiB buffers that a Sender
allocated once inside ``allocconf.ipc_safe()`` (classic memory, shareable
by cudaIpcGetMemHandle, no pidfd_getfd needed) and sends a small Message
per bucket over a ``Channel.pipes()`` channel, one ``Sender.sync`` call a
sync.  The worker (another process, as an inference engine would be)
binds its model's parameters once and takes each sync with one
``Receiver.serve`` call: it opens each buffer once, loads every bucket
into its parameters and acknowledges it; a buffer is refilled only after
its acknowledgement.  The worker answers each sync with a checksum,
which the trainer checks.  Exits 0 when every sync arrived intact.

With --one-copy there are no buffers: the worker allocates its model
inside ``ipc_safe()`` and exports its parameters once (``Targets``); for
each sync it offers them and the trainer's ``Writer`` writes straight
into them.
"""
from __future__ import annotations

import argparse
import sys
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


def worker(layers: int, width: int, channel, one_copy: bool) -> None:
    """The inference side: load each sync into its own weights, or, with
    one_copy, let the trainer write them in place."""
    from allocconf.transfer import Receiver, Targets

    if one_copy:  # weights in classic memory, exported once
        with allocconf.ipc_safe():
            model = make_model(layers, width, "cuda")
        targets = Targets(dict(model.named_parameters()))
    else:
        model = make_model(layers, width, "cuda")
    weights = dict(model.named_parameters())
    receiver = Receiver()
    receiver.bind(weights)  # its copies made once, replayed every sync
    while True:
        if channel.get(None) is None:  # "sync", or None: the trainer is done
            return
        if one_copy:  # offer the weights, take the trainer's write
            done = targets.serve(channel, timeout=300).complete
        else:  # every bucket loaded into the bound weights and acked
            done = receiver.serve(channel, timeout=300).complete
        if not done:
            raise RuntimeError("the sync arrived incomplete")
        torch.cuda.synchronize()
        channel.put(checksum(list(weights.values())))


def main() -> int:
    from allocconf.transfer import Channel, Sender, Writer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--one-copy", action="store_true",
                    help="write straight into the worker's weights "
                         "(Writer/Targets) instead of through buffers")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"rl_weight_sync.py: needs a CUDA GPU, and torch "
              f"{torch.__version__} sees none (a CPU build, or no device "
              f"or driver); nothing to sync", file=sys.stderr)
        return 2
    if not allocconf.status().expandable_segments:
        print(f"rl_weight_sync.py: shows ipc_safe() next to expandable "
              f"segments, which are off here: {allocconf.status().reason}",
              file=sys.stderr)
        return 2

    model = make_model(args.layers, args.width, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # Two reusable buffers, allocated once inside ipc_safe(); or none.
    sender = None if args.one_copy else Sender(64 << 20, buffers=2)
    writer = Writer(timeout=300) if args.one_copy else None

    ctx = mp.get_context("spawn")
    channel, theirs = Channel.pipes(timeout=300)
    proc = ctx.Process(target=worker,
                       args=(args.layers, args.width, theirs, args.one_copy))
    proc.start()
    theirs.close()  # the worker's end is the worker's alone
    ok = True
    for step in range(args.steps):
        x = torch.randn(64, args.width, device="cuda", dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        weights = {n: p.detach() for n, p in model.named_parameters()}
        channel.put("sync")
        if writer is not None:  # the worker offers, the trainer writes
            writer.sync(weights, channel)
        else:
            assert sender is not None
            sender.sync(weights, channel)
        got = channel.get(300)
        ms = (time.perf_counter() - t0) * 1e3
        want = checksum(list(weights.values()))
        same = abs(got - want) <= 1e-6 * max(1.0, abs(want))
        ok &= same
        print(f"step {step}: loss {loss.item():.4f}, sync {ms:.1f} ms, "
              f"worker checksum {'matches' if same else 'DIFFERS'}")
    if writer is not None:
        writer.close()  # let go of the worker's weights before it exits
    channel.put(None)
    proc.join(timeout=120)
    where = ("worker weights classic, written in place" if sender is None
             else f"sync buffers classic (ipc_capable="
                  f"{allocconf.ipc_capable(sender.buffers[0])})")
    print(f"{'all syncs intact' if ok else 'SYNC FAILED'}; segments: "
          f"trainer weights expandable, {where}")
    return 0 if ok and proc.exitcode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
