"""The test helpers, one package for the CPU and GPU suites.

This module runs a script in a fresh Python process (process-wide state:
environment, import order, fork) and reads back what it printed as JSON.
Beside it: ``recorder`` (torch's setter, recorded), ``standin`` (a
stand-in torch module with only a version and a setter), ``harness`` (the
thread and fork harness for child scripts), ``heap`` (the C heap),
``gpu`` (where CUDA memory lives), and the worker scripts of the
distributed and transfer tests.  Child scripts import them as
``helpers.<name>``: PRELUDE puts tests/ on their sys.path."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, Mapping, Optional

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Variables that steer torch's allocator or allocconf: scrubbed from every
# child so that each test states the environment it means.
STEERING = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "ALLOCCONF_AUTO",
    "ALLOCCONF_DEBUG",
    "ALLOCCONF_STEP_BACK",
    "ALLOCCONF_KEEP_FOREIGN",
    "ALLOCCONF_EXPORT",
)

PRELUDE = f"""
import json, sys, warnings
sys.path.insert(0, {TESTS_DIR!r})
warnings.simplefilter("error")
"""


def child_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in STEERING}
    base.update(env or {})
    return base


def run_script(
    *parts: str,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 120,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run the code `parts` (each dedented, joined, after PRELUDE: warnings
    are errors) in a new interpreter.  Raises AssertionError with its
    output when it fails and `check` is true."""
    code = PRELUDE + "\n".join(textwrap.dedent(p) for p in parts)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"child failed ({proc.returncode}):\n--- stdout\n{proc.stdout}"
            f"\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_json(*parts: str, env: Optional[Mapping[str, str]] = None,
             timeout: float = 120) -> Any:
    """run_script, then the JSON on the last line of its stdout."""
    proc = run_script(*parts, env=env, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"child printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


def skip_if_torch_dies(env: Mapping[str, str]) -> None:
    """Skip the calling test where torch alone, under `env`, does not
    survive `import torch` and exit (torch 2.14.1's CUDA build aborts at
    load on an unclosed bracket, 2.9.1 at exit on any string its generic
    configuration refuses; docs/compatibility.md): nothing allocconf can
    keep alive.  The skip names torch's error."""
    alone = run_script("import torch", check=False, env=env)
    if alone.returncode != 0:
        import pytest

        lines = alone.stderr.strip().splitlines() or ["(no output)"]
        why = next((ln for ln in lines if "what()" in ln), lines[-1])
        pytest.skip(f"torch alone dies with this variable: {why[:160]}")


@functools.lru_cache(maxsize=None)
def torch_facts() -> Dict[str, Any]:
    """What the installed torch offers, asked in a child (an oracle for
    the tests, independent of allocconf): the setter's dotted name,
    whether it has the 2.13+ getter, whether it is a CPU-only build.
    Skips the calling test (or module) where torch is not installed (CI's
    runs on Pythons without a torch build)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        import pytest

        pytest.skip("torch is not installed", allow_module_level=True)
    return run_json("""
        import torch
        c = torch._C

        def accepts(conf):
            set_ = getattr(c, "_accelerator_setAllocatorSettings", None)
            if set_ is None:
                return False
            try:
                set_(conf)
            except Exception:
                return False
            set_("")
            return True

        setter = next((f"torch._C.{n}" for n in (
            "_accelerator_setAllocatorSettings",
            "_cuda_cudaCachingAllocator_set_allocator_settings")
            if hasattr(c, n)), None)
        print(json.dumps({
            "setter": setter,
            "getter": hasattr(c, "_accelerator_getAllocatorSettings"),
            "new_setter": hasattr(c, "_accelerator_setAllocatorSettings"),
            "cpu_only": torch.version.cuda is None
                        and torch.version.hip is None,
            "version": torch.__version__,
            # By capability: CUDA builds refuse keys they do not know,
            # and only newer torch knows the reserve keys.
            "keeps_unknown": accepts("some_future_key:1"),
            "knows_reserve": accepts("expandable_segments_reserve:0.5"),
            # The variables torch reads for expandable_segments, by the
            # capability measured in docs/compatibility.md (and checked
            # against torch itself in test_torch_variables.py).
            "reads": [v for v in ("PYTORCH_CUDA_ALLOC_CONF",
                                  "PYTORCH_HIP_ALLOC_CONF",
                                  "PYTORCH_ALLOC_CONF")
                      if hasattr(c, "_accelerator_setAllocatorSettings")
                      or v == "PYTORCH_CUDA_ALLOC_CONF"
                      or (v == "PYTORCH_HIP_ALLOC_CONF"
                          and torch.version.hip)]}))
    """)


def needs_getter() -> None:
    """Skip the calling test where torch has no getter (before 2.13) to
    compare allocconf's strings with."""
    if not torch_facts()["getter"]:
        import pytest

        pytest.skip("torch before 2.13 has no getter to compare with")


def recorded_import(imports: str = "import allocconf, torch") -> str:
    """Child-script text: install the setter recorder, run `imports` with
    every warning recorded, then print {"warnings": [...], "calls": [...]}
    (the messages, and the strings handed to torch) as JSON."""
    return f"""
from helpers import recorder; recorder.install()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    {imports}
print(json.dumps({{"warnings": [str(w.message) for w in caught],
                  "calls": recorder.CALLS}}))
"""
