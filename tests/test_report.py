"""`python -m allocconf` on a machine without a GPU or a CUDA driver."""
import json
import subprocess
import sys

import pytest

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
    assert set(r) == {"schema", "allocconf", "python", "torch",
                      "torch_error", "backend",
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
        "live_error": None,
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


def _fake_torch(tmp_path, body):
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    import os
    return {"PYTHONPATH": os.pathsep.join(
        [str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


@pytest.mark.parametrize("body, named", [
    ("raise OSError('libcudart.so.12: cannot open shared object file')",
     "OSError: libcudart.so.12: cannot open shared object file"),
    ("import no_such_module_inside_torch",
     "ModuleNotFoundError: No module named 'no_such_module_inside_torch'"),
    ("raise ImportError('undefined symbol: cudaGetDriverEntryPoint')",
     "ImportError: undefined symbol: cudaGetDriverEntryPoint"),
])
def test_a_torch_that_fails_to_import_is_named_not_fatal(tmp_path, body,
                                                         named):
    env = _fake_torch(tmp_path, body)
    proc = run(env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"torch:        cannot be imported: {named}" in proc.stdout
    assert "not installed" not in proc.stdout
    assert "Traceback" not in proc.stderr
    r = json.loads(run("--json", env=env).stdout)
    assert r["torch"] is None and r["torch_error"] == named


def test_report_under_warnings_as_errors_with_a_malformed_variable():
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "allocconf", "--no-probe"],
        capture_output=True, text=True, timeout=300,
        env=child_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"}))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # Said once, as allocconf's.
    assert proc.stderr.count("PYTORCH_CUDA_ALLOC_CONF is malformed") == 1
    assert "allocconf: PYTORCH_CUDA_ALLOC_CONF is malformed" in proc.stderr
    assert "written:      nothing" in proc.stdout


def test_live_line_names_the_getters_error():
    facts = torch_facts()
    if not facts["getter"]:
        pytest.skip("torch before 2.13 has no getter")
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"}
    proc = run("--no-probe", env=env)
    assert proc.returncode == 0, proc.stderr
    # What torch's getter says, from torch itself.
    oracle = subprocess.run(
        [sys.executable, "-c",
         "import torch\ntry:\n torch._C._accelerator_getAllocatorSettings()"
         "\nexcept Exception as e: print(f'{type(e).__name__}: {e}')"],
        capture_output=True, text=True, timeout=300, env=child_env(env))
    said = oracle.stdout.strip()
    assert said  # torch raises
    assert f"live:         torch's getter raised {said}" in proc.stdout
    assert "cannot tell without CUDA" not in proc.stdout
    assert "readback:     yes" not in proc.stdout
    assert "readback:     no: torch has its getter, but it raises" \
        in proc.stdout
    r = json.loads(run("--json", "--no-probe", env=env).stdout)
    assert r["config"]["live"] is None
    assert r["config"]["live_error"] == said


def test_live_line_without_torch():
    proc = run(code="import sys, runpy; sys.modules['torch'] = None; "
                    "sys.argv = ['allocconf']; "
                    "runpy.run_module('allocconf', run_name='__main__')")
    assert proc.returncode == 0, proc.stderr
    assert "live:         no torch to ask" in proc.stdout
    assert "CUDA initialised" not in proc.stdout


def test_a_shadowed_variable_is_listed_as_ignored():
    facts = torch_facts()
    if "PYTORCH_ALLOC_CONF" not in facts["reads"]:
        pytest.skip("this torch does not read PYTORCH_ALLOC_CONF at all")
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
           "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    r = json.loads(run("--json", "--no-probe", env=env).stdout)
    assert r["variables"]["ignored"] == {
        "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    assert any("PYTORCH_ALLOC_CONF is set" in a
               for a in r["status"]["advice"])
    # The same string twice: nothing is lost, nothing to fix.
    same = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
            "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    r = json.loads(run("--json", "--no-probe", env=same).stdout)
    assert r["variables"]["ignored"] == {}
    assert not any("Keep one of the two" in a
                   for a in r["status"]["advice"])


def _keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("set", "ignored"):
            out |= _keys(v, prefix + k + ".")
    return out


def test_the_json_sample_in_the_docs_has_every_field():
    import os
    import re

    from helpers import TESTS_DIR
    with open(os.path.join(os.path.dirname(TESTS_DIR), "docs", "report.md"),
              encoding="utf-8") as f:
        page = f.read()
    sample = re.search(r"```json\n(.*?)```", page, re.S).group(1)
    r = json.loads(run("--json", "--no-probe").stdout)
    assert _keys(json.loads(sample)) == _keys(r)
