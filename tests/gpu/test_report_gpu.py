"""`python -m allocconf` on a GPU machine (docs/report.md)."""
import json
import subprocess
import sys

import pytest

from helpers import child_env

pytestmark = pytest.mark.gpu


def test_report_shows_the_device_with_vmm_and_where_memory_lands():
    proc = subprocess.run([sys.executable, "-m", "allocconf", "--json"],
                          capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    dev = r["driver"]["devices"][0]
    assert dev["vmm"] is True
    assert dev["capability"] is not None
    assert r["driver"]["version"] is not None
    assert r["torch"]["build"].startswith("CUDA")
    assert r["backend"] == "native"
    assert r["expandable_segments"]["on"] is True
    assert r["probe"]["default"] == {"expandable_segment": True,
                                     "ipc_capable": False}
    assert r["probe"]["ipc_safe"] == {"expandable_segment": False,
                                      "ipc_capable": True}
    assert r["segments"]["expandable"]["count"] >= 1
    assert r["segments"]["classic"]["count"] >= 1
    text = subprocess.run([sys.executable, "-m", "allocconf"],
                          capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert text.returncode == 0
    assert dev["name"] in text.stdout
