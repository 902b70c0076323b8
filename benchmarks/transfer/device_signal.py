"""Would a flag in device memory hand a bucket from the trainer to the
engine sooner than an interprocess event and a pipe message?  The
question behind the fixed cost of a bucketed sync (about 0.55 ms on the
H100, docs/benchmarks.md): between the trainer's copies and the
engine's, the device waits for the message, the engine's wake-up and
its launch.  An experiment, not the library: two processes on one GPU,
one buffer of --gib GiB shared by classic IPC, one copy into it and one
out of it per sync.

  event  as allocconf.transfer hands over now: the trainer copies its
         source into the buffer, records an interprocess event and puts a
         message on Channel.pipes(); the engine takes it, makes its
         stream wait on the event and copies the buffer into its tensor
  flag   the engine queued, while idle, a wait on a 32-bit flag in a
         shared device word (cuStreamWaitValue32) and its copy behind
         it, then a write of an ack word (cuStreamWriteValue32); the
         trainer's stream waits for the previous ack (the buffer free),
         copies and writes the flag (the write orders the copy's bytes
         before it), and no host hand-over sits between the two copies

Both end alike: the engine sees its copy done (polling an event) and
answers over the pipe; the trainer's time is from its copy's launch to
the answer.  Every sync writes other bytes, checked on the engine (a
strided sample of its tensor).  A stream left waiting on a word that
never comes (a peer dead or late by --timeout seconds) is released by
its own side writing the word from another stream: the run fails, the
GPU does not hang.

Prints, per size, the warm median (ms) of each way against one and two
copies at the bandwidth measured in the run, and writes
device_signal.json.  Written 2026-12-07 without a GPU to run it on: its
first run is its test.

Usage: python benchmarks/transfer/device_signal.py [--out DIR] [--gib 0.1,1,2]
           [--warm N] [--timeout S]
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402  (torch's reductions)

import allocconf  # noqa: E402  (expandable segments on, as in training)
from allocconf.transfer import Channel  # noqa: E402
from common import (cuda_median, machine, median, option,  # noqa: E402
                    out_dir_arg, save)

GiB = 1 << 30
SIZES = [float(x) for x in option("--gib", "0.1,1,2").split(",")]
WARM = int(option("--warm", "20"))
TIMEOUT = float(option("--timeout", "30"))
WAIT_GEQ = 0x0         # CU_STREAM_WAIT_VALUE_GEQ
RELEASE = 0x7FFFFFFF   # a word no sync reaches: frees any wait on it


def driver() -> Dict[str, Callable[..., int]]:
    """The driver's stream memory operations, through ctypes."""
    lib = ctypes.CDLL("libcuda.so.1")
    fns = {}
    for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
        for symbol in (name + "_v2", name):
            f = getattr(lib, symbol, None)
            if f is not None:
                break
        else:
            raise RuntimeError(f"libcuda has no {name}")
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                      ctypes.c_uint]
        f.restype = ctypes.c_int
        fns[name] = f
    return fns


def mem_op(f: Callable[..., int], stream: torch.cuda.Stream, ptr: int,
           value: int, flags: int = 0) -> None:
    rc = f(stream.cuda_stream, ptr, value, flags)
    if rc != 0:
        raise RuntimeError(f"{f.__name__}: CUDA driver error {rc}")


def release(word: torch.Tensor) -> None:
    """Free a stream waiting on word: write it from another stream."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        word.fill_(RELEASE)
    side.synchronize()


def wait_done(done: torch.cuda.Event, word: torch.Tensor) -> None:
    """Poll done until it completed; past the timeout, release the
    stream waiting on word and fail."""
    deadline = time.monotonic() + TIMEOUT
    while not done.query():
        if time.monotonic() > deadline:
            release(word)
            raise TimeoutError(f"the copy did not end in {TIMEOUT} s")


def engine(mode: str, buf: torch.Tensor, flags: torch.Tensor,
           event: bytes, chan: Any) -> None:
    try:
        fns = driver()
        dst = torch.empty_like(buf)
        s = torch.cuda.Stream()
        done = torch.cuda.Event()
        theirs = torch.cuda.Event.from_ipc_handle(
            torch.cuda.current_device(), event)
        flag, ack = flags[0:1], flags[1:2]
        bad = torch.zeros((), dtype=torch.bool, device="cuda")
        probe = slice(None, None, max(1, buf.numel() // 4099))

        def queue(k: int) -> None:
            with torch.cuda.stream(s):
                if mode == "flag":
                    mem_op(fns["cuStreamWaitValue32"], s, flag.data_ptr(),
                           k, WAIT_GEQ)
                else:
                    s.wait_event(theirs)
                dst.copy_(buf)
                if mode == "flag":
                    mem_op(fns["cuStreamWriteValue32"], s, ack.data_ptr(), k)
                done.record(s)

        chan.put("ready")
        if mode == "flag":
            queue(1)
        for k in range(1, 2 + WARM):
            if mode == "event":
                got = chan.get(TIMEOUT)
                assert got == k, (got, k)
                queue(k)
            wait_done(done, flag)
            chan.put(k)
            with torch.cuda.stream(s):
                bad |= (dst[probe] != k % 251).any()
            if mode == "flag" and k < 1 + WARM:
                queue(k + 1)
        assert chan.get(TIMEOUT) is None
        chan.put(not bool(bad.item()))
    except Exception as exc:
        release(flags[0:1])  # its stream may wait on a flag never written
        chan.put(f"{type(exc).__name__}: {exc}")


def one_way(mode: str, nbytes: int) -> Dict[str, Any]:
    """Warm median (s) of 1 + WARM syncs the given way, and whether the
    engine saw every sync's bytes."""
    fns = driver()
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with allocconf.ipc_safe():
        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        flags = torch.zeros(2, dtype=torch.int32, device="cuda")
    flag, ack = flags[0:1], flags[1:2]
    ev = torch.cuda.Event(interprocess=True)
    ts = torch.cuda.Stream()
    ev.record(ts)  # a handle can be taken of a recorded event
    chan, theirs = Channel.pipes(timeout=TIMEOUT)
    proc = mp.get_context("spawn").Process(
        target=engine, args=(mode, buf, flags, ev.ipc_handle(), theirs))
    proc.start()
    theirs.close()
    times: List[float] = []
    try:
        got = chan.get(120)
        if got != "ready":
            raise RuntimeError(got)
        for k in range(1, 2 + WARM):
            src.fill_(k % 251)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.cuda.stream(ts):
                if mode == "flag":  # the engine's copy out of buf done
                    mem_op(fns["cuStreamWaitValue32"], ts, ack.data_ptr(),
                           k - 1, WAIT_GEQ)
                buf.copy_(src)
                if mode == "flag":
                    mem_op(fns["cuStreamWriteValue32"], ts, flag.data_ptr(),
                           k)
                else:
                    ev.record(ts)
                    chan.put(k)
            got = chan.get(TIMEOUT)
            times.append(time.perf_counter() - t0)
            if got != k:
                raise RuntimeError(f"sync {k}: the engine said {got!r}")
        chan.put(None)
        correct = chan.get(TIMEOUT)
    except BaseException:
        release(ack)
        raise
    finally:
        proc.join(timeout=60)
        if proc.exitcode is None:
            proc.kill()
    torch.cuda.synchronize()
    return {"warm_ms": median(times[1:]) * 1e3, "correct": correct}


def main() -> None:
    out = out_dir_arg()
    runs = []
    print("| GiB | one copy (ms) | two copies | event | flag | event / two "
          "copies | flag / two copies |\n|---:|---:|---:|---:|---:|---:|"
          "---:|", flush=True)
    for gib in SIZES:
        nbytes = int(gib * GiB) // 4096 * 4096
        a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        one = cuda_median(lambda a=a, b=b: b.copy_(a), runs=10) * 1e3
        del a, b
        torch.cuda.empty_cache()
        ways = {m: one_way(m, nbytes) for m in ("event", "flag")}
        runs.append({"gib": nbytes / GiB, "one_copy_ms": one, **ways})

        def cell(m: str) -> str:
            w = ways[m]
            return f"{w['warm_ms']:.3f}" if w["correct"] is True else \
                f"wrong: {w['correct']}"
        print(f"| {gib:g} | {one:.3f} | {2 * one:.3f} | {cell('event')} | "
              f"{cell('flag')} | {ways['event']['warm_ms'] / (2 * one):.2f}x"
              f" | {ways['flag']['warm_ms'] / (2 * one):.2f}x |", flush=True)
    save("device_signal", {"machine": machine(), "warm": WARM,
                           "runs": runs}, out)


if __name__ == "__main__":
    main()
