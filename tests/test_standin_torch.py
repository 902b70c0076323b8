"""allocconf's hook, windows, locks, fork handling and neighbour logic
against a STAND-IN torch (tests/standin/torch), on any Python.

CI runs this file, with tests/test_grammar.py, on every Python from 3.9 to
3.13 it finds, where no torch build is installed: it is what compiles and
exercises the 3.13 ``PyMutex`` lock path and the 3.9 paths.  The stand-in
only stores strings; what torch does with them is proven by the rest of
the suite on real torch.  Each test runs in a fresh interpreter with
warnings as errors.
"""
from __future__ import annotations

import os

from helpers import TESTS_DIR, run_json

STANDIN = os.path.join(TESTS_DIR, "standin")
FIRST = f"sys.path.insert(0, {STANDIN!r})\n"


def run(*parts: str, env=None):
    return run_json(FIRST, *parts, env=env)


REPORT = """
import torch
st = allocconf.status()
print(json.dumps({"standin": torch.STANDIN, "calls": torch._C.CALLS,
                  "held": torch._C._accelerator_getAllocatorSettings(),
                  "config": st.config, "reason": st.reason,
                  "depth": st.window_depth, "api": st.api,
                  "neighbours": list(st.neighbours)}))
"""


def test_before_and_after_torch():
    before = run("import allocconf, torch", REPORT,
                 env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    after = run("import torch, allocconf", REPORT,
                env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    for out in (before, after):
        assert out["standin"] is True
        assert out["calls"] == ["max_split_size_mb:64,expandable_segments:True"]
        assert out["api"] == "torch._C._accelerator_setAllocatorSettings"


def test_windows_nested_and_from_threads():
    out = run("""
        import threading
        import allocconf, torch
        seen = []
        def work():
            for _ in range(200):
                with allocconf.ipc_safe():
                    with allocconf.ipc_safe():
                        seen.append(torch._C._accelerator_getAllocatorSettings())
        ts = [threading.Thread(target=work) for _ in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert set(seen) == {"expandable_segments:False"}, set(seen)
    """, REPORT)
    assert out["depth"] == 0
    assert out["held"] == "expandable_segments:True"
    # Every write alternates: never two of the same string in a row.
    calls = out["calls"]
    assert all(a != b for a, b in zip(calls, calls[1:]))


def test_fork_in_a_window_and_with_the_lock_taken_by_another_thread():
    out = run("""
        import allocconf, torch
        from helpers.harness import forked, hammer
        def in_window():
            with allocconf.ipc_safe():
                pass
            return [allocconf.status().window_depth,
                    torch._C._accelerator_getAllocatorSettings()]
        with allocconf.ipc_safe():
            child = forked(in_window)
        # Threads hammering the lock while the main thread forks.
        def configure():
            allocconf.configure(max_split_size_mb=64)
            return allocconf.status().window_depth
        done = hammer(lambda: allocconf.ipc_safe().__enter__().__exit__(
            None, None, None))
        codes = [forked(configure) for _ in range(20)]
        done()
        print(json.dumps({"child": child, "codes": codes}))
    """)
    assert out["child"] == [0, [1, "expandable_segments:False"]]
    assert out["codes"] == [[0, 0]] * 20


def test_configure_reload_and_a_refused_write():
    out = run("""
        import importlib
        import allocconf, torch
        allocconf.configure(max_split_size_mb=128, roundup_power2_divisions=4)
        importlib.reload(allocconf)
        torch._C.REJECT.add("garbage_collection_threshold:0.5")
        try:
            allocconf.configure(garbage_collection_threshold=0.5)
        except allocconf.AllocConfError as exc:
            refused = type(exc.__cause__).__name__
    """, REPORT.replace('"neighbours"', '"refused": refused, "neighbours"'))
    assert out["refused"] == "ValueError"
    assert out["held"] == ("max_split_size_mb:128,roundup_power2_divisions:4,"
                           "expandable_segments:True")


def test_foreign_writes_and_the_step_back(tmp_path):
    (tmp_path / "vllm.py").write_text("STANDIN = True\n")
    out = run(f"sys.path.insert(0, {str(tmp_path)!r})", """
        import allocconf, torch
        torch._C._accelerator_setAllocatorSettings("roundup_power2_divisions:2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import vllm
        env = allocconf.child_env("same", environ={})
    """, REPORT.replace('"neighbours"', '"env": env, "neighbours"'),
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["neighbours"] == ["vllm"]
    assert out["held"] == ("expandable_segments:False,max_split_size_mb:64,"
                           "roundup_power2_divisions:2")
    assert out["env"]["PYTORCH_CUDA_ALLOC_CONF"] == (
        "max_split_size_mb:64,roundup_power2_divisions:2,"
        "expandable_segments:False")
