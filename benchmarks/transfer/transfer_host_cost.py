"""Where a warm allocconf.transfer sync spends its host time: the
transfer approach of ipc_sync.py (512 bf16 tensors of --gib GiB, default
0.1; 30 warm syncs), with the transfer's steps on both sides (trainer
and engine) wrapped in timers.  Prints, per step, how often it ran and
its median and mean host time, and writes
transfer_host_cost_{trainer,engine}_{gib}.json.

The timers add about a microsecond per call; the channel's get includes
the wait for the peer, so it tells no cost of its own.  First it prints
the round trip of a real Bucket message (of a warm sync, the plan known,
made on the CPU by allocconf.transfer.testing) to a spawned echo process
and back, over two multiprocessing queues and over a pipe: the floor of
a hand-over.  That part runs without a GPU (``--round-trips``).

With APPROACH one-copy the one-copy mode is timed instead (Writer and
Targets), and the device time of each replay of its copies and of each
whole Writer.write (CUDA events on the current stream around them) is
printed; the files are then named ..._{gib}_one-copy.json.  For either
mode it ends with the timeline of a warm sync: when each timed step
began and ended on both sides, and when the trainer's copies ran.

Usage: python benchmarks/transfer/transfer_host_cost.py [GIB [APPROACH]]
       python benchmarks/transfer/transfer_host_cost.py --round-trips
       (OUT: $OUT, else .)
"""
from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, DefaultDict, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROUND_TRIPS_ONLY = sys.argv[1:2] == ["--round-trips"]
if ROUND_TRIPS_ONLY:
    sys.argv = sys.argv[:1]
if sys.argv[1:2] != ["--gib"]:  # a spawned engine inherits the argv set here
    sys.argv = ["ipc_sync.py", "--gib",
                sys.argv[1] if len(sys.argv) > 1 else "0.1",
                "--warm", "30", "--only",
                sys.argv[2] if len(sys.argv) > 2 else "transfer"]
APPROACH = sys.argv[sys.argv.index("--only") + 1]
SUFFIX = "" if APPROACH == "transfer" else f"_{APPROACH}"
sys.path.insert(0, HERE)

import ipc_sync  # noqa: E402
from allocconf import transfer as T  # noqa: E402
from allocconf.transfer import _copies, _device, _replay, _writer  # noqa: E402

TIMES: DefaultDict[str, List[float]] = collections.defaultdict(list)
# (what, entered, left) of every timed call, perf_counter
# seconds (one clock for both processes), for the timeline of a sync
TIMELINE: List[Any] = []


def timed(cls: Any, name: str, label: str = "") -> None:
    f: Callable[..., Any] = getattr(cls, name)
    key = label or f"{cls.__name__}.{name}"

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            now = time.perf_counter()
            TIMES[key].append(now - t)
            TIMELINE.append((key, t, now))
    setattr(cls, name, wrapper)


# (start, end) events around each call, on the current stream, by name
DEVICE: DefaultDict[str, List[Any]] = collections.defaultdict(list)


def device_timed(cls: Any, name: str) -> None:
    import torch
    f: Callable[..., Any] = getattr(cls, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        try:
            return f(*a, **k)
        finally:
            ev[1].record()
            DEVICE[f"{cls.__name__}.{name}"].append(ev)
    setattr(cls, name, wrapper)


def instrument() -> None:
    for n in ("get", "put"):
        timed(T.Channel, n)
    for n in ("fits", "still"):  # the replay check, both modes
        timed(_replay.Sources, n)
    for n in ("wait", "record"):  # both write on the current stream
        timed(_device.Cuda, n)
    if APPROACH == "one-copy":
        for n in ("write", "_write_all", "sync"):
            timed(T.Writer, n)
        for n in ("offer", "check", "accept", "serve"):
            timed(T.Targets, n)
        timed(_writer._Copies, "run")
        device_timed(_writer._Copies, "run")
        device_timed(T.Writer, "write")  # its wait on the engine's event too
        import torch
        timed(torch.cuda, "synchronize", "torch.cuda.synchronize")
        timed(torch.cuda.Stream, "synchronize", "Stream.synchronize")
        return
    for n in ("load", "_ack", "_wait", "_bucket", "serve"):
        timed(T.Receiver, n)
    for n in ("_pack", "_message", "_take", "acknowledge", "drain", "sync"):
        timed(T.Sender, n)
    timed(_copies.Program, "run")
    timed(_copies.Lanes, "run")
    device_timed(_copies.Program, "run")
    device_timed(_copies.Lanes, "run")


def report(who: str) -> None:
    out = {k: {"calls": len(v), "median_us": statistics.median(v) * 1e6,
               "mean_us": sum(v) / len(v) * 1e6}
           for k, v in sorted(TIMES.items()) if v}
    path = os.path.join(os.environ.get("OUT", "."),
                        f"transfer_host_cost_{who}_{sys.argv[2]}"
                        f"{SUFFIX}.json")
    if DEVICE:
        import torch
        torch.cuda.synchronize()
    for key, evs in DEVICE.items():
        ms = [a.elapsed_time(b) for a, b in evs]
        warm = statistics.median(ms[1:])
        out[f"device {key}"] = {"calls": len(ms), "median_ms": warm}
        print(f"{who:8} on the device, {key}: median {warm:.3f} ms per "
              f"call (of {len(ms)})", flush=True)
    out["timeline"] = TIMELINE
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for k, r in out.items():
        if not isinstance(r, dict) or "median_us" not in r:
            continue
        print(f"{who:8} {k:24} calls {r['calls']:4d} median "
              f"{r['median_us']:8.1f} us  mean {r['mean_us']:8.1f} us",
              flush=True)


def echo_queues(inbox: Any, outbox: Any) -> None:
    while True:
        x = inbox.get()
        if x is None:
            return
        outbox.put(x)


def echo_pipe(conn: Any) -> None:
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x)


def median_round_trip(put: Callable[[Any], None], get: Callable[[], Any],
                      msg: Any, n: int = 300) -> float:
    """Seconds for `msg` to go to the echo process and back, median of
    `n` after one warm-up; the echo then told to stop."""
    put(msg)
    get()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        put(msg)
        get()
        ts.append(time.perf_counter() - t)
    put(None)
    return statistics.median(ts)


def bucket() -> Any:
    """A Bucket of a warm sync (the receiver knows the plan), made on the
    CPU; its handle replaced by one shaped like CUDA's (reduce_tensor's:
    a function and 12 arguments)."""
    import torch

    from allocconf.transfer.testing import HostDevice
    sender = T.Sender(1 << 16, device=HostDevice())
    receiver = T.Receiver(device=HostDevice())
    src = {f"w{i}": torch.zeros(64) for i in range(8)}
    for _ in range(2):
        receiver.bind({k: torch.zeros_like(v) for k, v in src.items()})
        sender.sync(src, T.Channel(_Answer(receiver), _Acks()))
    (msg,) = list(sender.send(src))
    sender.close()
    return msg._replace(handle=(print, tuple(range(12))))


class _Acks:
    """The trainer's inbox of bucket() (what _Answer put)."""
    acks: List[Any] = []

    def get(self, timeout: Any = None) -> Any:
        return self.acks.pop(0)


class _Answer:
    """The trainer's outbox of bucket(): the receiver answers at once."""

    def __init__(self, receiver: Any) -> None:
        self.receiver = receiver

    def put(self, msg: Any) -> None:
        _Acks.acks.append(self.receiver.load(msg))


def round_trips() -> None:
    import multiprocessing as mp
    import pickle
    ctx = mp.get_context("spawn")
    msg = bucket()
    print(f"a Bucket: {len(pickle.dumps(msg))} bytes pickled")
    a, b = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo_queues, args=(a, b))
    p.start()
    q = median_round_trip(a.put, b.get, msg)
    p.join()
    print(f"multiprocessing queues: round trip {q * 1e6:.1f} us "
          f"(median of 300)")
    c1, c2 = ctx.Pipe()
    p = ctx.Process(target=echo_pipe, args=(c2,))
    p.start()
    pipe = median_round_trip(c1.send, c1.recv, msg)
    p.join()
    print(f"pipe: round trip {pipe * 1e6:.1f} us (median of 300)",
          flush=True)


def engine(*args: Any) -> None:
    instrument()
    try:
        ipc_sync.receiver(*args)
    finally:
        report("engine")


STARTS: List[Any] = []  # (host time, device event) at each sync


def sync_started(f: Callable[..., Any]) -> Callable[..., Any]:
    """ipc_sync.one_sync, its start stamped on the host and on the
    device (an event on the idle current stream completes at once)."""
    import torch

    def wrapper(*a: Any, **k: Any) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        STARTS.append((time.perf_counter(), ev))
        ev.record()
        return f(*a, **k)
    return wrapper


def timeline() -> None:
    """When, after a sync's start, each step happened, median
    over the warm syncs: the trainer's steps, the engine's (one clock:
    perf_counter is CLOCK_MONOTONIC), and the copies on the device,
    measured from the event recorded at the start (which the device
    reaches some time after the host recorded it: on the H200 the
    copies "began" 0.05 ms after it though launched 0.29 ms after the
    start, so the device times are late-anchored by about 0.24 ms)."""
    path = os.path.join(os.environ.get("OUT", "."),
                        f"transfer_host_cost_engine_{sys.argv[2]}"
                        f"{SUFFIX}.json")
    with open(path) as f:
        eng = json.load(f)["timeline"]
    copies = DEVICE.get("_Copies.run" if APPROACH == "one-copy"
                        else "_Program.run", [])
    steps: DefaultDict[str, List[float]] = collections.defaultdict(list)
    for i, (h0, ev0) in enumerate(STARTS[1:], 1):  # warm syncs
        end = STARTS[i + 1][0] if i + 1 < len(STARTS) else h0 + 1.0
        if i < len(copies):
            a, b = copies[i]
            steps["device: copies begin"].append(ev0.elapsed_time(a) / 1e3)
            steps["device: copies end"].append(ev0.elapsed_time(b) / 1e3)
        for who, line in (("trainer", TIMELINE), ("engine", eng)):
            seen: Dict[str, int] = collections.Counter()
            for key, t_in, t_out in line:
                if h0 <= t_in < end:
                    seen[key] += 1
                    n = "" if seen[key] == 1 else f" #{seen[key]}"
                    steps[f"{who}: {key}{n} in"].append(t_in - h0)
                    steps[f"{who}: {key}{n} out"].append(t_out - h0)
    rows = sorted((statistics.median(v), k) for k, v in steps.items()
                  if len(v) >= len(STARTS) // 2)
    print(f"{APPROACH} sync timeline (ms after its start, median of the "
          "warm syncs):", flush=True)
    for t, k in rows:
        print(f"  {t * 1e3:7.3f}  {k}", flush=True)


if __name__ == "__main__":
    round_trips()
    if ROUND_TRIPS_ONLY:
        sys.exit(0)
    instrument()
    ipc_sync.receiver = engine  # what ipc_sync.run() spawns
    ipc_sync.one_sync = sync_started(ipc_sync.one_sync)
    ipc_sync.main()
    report("trainer")
    timeline()
