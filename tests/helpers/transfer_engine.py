"""The engine side of allocconf.transfer for the GPU tests and the
benchmark: a spawned process that loads each Bucket into its own
tensors (or reads zero-copy views) and answers with an Ack, and with
SHA-256 digests of what it holds when asked."""
import hashlib


def spec_of(tensors):
    """(name, dtype name, shape) of each tensor: what the engine builds."""
    return [(n, str(t.dtype).replace("torch.", ""), tuple(t.shape))
            for n, t in tensors.items()]


def digests(tensors):
    import torch

    return {n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8)
                              .cpu().numpy().tobytes()).hexdigest()
            for n, t in tensors.items()}


def engine(spec, inbox, outbox, mode="load"):
    import torch
    from allocconf.transfer import Receiver

    def zeros():
        return {n: torch.zeros(shape, dtype=getattr(torch, d),
                               device="cuda") for n, d, shape in spec}

    dst = zeros()
    receiver = Receiver()
    if mode == "bound":  # its copies kept per bucket layout (graphed)
        receiver.bind(dst)
    seen = {}
    while True:
        msg = inbox.get()
        if msg is None:
            return
        if msg == "digests":
            torch.cuda.synchronize()
            outbox.put(digests(seen if mode == "views" else dst))
            continue
        if msg == "graphed":  # whether every bound copy replays a graph
            outbox.put([b.bound.graphed for b in receiver._buckets.values()
                        if b.bound is not None])
            continue
        if msg == "reload":  # the engine's weights allocated anew
            dst = zeros()
            receiver.bind(dst)
            outbox.put("reloaded")
            continue
        if mode == "bound":
            outbox.put(receiver.load(msg))
        elif mode == "load":
            outbox.put(receiver.load(msg, dst))
        else:  # views: copy out of the zero-copy views, then release
            for n, v in receiver.views(msg).items():
                seen[n] = v.clone()
            outbox.put(receiver.release(msg))


def engine_process(ctl_in, ctl_out, to_engine, to_trainer, paths, layers,
                   hidden, vocab):
    """A spawned inference engine for the GPU tests of the transfer: the
    vLLM-style stand-in of examples/engine_standin.py, in bf16 on this
    process's GPU, driven by commands on `ctl_in`: "serve" (one whole sync
    from the data channel, through load_weights), "check" (compare with
    the CPU state dict that follows), "memory", "take" (one message: a
    close lets go of the sender), None (exit).  Answers on `ctl_out`."""
    import sys

    sys.path[:0] = paths
    import torch
    from allocconf.transfer import Channel, Close, Receiver
    from engine_standin import Engine

    engine = Engine(layers, hidden, vocab, dtype=torch.bfloat16,
                    device="cuda")
    receiver = Receiver()
    channel = Channel(to_trainer, to_engine)
    while True:
        cmd = ctl_in.get()
        if cmd is None:
            return
        try:
            if cmd == "serve":
                r = receiver.serve(channel,
                                   load_weights=engine.load_weights,
                                   timeout=120)
                torch.cuda.synchronize()
                out = [r.complete, r.buckets, receiver.complete]
            elif cmd == "check":
                out = engine.matches(ctl_in.get())
            elif cmd == "memory":
                torch.cuda.synchronize()
                out = [torch.cuda.memory_allocated(),
                       len(receiver._buffers)]
            elif cmd == "take":
                msg = channel.get(60)
                if isinstance(msg, Close):
                    receiver.forget(msg.sender)
                out = [type(msg).__name__.lower(), len(receiver._buffers)]
            else:
                out = f"unknown command {cmd!r}"
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        ctl_out.put(out)
