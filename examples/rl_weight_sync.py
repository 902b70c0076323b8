"""RL weight sync with allocconf: a trainer that keeps its memory in
expandable segments pushes its weights to an inference worker through
CUDA IPC, packed into one IPC-safe buffer.

    python examples/rl_weight_sync.py [--steps N] [--layers N] [--width N]

The trainer trains (expandable segments: no fragmentation), then for each
sync copies every parameter into one flat buffer allocated once inside
``allocconf.ipc_safe()`` (classic memory, shareable by cudaIpcGetMemHandle)
and sends it with torch.multiprocessing.  The worker (another process, as
an inference engine would be) copies the weights into its own model and
answers with a checksum, which the trainer checks.  Exits 0 when every
sync arrived intact.
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
    """The inference side: load each sync into its own weights."""
    model = make_model(layers, width, "cuda")
    params = list(model.parameters())
    while True:
        msg = inbox.get()
        if msg is None:
            return
        flat, sizes = msg  # a CUDA tensor rebuilt from an IPC handle
        with torch.no_grad():
            for p, src in zip(params, flat.split(sizes)):
                p.copy_(src.view_as(p))
        torch.cuda.synchronize()
        outbox.put(checksum(params))
        del flat, msg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args()
    assert allocconf.status().expandable_segments, allocconf.status().reason

    model = make_model(args.layers, args.width, "cuda")
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sizes = [p.numel() for p in params]

    # The sync buffer: allocated once, inside the window, so that it is
    # classic memory that CUDA IPC can share with another process.
    with allocconf.ipc_safe():
        flat = torch.empty(sum(sizes), dtype=torch.bfloat16, device="cuda")
    allocconf.check_ipc({"flat": flat})  # raises if it were expandable
    views = list(flat.split(sizes))

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
        with torch.no_grad():
            torch._foreach_copy_(views, [p.detach().view(-1) for p in params])
        torch.cuda.synchronize()
        inbox.put((flat, sizes))
        got = outbox.get(timeout=300)
        ms = (time.perf_counter() - t0) * 1e3
        want = checksum(params)
        same = abs(got - want) <= 1e-6 * max(1.0, abs(want))
        ok &= same
        print(f"step {step}: loss {loss.item():.4f}, sync {ms:.1f} ms, "
              f"worker checksum {'matches' if same else 'DIFFERS'}")
    inbox.put(None)
    proc.join(timeout=120)
    print(f"{'all syncs intact' if ok else 'SYNC FAILED'}; segments: "
          f"trainer weights expandable, sync buffer classic "
          f"(ipc_capable={allocconf.ipc_capable(flat)})")
    return 0 if ok and proc.exitcode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
