"""The GPU suite: marked `gpu`, skipped cleanly without a CUDA device."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_devices():
    # Asked in a child so that this process never initialises CUDA.
    try:
        out = subprocess.run(
            [sys.executable, "-c",
             "import torch; print(torch.cuda.device_count())"],
            capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip() or 0)
    except Exception:
        return 0


DEVICES = _cuda_devices()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not str(item.fspath).startswith(HERE):
            continue
        item.add_marker(pytest.mark.gpu)
        need = 2 if item.get_closest_marker("multigpu") else 1
        if DEVICES < need:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need} CUDA device(s); found {DEVICES}"))
