"""Regressions under hostile conditions, each in a fresh process:
warnings as errors inside `import torch`, importlib.reload, and small
defects (an unhashable status, an empty ALLOCCONF_AUTO, check_ipc's
names for what is not a CUDA tensor)."""
from __future__ import annotations

import json

from helpers import run_script

# allocconf 0.1.0 accepted this value and torch refused it inside the
# hook; allocconf now refuses it too (at `import allocconf`), so the tests
# of a refusal inside the hook have the recorder refuse the write instead.
REFUSED = "garbage_collection_threshold:.99999999999999999"
REFUSE_WRITE = """
from helpers import recorder; recorder.install()
recorder.REJECT.add("expandable_segments:True")
"""


def test_warning_inside_import_torch_does_not_fail_the_import():
    # PRELUDE sets warnings.simplefilter("error"), as `-W error` and
    # pytest's filterwarnings = error do.
    proc = run_script(
        REFUSE_WRITE,
        """
        import logging
        logging.basicConfig(level=logging.WARNING)
        import allocconf
        import torch           # must complete
        import torch.nn        # and torch stays importable
        st = allocconf.status()
        print(json.dumps({"kept": list(st.warnings),
                          "torch": torch.__version__}))
        """,
    )
    out = json.loads(proc.stdout)
    assert out["torch"]
    assert len(out["kept"]) == 1
    assert "torch refused 'expandable_segments:True'" in out["kept"][0]
    # The logger got it instead of the warnings machinery.
    assert "WARNING:allocconf:" in proc.stderr
    assert "recorder refused" in proc.stderr


def test_warning_outside_the_hook_never_fails_the_import():
    # torch imported first: the warning comes from `import allocconf`.
    # Import-time problems warn, never raise: under the error filter it
    # is kept in status().warnings and said once on stderr, and the
    # import (a training script's first line, `python -W error -m
    # allocconf`) completes.
    proc = run_script(
        REFUSE_WRITE,
        """
        import torch
        import allocconf
        print(json.dumps(list(allocconf.status().warnings)))
        """,
    )
    kept = json.loads(proc.stdout)
    assert len(kept) == 1 and kept[0].startswith("allocconf: torch refused")
    assert proc.stderr.count("allocconf: torch refused") == 1


def test_reload_before_torch_keeps_one_hook_and_the_configuration():
    proc = run_script(
        """
        import importlib, sys
        import allocconf
        allocconf.configure(max_split_size_mb=64)
        importlib.reload(allocconf)
        importlib.reload(allocconf)
        hooks = [f for f in sys.meta_path
                 if type(f).__name__ == "TorchFinder"]
        import torch
        st = allocconf.status()
        print(json.dumps({"hooks": len(hooks), "config": st.config,
                          "imported": st.torch_imported,
                          "left": [type(f).__name__ for f in sys.meta_path
                                   if type(f).__name__ == "TorchFinder"]}))
        """,
    )
    out = json.loads(proc.stdout)
    assert out["hooks"] == 1
    assert out["left"] == []
    assert out["imported"] is True
    assert "max_split_size_mb:64" in out["config"]
    assert "expandable_segments:True" in out["config"]


def test_reload_after_torch_keeps_the_configuration():
    proc = run_script(
        """
        import importlib
        from helpers import recorder; recorder.install()
        import torch, allocconf
        allocconf.configure(max_split_size_mb=64)
        importlib.reload(allocconf)
        print(json.dumps(recorder.CALLS[-1]))  # what torch last got
        """,
    )
    assert "max_split_size_mb:64" in json.loads(proc.stdout)


def test_status_is_hashable():
    proc = run_script(
        """
        import allocconf
        st = allocconf.status()
        print(json.dumps([hash(st) == hash(allocconf.status()),
                          type(st.advice).__name__]))
        """,
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
    )
    assert json.loads(proc.stdout) == [True, "tuple"]


def test_empty_allocconf_auto_warns_and_stays_on():
    proc = run_script(
        """
        import warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import allocconf
        print(json.dumps([str(w.message) for w in seen]))
        """,
        env={"ALLOCCONF_AUTO": ""},
    )
    seen = json.loads(proc.stdout)
    assert len(seen) == 1 and "ALLOCCONF_AUTO=" in seen[0]


def test_check_ipc_names_a_non_tensor_item_and_a_cpu_tensor():
    proc = run_script(
        """
        import torch, allocconf
        try:
            allocconf.check_ipc([1, torch.zeros(2)])
        except ValueError as exc:
            print(json.dumps(str(exc)))
        """,
    )
    msg = json.loads(proc.stdout)
    assert "#0 (int: not a tensor)" in msg
    assert "#1 (float32[2] on cpu: expected a CUDA tensor" in msg
    # Neither was allocated before a window: no blame on the window.
    assert "ipc_safe" not in msg
