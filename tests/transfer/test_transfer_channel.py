"""Channel.pipes: the two ends of a channel over pipes, for an engine in
a child process.  Messages in order and whole (large ones too, threads
sharing an end), a silent peer timing out with the channel still usable,
a peer that stops reading failing the write instead of hanging, a
pickling error leaving nothing written, and a whole sync into a child
engine whose exit is then seen at once rather than after the timeout
(tests/helpers/pipe_peer.py holds the children; allocconf.transfer.
testing stands in for CUDA IPC)."""
import multiprocessing as mp
import threading
import time

import pytest

from helpers import run_json, torch_facts

torch_facts()  # skips this module without torch
import torch  # noqa: E402

from allocconf.transfer import Bucket, Channel, Sender  # noqa: E402
from allocconf.transfer import TransferError  # noqa: E402
from helpers import pipe_peer  # noqa: E402
from allocconf.transfer.testing import HostDevice  # noqa: E402


def start(target, *args):
    """`target` in a spawned child, given the child's end; the parent's
    copy of that end closed once the child has started."""
    mine, theirs = Channel.pipes(timeout=30)
    proc = mp.get_context("spawn").Process(target=target,
                                           args=(theirs,) + args)
    proc.start()
    theirs.close()
    return mine, proc


def raised_within(seconds, fn, *args):
    """What `fn(*args)` raised, run in a daemon thread: a hang fails the
    test after `seconds` instead of stalling the suite."""
    out = []

    def run():
        try:
            fn(*args)
            out.append(None)
        except BaseException as exc:
            out.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert out, f"{fn.__name__} still waits after {seconds} s"
    return out[0]


def stop(proc):
    proc.join(timeout=30)
    if proc.exitcode is None:
        proc.kill()
        pytest.fail("the child did not exit")


def test_messages_cross_to_a_child_and_back_in_order_and_whole():
    mine, proc = start(pipe_peer.echo)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: 16 times the pipe's buffer
        msg = Bucket("s", 1, 0, 0, True, ("h", (1, 2)), b"e" * 64,
                      "GPU-x", "p")
        sent = [msg, big, {"k": (1.5, None)}, torch.arange(5)]
        for m in sent:
            mine.put(m)
        got = [mine.get(30) for _ in sent]
        assert got[:3] == sent[:3]
        assert torch.equal(got[3], sent[3])
        # What cannot be pickled is refused before a byte is written: the
        # channel goes on.
        with pytest.raises(Exception) as err:
            mine.put(lambda: 0)
        assert not isinstance(err.value, TransferError)
        mine.put("after")
        assert mine.get(30) == "after"
        mine.put(None)
    finally:
        stop(proc)
    assert proc.exitcode == 0


def test_a_silent_peer_times_out_and_the_channel_stays_usable():
    a, b = Channel.pipes()
    t = time.monotonic()
    with pytest.raises(TransferError, match=r"nothing came .* 0\.2 s"):
        a.get(0.2)
    assert time.monotonic() - t < 10
    b.put("late")
    assert a.get(5) == "late"


def test_messages_read_together_come_out_one_by_one_without_waiting():
    # A read takes what the pipe holds (up to 64 KiB): messages written
    # before the reader looked come in one read, the rest kept for the
    # next gets, which then neither wait nor see the pipe empty.
    a, b = Channel.pipes(timeout=5)
    sent = ["one", b"x" * 30000, ("three", 3), "four"]  # < the pipe's 64 KiB
    for m in sent:
        b.put(m)
    t = time.monotonic()
    got = [a.get(0.5) for _ in sent]
    assert got == sent
    assert time.monotonic() - t < 2
    with pytest.raises(TransferError, match="nothing came"):
        a.get(0.1)
    b.put("after")
    assert a.get(5) == "after"


def test_a_message_cut_after_a_whole_one_breaks_the_end_after_it():
    # The whole message is read; the cut one, its bytes already taken
    # with it, then fails as cut (never as "nothing came").
    import os
    from multiprocessing.reduction import ForkingPickler

    from allocconf.transfer._channel import FRAME
    a, b = Channel.pipes(timeout=0.3)
    b.put("whole")
    data = bytes(ForkingPickler.dumps("cut short" * 10))
    os.write(b.outbox._fd(), FRAME.pack(len(data)) + data[:5])
    assert a.get(5) == "whole"
    with pytest.raises(TransferError, match="stopped coming part-way"):
        a.get(5)
    with pytest.raises(TransferError, match="broken"):
        a.get(5)


def test_a_peer_that_stops_reading_fails_the_write_instead_of_hanging():
    a, b = Channel.pipes(timeout=0.3)
    err = raised_within(20, a.put, b"x" * (4 << 20))  # far more than fits
    assert isinstance(err, TransferError)
    assert "read nothing for 0.3 s" in str(err)
    # Part of a message is in the pipe: the end refuses to go on.
    with pytest.raises(TransferError, match="broken"):
        a.put("small")


def test_threads_sharing_an_end_never_interleave_their_messages():
    a, b = Channel.pipes()
    payloads = {i: bytes([i]) * (20000 + i) for i in range(8)}

    def writer(i):
        for _ in range(25):
            a.put((i, payloads[i]))

    threads = [threading.Thread(target=writer, args=(i,)) for i in payloads]
    got = []
    for th in threads:
        th.start()
    for _ in range(8 * 25):
        got.append(b.get(30))
    for th in threads:
        th.join(timeout=30)
    assert sorted(i for i, _ in got) == sorted(list(payloads) * 25)
    assert all(p == payloads[i] for i, p in got)


def test_a_closed_end_refuses_and_bad_timeouts_are_refused_naming_them():
    a, b = Channel.pipes()
    a.close()
    a.close()  # twice: nothing more
    with pytest.raises(RuntimeError, match="closed"):
        a.put("x")
    # The peer sees the closed end at once, not after its timeout.
    err = raised_within(10, b.get, 30)
    assert isinstance(err, TransferError) and "closed the channel" in str(err)
    for bad in (0, -1, "1", True, None):
        with pytest.raises(ValueError, match="timeout"):
            Channel.pipes(timeout=bad)


@pytest.mark.parametrize("spin", [0, 1])
def test_a_get_polls_for_spin_seconds_before_it_sleeps(spin, monkeypatch):
    # A message that comes within `spin` is seen by polling the pipe,
    # never by sleeping in select (whose wake-up is what spin saves); with
    # spin 0 the wait sleeps at once.
    from allocconf.transfer import _channel
    slept = []
    real = _channel.select.select

    def select(r, w, x, timeout=None):
        slept.append(timeout)
        return real(r, w, x, timeout)
    monkeypatch.setattr(_channel.select, "select", select)
    a, b = Channel.pipes(timeout=5, spin=spin)
    later = threading.Timer(0.05, b.put, ("late",))
    later.start()
    assert a.get(5) == "late"
    later.join()
    assert (slept == []) == (spin == 1), slept


def test_spin_never_outlasts_the_timeout_and_travels_to_the_child():
    a, b = Channel.pipes(spin=1)
    t = time.monotonic()
    with pytest.raises(TransferError, match="nothing came"):
        a.get(0.05)
    assert time.monotonic() - t < 0.9  # the timeout's 0.05 s, not spin's
    # What a child's copy of the end is made of (its Process pickles it).
    child = object.__new__(type(b.inbox))
    child.__setstate__(b.inbox.__getstate__())
    assert child._spin == 1.0 and child._timeout == 60.0
    for bad in (-0.1, 1.5, "0", True, None):
        with pytest.raises(ValueError, match=f"spin must be .*{bad!r}"):
            Channel.pipes(spin=bad)


def test_a_sync_into_a_child_engine_then_its_exit_is_seen_at_once():
    shapes = [("a", (300,)), ("b", (7, 9)), ("c", (2000,))]
    mine, proc = start(pipe_peer.engine, shapes)
    sender = Sender(4096, 2, device=HostDevice(), timeout=60)
    try:
        state = {n: torch.full(s, float(i + 1)) for i, (n, s)
                 in enumerate(shapes)}
        buckets = sender.sync(state, mine)
        complete, served, sums = mine.get(60)
        assert complete and served == buckets >= 2
        assert sums == {n: float(t.sum()) for n, t in state.items()}
        mine.put("go")
        proc.join(timeout=30)
        assert proc.exitcode == 0
        # The engine is gone: the next sync fails at once (its end
        # closed), not after the Sender's 60 s.
        err = raised_within(20, sender.sync, state, mine)
        assert isinstance(err, TransferError)
        assert "closed the channel" in str(err)
    finally:
        sender.close()
        stop(proc)


WARNINGS_AS_ERRORS = """
import gc, warnings
warnings.simplefilter("error")  # a ResourceWarning would fail here
from allocconf import transfer
a, b = transfer.Channel.pipes(timeout=5)
a.put("through")
got = b.get(5)
b.close()
try:
    a.get(5)
    caught = None
except transfer.TransferError as exc:
    caught = "closed the channel" in str(exc)
c, d = transfer.Channel.pipes()
del a, b, c, d
gc.collect()
print(json.dumps({"got": got, "caught": caught}))
"""


def test_pipes_closed_and_collected_under_warnings_as_errors():
    out = run_json(WARNINGS_AS_ERRORS, timeout=120)
    assert out == {"got": "through", "caught": True}
