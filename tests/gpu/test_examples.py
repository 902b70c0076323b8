"""The documented RL weight-sync recipe runs and every sync arrives."""
import os
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, child_env

pytestmark = pytest.mark.gpu

EXAMPLE = os.path.join(os.path.dirname(TESTS_DIR), "examples",
                       "rl_weight_sync.py")


@pytest.mark.parametrize("flags, shown", [
    ([], "ipc_capable=True"),
    (["--one-copy"], "worker weights classic, written in place")])
def test_rl_weight_sync_recipe(flags, shown):
    proc = subprocess.run([sys.executable, EXAMPLE, "--steps", "3"] + flags,
                          capture_output=True, text=True, timeout=600,
                          env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("worker checksum matches") == 3
    assert "all syncs intact" in proc.stdout
    assert shown in proc.stdout
