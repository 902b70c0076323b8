"""`python -m allocconf` on a machine without a GPU or a CUDA driver."""
import json
import subprocess
import sys

import allocconf
from helpers import child_env, torch_facts


def run(*args, code=None, env=None):
    cmd = [sys.executable] + (["-c", code] if code else
                              ["-m", "allocconf", *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=child_env(env))


def test_json_report_schema_without_a_driver():
    proc = run("--json", env={"PYTORCH_CUDA_ALLOC_CONF":
                              "garbage_collection_threshold:0.6"})
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["schema"] == 1
    assert set(r) == {"schema", "allocconf", "python", "torch", "backend",
                      "config", "expandable_segments", "status", "driver",
                      "pidfd", "segments", "probe", "neighbours",
                      "variables"}
    assert r["neighbours"] == []
    facts = torch_facts()
    assert r["variables"] == {"set": {"PYTORCH_CUDA_ALLOC_CONF":
                                      "garbage_collection_threshold:0.6"},
                              "conflict": False,
                              "torch_reads": facts["reads"], "ignored": {}}
    assert (r["torch"]["build"] == "CPU") is facts["cpu_only"]
    assert r["torch"]["setter"] == facts["setter"]
    written = "garbage_collection_threshold:0.6,expandable_segments:True"
    assert r["config"] == {
        "user": "garbage_collection_threshold:0.6",
        "source": "PYTORCH_CUDA_ALLOC_CONF",
        "written": written,
        # Without torch 2.13's getter and with CUDA not started, torch
        # cannot tell what it holds, and the report says so.
        "live": written if facts["getter"] else None,
        "readback": facts["getter"],
    }
    assert r["expandable_segments"]["on"] is True
    assert r["driver"]["driver"] is None
    assert r["driver"]["devices"] == []
    assert r["driver"]["error"].startswith("no CUDA driver")
    assert r["pidfd"]["ok"] in (True, False, None)
    assert set(r["pidfd"]["self"]) == {"ok", "step", "error"}
    assert (r["pidfd"]["advice"] is None) is (r["pidfd"]["ok"] is True)
    assert r["segments"] is None and r["probe"] is None
    assert r["backend"] is None
    assert set(r["status"]) == {"applied", "reason", "expandable_segments",
                                "config", "source", "api", "torch_imported",
                                "window_depth", "user_config", "neighbours",
                                "advice", "readback", "warnings",
                                "window_scope", "window_scope_reason",
                                "pool_bytes"}
    assert r["status"]["window_scope"] == (
        "process" if facts["cpu_only"] else "opener")


def test_text_report_lines():
    proc = run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"allocconf {allocconf.__version__}")
    for label in ("torch:", "setter:", "backend:", "user config:", "written:",
                  "live:", "expandable:", "driver:", "pidfd:"):
        assert f"\n{label}" in out, label
    assert "no CUDA driver" in out


def test_report_without_torch():
    proc = run(code="import sys, runpy; sys.modules['torch'] = None; "
                    "sys.argv = ['allocconf', '--json']; "
                    "runpy.run_module('allocconf', run_name='__main__')")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["torch"] is None
    assert r["config"]["written"] is None
    assert "torch not imported yet" in r["expandable_segments"]["reason"]


def test_usage_error_exits_2():
    proc = run("--bogus")
    assert proc.returncode == 2
    assert "unrecognized arguments: --bogus" in proc.stderr


def test_report_lists_neighbours_and_flags_disagreeing_variables(tmp_path):
    # A STAND-IN vllm module, imported by the report's process through
    # sitecustomize-free means: a script that imports it, then reports.
    (tmp_path / "vllm.py").write_text("STANDIN = True\n")
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
            "import warnings; warnings.simplefilter('ignore')\n"
            "import allocconf, torch, vllm\n"
            "from allocconf import _report\n"
            "r = _report.collect(probe=False)\n"
            "print(_report.render(r))\n"
            "import json; print(json.dumps(r['neighbours']))")
    proc = run(code=code, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
                               "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"})
    assert proc.returncode == 0, proc.stderr
    text, _, last = proc.stdout.rstrip().rpartition("\n")
    found = json.loads(last)
    assert [n["name"] for n in found] == ["vllm"]
    assert "stepped back" in found[0]["allocconf"]
    assert "42609" in found[0]["why"]
    assert "neighbour:    vllm: allocconf's default stepped back" in text
    assert "CONFLICT:     PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:64', " \
        "PYTORCH_ALLOC_CONF='max_split_size_mb:128'" in text
    assert "allocconf read PYTORCH_CUDA_ALLOC_CONF" in text
