"""torchrun with two CPU ranks (gloo): allocconf in either import order,
collectives inside and outside a window, and no leak into children.  The
NCCL variant on two GPUs is tests/gpu/test_multigpu.py."""
import json
import os
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, child_env

USER = "garbage_collection_threshold:0.6"


def run_torchrun(tmp_path, order, backend, nproc=2, extra_env=None):
    env = child_env({"ALLOCCONF_TEST_ORDER": order,
                     "ALLOCCONF_TEST_BACKEND": backend,
                     "ALLOCCONF_TEST_OUT": str(tmp_path),
                     "PYTORCH_CUDA_ALLOC_CONF": USER,
                     "PYTHONPATH": TESTS_DIR + os.pathsep
                     + os.environ.get("PYTHONPATH", ""),
                     **(extra_env or {})})
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={nproc}",
         os.path.join(TESTS_DIR, "helpers", "dist_worker.py")],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text())
            for r in range(nproc)]


@pytest.mark.parametrize("order", ["allocconf-first", "torch-first"])
def test_two_cpu_ranks(tmp_path, order):
    for r in run_torchrun(tmp_path, order, "gloo"):
        assert r["allreduce_ok"] and r["window_ok"]
        assert r["status"]["applied"] is True
        assert r["status"]["window_depth"] == 0
        assert r["status"]["config"] == USER + ",expandable_segments:True"
        assert r["environ_unchanged"] is True
        assert r["child_env"] == {"PYTORCH_CUDA_ALLOC_CONF": USER,
                                  "PYTORCH_ALLOC_CONF": None}
