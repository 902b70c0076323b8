"""The engine side of allocconf.transfer's one-copy mode for the GPU
tests: a spawned process that holds weights in classic memory, exports
them as Targets and serves syncs, driven by commands on `ctl_in`,
answering on `ctl_out` (an error as its text)."""


def engine_process(ctl_in, ctl_out, to_engine, to_trainer, paths):
    import contextlib
    import sys

    sys.path[:0] = paths
    import allocconf
    import torch
    from allocconf.transfer import Channel, Targets
    from engine_standin import Engine

    channel = Channel(to_trainer, to_engine)
    state = {}

    def build(layers, hidden, vocab, classic):
        """The stand-in engine, its weights in classic memory or (not
        `classic`) where the allocator puts them: expandable segments."""
        with (allocconf.ipc_safe() if classic
              else contextlib.nullcontext()):
            return Engine(layers, hidden, vocab, dtype=torch.bfloat16,
                          device="cuda")

    while True:
        cmd = ctl_in.get()
        if cmd is None:
            return
        try:
            kind = cmd[0]
            if kind == "stand-in":  # (kind, layers, hidden, vocab, classic)
                state["engine"] = build(*cmd[1:])
                state["targets"] = Targets(state["engine"].targets())
                out = "ok"
            elif kind == "serve":
                r = state["targets"].serve(channel, timeout=cmd[1])
                torch.cuda.synchronize()
                out = [r.complete, r.sync, r.error]
            elif kind == "check":
                out = state["engine"].matches(cmd[1])
            elif kind == "in doubt":
                t = state["targets"]
                out = [t.sync, t.complete]
            elif kind == "reallocate":
                # A reload into new memory: the old Targets refuse to
                # offer, new ones are made, the old closed (the trainer is
                # told) and the old weights dropped.
                old = state["targets"]
                e = state["engine"]
                with allocconf.ipc_safe():
                    for p in e.params.values():
                        p.data = torch.zeros_like(p)
                try:
                    old.offer()
                    refused = None
                except Exception as exc:
                    refused = f"{type(exc).__name__}: {exc}"
                old.close(channel)
                state["targets"] = Targets(e.targets())
                del old
                out = refused
            elif kind == "memory":
                torch.cuda.synchronize()
                torch.cuda.ipc_collect()
                out = torch.cuda.memory_allocated()
            elif kind == "tear":
                out = tear(state, channel, *cmd[1:])
            else:
                out = f"unknown command {cmd!r}"
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        ctl_out.put(out)


def tear(state, channel, handshake, n, mib, sleep_ms):
    """An engine generating in a loop: each forward reads the weight's
    two halves with a pause between them (each half's min and max kept
    on the device); with `handshake` a sync is served before each
    forward (offer, the trainer writes, accept), without it the trainer
    writes through the map whenever it likes.  Answers the forwards
    whose halves disagree (torn), and with the handshake whether forward
    i saw exactly sync i's value (i + 1)."""
    import allocconf
    import torch
    from allocconf.transfer import Targets

    with allocconf.ipc_safe():
        w = torch.zeros(mib << 19, dtype=torch.bfloat16, device="cuda")
    targets = Targets({"w": w})
    targets.announce(channel)
    half = w.numel() // 2
    stats = torch.empty(n, 4, dtype=torch.float32, device="cuda")
    cycles = int(sleep_ms * 2e6)  # about 2 GHz
    for i in range(n):
        if handshake:
            if not targets.serve(channel, timeout=60).complete:
                raise RuntimeError(f"sync {i + 1} incomplete")
        a = w[:half]
        stats[i, 0] = a.amin().float()
        stats[i, 1] = a.amax().float()
        torch.cuda._sleep(cycles)
        b = w[half:]
        stats[i, 2] = b.amin().float()
        stats[i, 3] = b.amax().float()
    torch.cuda.synchronize()
    s = stats.cpu()
    torn = int((s.amax(dim=1) != s.amin(dim=1)).sum())
    exact = bool((s == torch.arange(1, n + 1).float()[:, None]).all())
    changed = int((s[1:, 0] != s[:-1, 0]).sum())
    targets.close(channel)
    return {"torn": torn, "exact": exact, "changes_seen": changed,
            "forwards": n}
