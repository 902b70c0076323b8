"""The engine side of allocconf.transfer for the GPU tests and the
benchmark: a spawned process that loads each Message into its own
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

    dst = {n: torch.zeros(shape, dtype=getattr(torch, d), device="cuda")
           for n, d, shape in spec}
    receiver = Receiver()
    seen = {}
    while True:
        msg = inbox.get()
        if msg is None:
            return
        if msg == "digests":
            torch.cuda.synchronize()
            outbox.put(digests(dst if mode == "load" else seen))
            continue
        if mode == "load":
            outbox.put(receiver.load(msg, dst))
        else:  # views: copy out of the zero-copy views, then release
            for n, v in receiver.views(msg).items():
                seen[n] = v.clone()
            outbox.put(receiver.release(msg))
