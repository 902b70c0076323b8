"""The thread and fork harness for child scripts (one copy for every test
that forks, holds a window in another thread, or keeps the lock busy).

Import it inside a child script (``from helpers.harness import forked``):
it forks that child, never the pytest process.
"""
import json
import os
import signal
import threading
import warnings


def forked(child, timeout=10):
    """Fork; in the child, run ``child()`` (killed by SIGALRM after
    `timeout` seconds, so a hang shows as a dead child) and send back what
    it returns, as JSON, or ``{"error": repr(exc)}`` when it raises.
    Returns ``(exit code, that value)``; the value is None when the child
    sent nothing."""
    r, w = os.pipe()
    # Python 3.12+ warns about fork() with threads alive; these tests mean
    # it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(timeout)
        try:
            try:
                out = json.dumps(child())
            except BaseException as exc:
                out = json.dumps({"error": repr(exc)})
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), (json.loads(data) if data
                                               else None)


class Held:
    """A window (``allocconf.expandable_segments(enabled)``) held open in
    a thread of its own until ``release()``."""

    def __init__(self, enabled=False):
        import allocconf

        self._inside = threading.Event()
        self._release = threading.Event()

        def hold():
            with allocconf.expandable_segments(enabled):
                self._inside.set()
                self._release.wait(60)

        self._thread = threading.Thread(target=hold)
        self._thread.start()
        self._inside.wait(60)

    def release(self):
        self._release.set()
        self._thread.join()


def hammer(action, threads=3):
    """Run ``action()`` in a loop in `threads` threads; returns a function
    that stops and joins them."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            action()

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()

    def done():
        stop.set()
        for t in ts:
            t.join()

    return done


def slow_setter(torch, seconds):
    """Make torch's setter (the one allocconf will find) take `seconds`
    each call, so that a thread writing through it holds allocconf's lock
    that long.  Call before allocconf attaches.  Returns its name."""
    name = next(n for n in ("_accelerator_setAllocatorSettings",
                            "_cuda_cudaCachingAllocator_set_allocator_settings")
                if hasattr(torch._C, n))
    real = getattr(torch._C, name)

    def slow(conf):
        import time

        time.sleep(seconds)
        return real(conf)

    setattr(torch._C, name, slow)
    return name
