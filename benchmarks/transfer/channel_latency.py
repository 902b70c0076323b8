"""How late a weight-sync message arrives, by channel: a Bucket-shaped
object put on an allocconf.transfer Channel by the trainer, which then
goes on working for `--busy` microseconds (as Sender.sync does after
putting a bucket: it packs the next), and taken by a spawned peer that
notes when it came (perf_counter: one clock for both processes).  The
work is either pure Python (which holds the GIL but for the
interpreter's switch interval, 5 ms) or a loop of small torch ops (whose
calls release it).

  queues  Channel over two multiprocessing queues: put hands the message
          to the queue's feeder thread, which pickles and writes it once
          it gets the GIL
  pipes   Channel.pipes(): the message pickled and written in the
          putting thread; the peer's get polls the pipe for 2 ms (its
          spin) before it sleeps in select
  sleeps  the same with spin=0: the peer sleeps in select at once, and
          the kernel wakes it

No GPU needed: this is host latency only.  Prints, per kind of work,
busy time and channel, the median one-way latency (of --count messages, after 20 warm-up
ones) and writes channel_latency.json.

Usage: python benchmarks/transfer/channel_latency.py [--out DIR] [--count N]
           [--busy 0,300,2000]
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402  (torch's reductions)

from allocconf.transfer import Bucket, Channel  # noqa: E402
from common import machine, median, option, out_dir_arg, save  # noqa: E402

COUNT = int(option("--count", "200"))
BUSY_US = [int(b) for b in option("--busy", "0,300,2000").split(",")]
WARM = 20


def peer(channel: Channel) -> None:
    """Note when each message came; send the delays back at the end."""
    delays: List[float] = []
    channel.put("ready")
    while True:
        msg = channel.get(60)
        if msg is None:
            channel.put(delays)
            return
        delays.append(time.perf_counter() - msg[0])


def busy(seconds: float, work: str, a: Any, b: Any) -> None:
    """Python for `seconds`; with work "torch", a copy_ per turn."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if work == "torch":
            a.copy_(b)


def measure(kind: str, busy_s: float, work: str) -> List[float]:
    ctx = mp.get_context("spawn")
    if kind in ("pipes", "sleeps"):
        mine, theirs = Channel.pipes(spin=0.002 if kind == "pipes" else 0)
    else:
        out, back = ctx.Queue(), ctx.Queue()
        mine, theirs = Channel(out, back), Channel(back, out)
    proc = ctx.Process(target=peer, args=(theirs,))
    proc.start()
    theirs.close()  # pipes: the parent holds no copy of the peer's end
    assert mine.get(120) == "ready"
    a, b = torch.zeros(16), torch.ones(16)
    msg = Bucket("s" * 32, 1, 0, 0, True, ("rebuild", tuple(range(12))),
                 b"e" * 64, "GPU-uuid", "p" * 32)
    for _ in range(WARM + COUNT):
        mine.put((time.perf_counter(), msg))
        busy(busy_s, work, a, b)
        time.sleep(0.001)  # the peer idle again before the next
    mine.put(None)
    delays: List[float] = mine.get(60)
    proc.join(timeout=60)
    return delays[WARM:]


def main() -> None:
    results: Dict[str, Any] = {}
    print(f"one-way latency of a Bucket-shaped object, median of {COUNT}, "
          f"the putter busy in Python after the put:", flush=True)
    for work in ("python", "torch"):
        for b in BUSY_US:
            if work == "torch" and not b:
                continue  # the same as idle Python
            row = {kind: median(measure(kind, b / 1e6, work)) * 1e6
                   for kind in ("queues", "pipes", "sleeps")}
            results[f"{work} {b}"] = row
            print(f"  {work:6} work {b:5d} us: queues {row['queues']:8.1f} "
                  f"us, pipes {row['pipes']:7.1f} us "
                  f"({row['queues'] / row['pipes']:.1f}x), pipes with "
                  f"spin=0 {row['sleeps']:7.1f} us", flush=True)
    save("channel_latency", {"machine": machine(), "count": COUNT,
                             "busy_us": BUSY_US, "latency_us": results},
         out_dir_arg())


if __name__ == "__main__":
    main()
