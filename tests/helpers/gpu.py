"""Helpers for child processes of the GPU suite: where a tensor's memory
lives and what torch's allocator reports."""
import os

import torch

MiB = 1 << 20


def alloc(mib=64):
    """A fresh tensor of `mib` MiB on the current CUDA device."""
    return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")


def segment_of(t):
    """The memory_snapshot() segment holding tensor t's storage."""
    ptr = t.untyped_storage().data_ptr()
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg
    raise AssertionError(f"no segment holds 0x{ptr:x}")


def expandable(t):
    """Whether tensor t lives in an expandable segment."""
    return bool(segment_of(t)["is_expandable"])


def settings():
    """torch's live allocator settings (CUDA must be initialised)."""
    s = dict(torch.cuda.memory._snapshot()["allocator_settings"])
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in s.items()}


def last_string():
    """The last configuration string torch's CUDA allocator parsed."""
    s = settings()
    return s.get("PYTORCH_CUDA_ALLOC_CONF", s.get("PYTORCH_ALLOC_CONF"))


def start_on_uuid(ctx, target, args):
    """`ctx.Process(target=target, args=args)` started with
    CUDA_VISIBLE_DEVICES naming GPU 0 by its UUID, as an engine worker
    given its own sees it; this process's variable restored after."""
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    try:
        proc = ctx.Process(target=target, args=args)
        proc.start()
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
    return proc


def bf16_on_cpu(hf):
    """What a bf16 engine holds of the state dict `hf`, on the CPU."""
    return {k: v.to(torch.bfloat16).cpu() for k, v in hf.items()}


def mp_check_arange(q, done):
    """torch.multiprocessing child: receive a CUDA tensor, say whether it
    holds exactly arange(n) in float32."""
    t = q.get()
    ref = torch.arange(t.numel(), dtype=torch.float32, device=t.device)
    done.put(bool(torch.equal(t, ref)))
    del t


def arange_seen_by_spawned_child(t):
    """Send tensor t (arange(n) in float32) to a child started with
    torch.multiprocessing's spawn method; return (whether the child read
    exactly arange(n), the child's exit code)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=mp_check_arange, args=(q, done))
    p.start()
    q.put(t)
    same = done.get(timeout=120)
    p.join(timeout=120)
    return same, p.exitcode


def mp_copy_to_device_and_hash(q, done, device):
    """torch.multiprocessing child: receive a CUDA tensor, copy it onto
    `device`, answer the SHA-256 of its bytes."""
    import hashlib

    t = q.get()
    mine = t.to(f"cuda:{device}")
    torch.cuda.synchronize(device)
    done.put(hashlib.sha256(mine.view(torch.int16).cpu().numpy()
                            .tobytes()).hexdigest())
    del t
