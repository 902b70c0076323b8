"""allocconf.transfer with Ray actors as the launcher and Ray queues as the
channel, on the CPU: a trainer in the driver, a vLLM-style
stand-in engine (examples/engine_standin.py) in an actor started with
``allocconf.child_env("user")`` as its ``runtime_env``, one
``Sender.sync`` and one ``Receiver.serve`` call a sync, buffers shared
across the processes through /dev/shm (allocconf.transfer.testing
stands in for CUDA IPC).  Then the engine is killed: the trainer's next
sync fails within its timeout instead of hanging."""
import os

import pytest

from helpers import TESTS_DIR, run_json, torch_facts

torch_facts()  # skips this module without torch
pytest.importorskip("ray", reason="Ray is not installed (CI installs it)")
if "libasan" in os.environ.get("LD_PRELOAD", ""):
    pytest.skip("Ray's own binaries do not start under the sanitizer's "
                "preload (tools/sanitized-tests.sh)", allow_module_level=True)

EXAMPLES = os.path.join(os.path.dirname(TESTS_DIR), "examples")

SCRIPT = """
import os, time
PATHS = [TESTS, EXAMPLES]
sys.path[:0] = PATHS
import ray
from ray.util.queue import Queue
import allocconf
from allocconf.transfer import Channel, Sender, TransferError
from allocconf.transfer.testing import HostDevice
from engine_standin import hf_weights

@ray.remote
class Engine:
    def __init__(self, paths):
        sys.path[:0] = paths
        from allocconf.transfer import Receiver
        from allocconf.transfer.testing import HostDevice
        from engine_standin import Engine
        self.engine = Engine(layers=2, hidden=16)
        self.receiver = Receiver(device=HostDevice())

    def serve(self, to_engine, to_trainer):
        from allocconf.transfer import Channel
        r = self.receiver.serve(Channel(to_trainer, to_engine),
                                load_weights=self.engine.load_weights,
                                timeout=60)
        return [r.complete, r.buckets, self.receiver.complete]

    def matches(self, hf):
        return self.engine.matches(hf)

    def env(self):
        import allocconf
        return [os.environ.get("ALLOCCONF_AUTO"), allocconf.status().reason]

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    engine = Engine.options(runtime_env={
        "env_vars": allocconf.child_env("user", environ={})}).remote(PATHS)
    to_engine, to_trainer = Queue(), Queue()
    trainer = Channel(to_engine, to_trainer)
    sender = Sender(2048, device=HostDevice())  # the embedding is split
    syncs = []
    for step in range(3):
        hf = hf_weights(layers=2, hidden=16, seed=step)
        served = engine.serve.remote(to_engine, to_trainer)
        sent = sender.sync(hf, trainer, timeout=60)
        syncs.append([ray.get(served), sent,
                      ray.get(engine.matches.remote(hf))])
    env = ray.get(engine.env.remote())
    ray.kill(engine)
    t0 = time.monotonic()
    try:
        sender.sync(hf_weights(layers=2, hidden=16, seed=9), trainer,
                    timeout=3)
        dead = "no error"
    except TransferError as exc:
        dead = str(exc)
    waited = time.monotonic() - t0
finally:
    ray.shutdown()
print(json.dumps({"syncs": syncs, "env": env, "dead": dead,
                  "waited": waited}))
"""


def test_a_ray_engine_actor_takes_whole_syncs_and_a_dead_one_fails_fast():
    out = run_json(f"TESTS = {TESTS_DIR!r}\nEXAMPLES = {EXAMPLES!r}\n",
                   SCRIPT, timeout=300)
    for i, ((complete, buckets, done), sent, matches) in enumerate(
            out["syncs"]):
        assert complete is True and done == i + 1, out["syncs"]
        assert buckets == sent > 2
        assert matches is True
    # The actor started from child_env("user"): allocconf off there.
    assert out["env"] == ["0", "ALLOCCONF_AUTO=0: no import-time change; "
                               "windows still work"]
    assert "nothing came from the peer within 3.0 s" in out["dead"]
    assert out["waited"] < 30
