"""Import-time activation, each case in its own process: the string handed
to torch (recorded by a wrapper that still calls torch's real setter) and
status() for every import order and environment."""
import json

import pytest

from helpers import (recorded_import, run_json, skip_if_torch_dies,
                     torch_facts)

# Print what happened: the setter calls, status(), and torch's live string.
REPORT = """
import allocconf
from helpers import recorder
print(json.dumps({"calls": recorder.CALLS,
                  "status": allocconf.status().as_dict(),
                  "live": recorder.live()}))
"""

ALLOCCONF_FIRST = """
from helpers import recorder; recorder.install()
import allocconf
import torch
""" + REPORT

TORCH_FIRST = """
from helpers import recorder; recorder.install()
import torch
import allocconf
""" + REPORT

FACTS = torch_facts()


@pytest.mark.parametrize("script", [ALLOCCONF_FIRST, TORCH_FIRST],
                         ids=["allocconf-first", "torch-first"])
def test_turns_expandable_segments_on_in_either_order(script):
    out = run_json(script)
    assert out["calls"] == ["expandable_segments:True"]
    assert out["live"] == "expandable_segments:True"
    st = out["status"]
    assert st["applied"] is True
    assert st["expandable_segments"] is True
    assert st["config"] == "expandable_segments:True"
    assert st["api"] == FACTS["setter"]
    assert st["torch_imported"] is True
    assert st["source"] is None
    assert st["window_depth"] == 0
    assert ("CPU-only" in st["reason"]) is FACTS["cpu_only"]


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF",
                                 "PYTORCH_HIP_ALLOC_CONF",
                                 "PYTORCH_ALLOC_CONF"])
@pytest.mark.parametrize("script", [ALLOCCONF_FIRST, TORCH_FIRST],
                         ids=["allocconf-first", "torch-first"])
def test_user_settings_are_carried(var, script):
    user = "max_split_size_mb:64,garbage_collection_threshold:0.6"
    out = run_json(script, env={var: user})
    if var not in FACTS["reads"]:
        # This torch does not read it, so allocconf does not apply it
        # either (test_torch_variables.py).
        assert out["calls"] == ["expandable_segments:True"]
        assert out["status"]["source"] is None
        return
    assert out["calls"] == [user + ",expandable_segments:True"]
    assert out["status"]["source"] == var
    assert out["status"]["user_config"] == user


def test_only_the_first_set_variable_counts_as_in_torch():
    env = {"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:32",
           "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    out = run_json(ALLOCCONF_FIRST, env=env)
    first = next((v for v in FACTS["reads"] if v in env), None)
    assert out["calls"] == [
        (env[first] + "," if first else "") + "expandable_segments:True"]
    assert out["status"]["source"] == first
    # Set but empty still counts, as in torch.
    out = run_json(ALLOCCONF_FIRST, env={
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "PYTORCH_ALLOC_CONF": "max_split_size_mb:128",
    })
    assert out["calls"] == ["expandable_segments:True"]
    assert out["status"]["source"] == "PYTORCH_CUDA_ALLOC_CONF"


@pytest.mark.skipif(not FACTS["getter"], reason="torch < 2.13 cannot tell "
                    "the live string before CUDA starts (no getter)")
def test_torch_first_after_user_called_the_setter():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import torch
        torch._C._accelerator_setAllocatorSettings("max_split_size_mb:128")
        import allocconf
    """, REPORT, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["calls"] == ["max_split_size_mb:128",
                            "max_split_size_mb:128,expandable_segments:True"]
    assert out["status"]["source"] == "torch"
    assert out["status"]["user_config"] == "max_split_size_mb:128"


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF",
                                 "PYTORCH_HIP_ALLOC_CONF",
                                 "PYTORCH_ALLOC_CONF"])
@pytest.mark.parametrize("value", [False, True])
@pytest.mark.parametrize("script", [ALLOCCONF_FIRST, TORCH_FIRST],
                         ids=["allocconf-first", "torch-first"])
def test_user_choice_of_expandable_segments_wins(var, value, script):
    user = f"max_split_size_mb:64,expandable_segments:{value}"
    out = run_json(script, env={var: user})
    if var not in FACTS["reads"]:
        # Unread by this torch: False is still honoured as the user's
        # opt-out, True is what allocconf's default does anyway.
        assert out["calls"] == ([] if not value
                                else ["expandable_segments:True"])
        assert out["status"]["expandable_segments"] is value
        return
    assert out["calls"] == []  # nothing to change: no write at all
    st = out["status"]
    assert st["applied"] is False
    assert st["expandable_segments"] is value
    assert st["source"] == var
    assert f"expandable_segments:{value} set by the user in {var}" in (
        st["reason"])


@pytest.mark.parametrize("auto", ["0", "false", "OFF", "no"])
def test_allocconf_auto_0_disables_the_import_time_write(auto):
    out = run_json(ALLOCCONF_FIRST, env={
        "ALLOCCONF_AUTO": auto,
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["calls"] == []
    st = out["status"]
    assert st["applied"] is False
    assert st["expandable_segments"] is False
    assert st["config"] == "max_split_size_mb:64"
    assert "ALLOCCONF_AUTO=0" in st["reason"]


def test_unknown_allocconf_auto_value_warns_and_stays_on():
    out = run_json(recorded_import("import allocconf; import torch"),
                   env={"ALLOCCONF_AUTO": "maybe"})
    assert len(out["warnings"]) == 1
    assert "ALLOCCONF_AUTO=maybe" in out["warnings"][0]
    assert out["calls"] == ["expandable_segments:True"]


MALFORMED = """
from helpers import recorder; recorder.install()
{first}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    {second}
import allocconf
print(json.dumps({{
    "warnings": [(w.category.__name__, str(w.message)) for w in caught],
    "calls": recorder.CALLS,
    "status": allocconf.status().as_dict()}}))
"""


@pytest.mark.parametrize("first, second", [("import torch", "import allocconf"),
                                           ("import allocconf", "import torch")])
def test_malformed_variable_warns_once_and_writes_nothing(first, second):
    env = {"PYTORCH_CUDA_ALLOC_CONF":
           "expandable_segments:True,max_split_size_mb:10"}
    skip_if_torch_dies(env)
    out = run_json(MALFORMED.format(first="", second=first + "; " + second),
                   env=env)
    assert len(out["warnings"]) == 1
    category, message = out["warnings"][0]
    assert category == "AllocConfWarning"
    assert "PYTORCH_CUDA_ALLOC_CONF is malformed" in message
    assert "max_split_size_mb at offset 43" in message
    assert "got 10" in message
    assert out["calls"] == []
    st = out["status"]
    assert st["applied"] is False
    assert st["expandable_segments"] is None
    assert "malformed" in st["reason"]


def test_non_utf8_bytes_in_the_variable_warn_with_offset():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:6\udcff4"}
    skip_if_torch_dies(env)
    out = run_json(recorded_import(), env=env)
    assert len(out["warnings"]) == 1
    assert "offset 19: byte 0xff is not UTF-8" in out["warnings"][0]
    assert out["calls"] == []


@pytest.mark.parametrize("script", [ALLOCCONF_FIRST, TORCH_FIRST],
                         ids=["allocconf-first", "torch-first"])
def test_cuda_malloc_async_backend_means_no_write(script):
    out = run_json(script, env={
        "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert out["calls"] == []
    st = out["status"]
    assert st["applied"] is False
    assert st["expandable_segments"] is None
    assert "backend:cudaMallocAsync" in st["reason"]
    assert "turns nothing on" in st["reason"]


def test_windows_do_not_write_with_cuda_malloc_async():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        with allocconf.ipc_safe():
            depth = allocconf.status().window_depth
        print(json.dumps({"calls": recorder.CALLS, "depth": depth}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert out == {"calls": [], "depth": 1}


def test_the_backend_torch_loaded_is_written_as_the_user_wrote_it():
    # torch accepts the backend it loaded with at run time (and refuses
    # any other); its getter then shows the user's key.
    out = run_json(ALLOCCONF_FIRST, env={
        "PYTORCH_CUDA_ALLOC_CONF": "backend:native,max_split_size_mb:64"})
    assert out["calls"] == [
        "backend:native,max_split_size_mb:64,expandable_segments:True"]


def test_environment_changed_before_torch_import_is_honoured():
    out = run_json("""
        import os
        from helpers import recorder; recorder.install()
        import allocconf
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:96"
        import torch
    """, REPORT)
    assert out["calls"] == ["max_split_size_mb:96,expandable_segments:True"]
    assert out["status"]["source"] == "PYTORCH_CUDA_ALLOC_CONF"


def test_hook_fires_once_through_import_module_and_removes_itself():
    out = run_json("""
        import importlib
        from helpers import recorder; recorder.install()
        import allocconf
        from allocconf import _hook
        before = [type(f).__name__ for f in sys.meta_path]
        importlib.import_module("torch")
        import torch
        after = [type(f).__name__ for f in sys.meta_path]
        print(json.dumps({"calls": recorder.CALLS, "before": before,
                          "after": after}))
    """)
    assert out["calls"] == ["expandable_segments:True"]
    assert out["before"][0] == "TorchFinder"
    assert "TorchFinder" not in out["after"]


def test_hook_fires_when_torch_is_imported_in_another_thread():
    out = run_json("""
        import threading
        from helpers import recorder; recorder.install()
        import allocconf
        t = threading.Thread(target=lambda: __import__("torch"))
        t.start(); t.join()
    """, REPORT)
    assert out["calls"] == ["expandable_segments:True"]
    assert out["status"]["torch_imported"] is True


def test_failed_torch_import_keeps_the_hook_for_the_next_attempt():
    out = run_json("""
        from helpers import recorder
        import allocconf
        from allocconf import _hook

        class Breaker:  # make the first `import torch` fail
            def find_spec(self, name, path=None, target=None):
                if name == "torch._C":
                    sys.meta_path.remove(self)
                    raise ImportError("simulated failure")
        sys.meta_path.insert(1, Breaker())
        try:
            import torch
        except ImportError as exc:
            first = str(exc)
        hooked = any(type(f).__name__ == "TorchFinder" for f in sys.meta_path)
        for name in [m for m in sys.modules if m.startswith("torch")]:
            del sys.modules[name]
        recorder.install()
        import torch
        print(json.dumps({"first": first, "hooked": hooked,
                          "calls": recorder.CALLS,
                          "applied": allocconf.status().applied}))
    """)
    assert out["first"] == "simulated failure"
    assert out["hooked"] is True
    assert out["calls"] == ["expandable_segments:True"]
    assert out["applied"] is True


def test_debug_traces_writes_and_hook_events_to_stderr():
    from helpers import run_script

    proc = run_script("import allocconf, torch",
                      env={"ALLOCCONF_DEBUG": "1"})
    err = proc.stderr
    assert "allocconf: waiting for `import torch`" in err
    assert "allocconf: attaching to torch" in err
    assert "allocconf: wrote 'expandable_segments:True'" in err
    quiet = run_script("import allocconf, torch")
    assert quiet.stderr == ""


@pytest.mark.parametrize("env, advised", [
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF":
      "max_split_size_mb:128,expandable_segments:True"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
      "ALLOCCONF_AUTO": "0"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}, False),
])
def test_max_split_size_with_expandable_segments_is_advised_against(
        env, advised):
    from helpers import run_script

    proc = run_script("""
        import allocconf, torch
        print(json.dumps(allocconf.status().advice))
    """, env=env)
    advice = json.loads(proc.stdout)
    assert bool(advice) is advised
    assert ("max_split_size_mb is set" in proc.stderr) is advised
    if advised:
        assert "docs/troubleshooting.md" in advice[0]
