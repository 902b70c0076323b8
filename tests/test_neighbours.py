"""Living with neighbours (docs/neighbours.md), on the CPU build.

Each test runs in a fresh interpreter with warnings as errors.  The
neighbours here are STAND-INS: empty modules named torch_memory_saver,
vllm and sglang on a temporary sys.path entry, and an LD_PRELOAD entry
naming a file that is never loaded; the real torch_memory_saver runs in
tests/gpu/test_torch_memory_saver.py.  What torch holds is read with
torch's own getter (2.13+), never with allocconf's bookkeeping.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import run_json, run_script, torch_facts

FACTS = torch_facts()
needs_getter = pytest.mark.skipif(
    not FACTS["getter"], reason="torch before 2.13 has no getter to check")
pytestmark = needs_getter

GET = "torch._C._accelerator_getAllocatorSettings()"


@pytest.fixture
def standins(tmp_path):
    """A directory of stand-in neighbour modules; `broken` raises."""
    for name in ("torch_memory_saver", "vllm", "sglang"):
        (tmp_path / f"{name}.py").write_text("STANDIN = True\n")
    (tmp_path / "broken_neighbour").mkdir()
    return str(tmp_path)


def with_path(path: str) -> str:
    return f"sys.path.insert(0, {path!r})\n"


def snapshot(extra: str = "") -> str:
    return f"""
st = allocconf.status()
print(json.dumps({{"held": {GET}, "reason": st.reason,
                  "neighbours": list(st.neighbours), "advice": st.advice,
                  "es": st.expandable_segments, "kept": list(st.warnings),
                  {extra}}}))
"""


# ---------------------------------------------------------------------------
# 1. The default steps back
# ---------------------------------------------------------------------------

ORDERS = {
    "neighbour, torch, allocconf": "import torch_memory_saver, torch\n"
                                   "import allocconf",
    "torch, allocconf, neighbour": "import torch, allocconf\n"
                                   "import torch_memory_saver",
    "allocconf, neighbour, torch": "import allocconf, torch_memory_saver\n"
                                   "import torch",
    "allocconf, torch, neighbour": "import allocconf, torch\n"
                                   "import torch_memory_saver",
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_default_steps_back_whatever_the_import_order(standins, order):
    out = run_json(with_path(standins), f"""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            {ORDERS[order].replace(chr(10), chr(10) + ' ' * 12)}
        import torch, allocconf
    """, snapshot('"warned": [str(w.message) for w in caught]'),
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"})
    # torch holds expandable segments off (written explicitly: the key is
    # sticky) and the user's key survives.
    assert "expandable_segments:True" not in out["held"]
    assert "max_split_size_mb:256" in out["held"]
    assert out["es"] is False
    assert out["neighbours"] == ["torch_memory_saver"]
    assert "stepped back for torch_memory_saver" in out["reason"]
    assert "pause() freed 0.0 of 8 GiB" in out["reason"]
    steps = [w for w in out["warned"] if "steps back" in w]
    assert len(steps) == 1, out["warned"]


def test_ld_preload_counts_as_torch_memory_saver():
    # ld.so says it cannot preload the (absent) file and goes on.
    out = run_json("""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import allocconf
        import torch
    """, snapshot(), env={
        "LD_PRELOAD": "/nowhere/torch_memory_saver_hook_mode_preload_cu13."
                      "abi3.so:" + os.environ.get("LD_PRELOAD", "")})
    assert out["neighbours"] == ["torch_memory_saver"]
    assert "LD_PRELOAD" in out["reason"]
    assert "expandable_segments:True" not in out["held"]


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_inference_engines_are_neighbours(standins, name):
    out = run_json(with_path(standins), f"""
        import warnings
        warnings.simplefilter("ignore")
        import allocconf, torch
        before = {GET}
        import {name}
    """, snapshot('"before": before'))
    assert out["before"] == "expandable_segments:True"
    assert out["neighbours"] == [name]
    assert out["held"] == "expandable_segments:False"


def test_the_users_choice_wins_and_gets_advice(standins):
    out = run_json(with_path(standins), """
        import allocconf, torch, torch_memory_saver
    """, snapshot(), env={"PYTORCH_CUDA_ALLOC_CONF":
                          "expandable_segments:True"})
    assert out["held"] == "expandable_segments:True"
    assert out["es"] is True
    assert out["neighbours"] == ["torch_memory_saver"]
    assert "set by the user" in out["reason"]
    assert any("torch_memory_saver is in this process and expandable "
               "segments are on" in a for a in out["advice"])


def test_configure_after_the_step_back_wins(standins):
    out = run_json(with_path(standins), """
        import warnings
        warnings.simplefilter("ignore")
        import allocconf, torch, torch_memory_saver
        stepped = {GET}
        allocconf.configure(max_split_size_mb=128)
        still = {GET}
        allocconf.configure(expandable_segments=True)
    """.replace("{GET}", GET), snapshot('"stepped": stepped, "still": still'))
    assert out["stepped"] == "expandable_segments:False"
    assert "expandable_segments:True" not in out["still"]
    assert "max_split_size_mb:128" in out["still"]
    assert "expandable_segments:True" in out["held"]
    assert "max_split_size_mb:128" in out["held"]


def test_step_back_switch_keeps_the_default_on(standins):
    out = run_json(with_path(standins), """
        import allocconf, torch, vllm
    """, snapshot(), env={"ALLOCCONF_STEP_BACK": "0"})
    assert out["held"] == "expandable_segments:True"
    assert out["neighbours"] == ["vllm"]
    assert any("ALLOCCONF_STEP_BACK=0" in a for a in out["advice"])


def test_auto_off_watches_nothing(standins):
    out = run_json(with_path(standins), """
        import allocconf, torch, vllm
        finders = [type(f).__name__ for f in sys.meta_path]
    """, snapshot('"finders": finders'), env={"ALLOCCONF_AUTO": "0"})
    assert out["neighbours"] == []
    assert "NeighbourFinder" not in out["finders"]
    assert "expandable_segments:True" not in out["held"]


def test_a_spec_lookup_or_a_failed_import_is_not_a_neighbour(standins):
    out = run_json(with_path(standins), """
        import importlib.util, os
        import allocconf, torch
        found = importlib.util.find_spec("vllm") is not None
        path = os.path.join(sys.path[0], "sglang.py")
        with open(path, "w") as f:
            f.write("raise ImportError('simulated: engine not built')\\n")
        try:
            import sglang
        except ImportError:
            pass
        after_failure = (list(allocconf.status().neighbours), {GET})
        with open(path, "w") as f:
            f.write("STANDIN = True\\n")
        sys.modules.pop("sglang", None)
        importlib.invalidate_caches()
        import warnings
        warnings.simplefilter("ignore")
        import sglang
    """.replace("{GET}", GET), snapshot('"found": found, '
                                        '"after_failure": after_failure'))
    assert out["found"] is True
    assert out["after_failure"] == [[], "expandable_segments:True"]
    assert out["neighbours"] == ["sglang"]
    assert out["held"] == "expandable_segments:False"


def test_warning_inside_the_neighbours_import_does_not_break_it(standins):
    # Warnings are errors (PRELUDE): the step-back warning, given inside
    # `import vllm`, goes to the logger and status().warnings instead.
    out = run_json(with_path(standins), """
        import allocconf, torch
        import vllm
        ok = vllm.STANDIN
    """, snapshot('"ok": ok'))
    assert out["ok"] is True
    assert len(out["kept"]) == 1 and "steps back" in out["kept"][0]


def test_window_open_when_the_neighbour_arrives(standins):
    out = run_json(with_path(standins), """
        import warnings
        warnings.simplefilter("ignore")
        import allocconf, torch
        allocconf.configure(max_split_size_mb=64)
        with allocconf.ipc_safe():
            import torch_memory_saver
            inside = {GET}
        with allocconf.expandable_segments(True):
            forced = {GET}
    """.replace("{GET}", GET), snapshot('"inside": inside, "forced": forced'))
    assert "expandable_segments:False" in out["inside"]
    assert "expandable_segments:True" in out["forced"]
    assert "max_split_size_mb:64" in out["held"]
    assert "expandable_segments:True" not in out["held"]


def test_one_warning_for_several_neighbours_and_one_finder(standins):
    out = run_json(with_path(standins), """
        import importlib, warnings
        import allocconf
        importlib.reload(allocconf)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, torch_memory_saver, vllm, sglang
        finders = [type(f).__name__ for f in sys.meta_path]
    """, snapshot('"warned": [str(w.message) for w in caught], '
                  '"finders": finders'))
    assert sorted(out["neighbours"]) == ["sglang", "torch_memory_saver",
                                         "vllm"]
    assert len([w for w in out["warned"] if "steps back" in w]) == 1
    # Every neighbour arrived: the finder is gone, and there was one.
    assert "NeighbourFinder" not in out["finders"]


# ---------------------------------------------------------------------------
# 2. Writes by other components are kept
# ---------------------------------------------------------------------------

USER = {"PYTORCH_CUDA_ALLOC_CONF":
        "max_split_size_mb:256,garbage_collection_threshold:0.6"}

# verl's set_expandable_segments, SkyRL's, vLLM's profiling write.
WRITES = {
    "new": "torch._C._accelerator_setAllocatorSettings",
    "deprecated": "torch.cuda.memory._set_allocator_settings",
    # The 2.1-2.9 name exists only on CUDA builds: here a STAND-IN alias
    # of the 2.10+ setter, planted before allocconf attaches.
    "old": "torch._C._cuda_cudaCachingAllocator_set_allocator_settings",
}
PLANT_OLD = """
import torch
if not hasattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings"):
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings = \\
        torch._C._accelerator_setAllocatorSettings
"""


@pytest.mark.parametrize("setter", sorted(WRITES))
def test_a_one_key_write_keeps_the_users_keys(setter):
    out = run_json(PLANT_OLD, f"""
        import warnings
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated one
        import allocconf
        {WRITES[setter]}("expandable_segments:False")
        off = {GET}
        {WRITES[setter]}("max_split_size_mb:20")
    """, snapshot('"off": off'), env=USER)
    assert out["off"] == ("max_split_size_mb:256,garbage_collection_"
                          "threshold:0.6,expandable_segments:False")
    # vLLM's profiling key replaced the user's value for that key only.
    assert out["held"] == ("max_split_size_mb:20,garbage_collection_"
                           "threshold:0.6,expandable_segments:False")
    assert "called by another component" in out["reason"]


def test_without_allocconf_the_same_write_resets_the_users_keys():
    # The oracle for the test above: torch alone drops the user's keys.
    out = run_json("""
        import torch
        torch._C._accelerator_setAllocatorSettings(
            "max_split_size_mb:256,garbage_collection_threshold:0.6")
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
        print(json.dumps(torch._C._accelerator_getAllocatorSettings()))
    """)
    assert out == "expandable_segments:False"


def test_a_window_holds_through_a_foreign_write_then_restores_it():
    out = run_json("""
        import allocconf, torch
        set_ = torch._C._accelerator_setAllocatorSettings
        with allocconf.ipc_safe():
            set_("expandable_segments:True,roundup_power2_divisions:4")
            inside = {GET}
            with allocconf.ipc_safe():
                set_("max_split_size_mb:512")
                nested = {GET}
            still = {GET}
    """.replace("{GET}", GET), snapshot('"inside": inside, "nested": nested, '
                                        '"still": still'), env=USER)
    for key in ("inside", "nested", "still"):
        assert "expandable_segments:False" in out[key], out
    assert "roundup_power2_divisions:4" in out["inside"]
    # The second write replaced the first, as in torch: its
    # roundup_power2_divisions went back to the user's value (none), its
    # sticky expandable_segments:True stayed.
    assert "roundup_power2_divisions" not in out["nested"]
    assert out["held"] == ("max_split_size_mb:512,garbage_collection_"
                           "threshold:0.6,expandable_segments:True")


ATTEMPTS = """
def attempt(value):
    try:
        torch._C._accelerator_setAllocatorSettings(value)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
errors = [attempt("max_split_size_mb:abc"), attempt(5),
          attempt("max_split_size_mb:1")]
"""


def test_a_refused_foreign_write_raises_torchs_error_and_changes_nothing():
    out = run_json("""
        import allocconf, torch
        before = {GET}
    """.replace("{GET}", GET), ATTEMPTS,
        snapshot('"errors": errors, "before": before'), env=USER)
    # The oracle: the same attempts with torch alone.
    oracle = run_json("import torch", ATTEMPTS, "print(json.dumps(errors))")
    assert out["errors"] == oracle  # torch's own errors, word for word
    assert out["held"] == out["before"]


def test_a_string_allocconf_reads_more_strictly_goes_to_torch_as_given():
    # torch skips a stray separator that allocconf's grammar refuses
    # (tests/test_differential.py MISREAD): torch decides, as without it.
    out = run_json("""
        import allocconf, torch
        torch._C._accelerator_setAllocatorSettings(
            "expandable_segments:True:max_split_size_mb:64")
        as_given = {GET}
        with allocconf.ipc_safe():
            inside = {GET}
    """.replace("{GET}", GET), snapshot('"as_given": as_given, '
                                        '"inside": inside'))
    assert out["as_given"] == "expandable_segments:True:max_split_size_mb:64"
    # A window still holds expandable segments off; closing it writes
    # allocconf's configuration, which this unreadable string did not
    # change (the documented limit, docs/neighbours.md).
    assert "expandable_segments:False" in out["inside"]
    assert out["held"] == "expandable_segments:True"


def test_a_str_subclass_goes_to_torch_untouched():
    out = run_json("""
        import allocconf, torch
        class Hostile(str):
            def __str__(self):
                raise RuntimeError("__str__ must not be called")
        torch._C._accelerator_setAllocatorSettings(
            Hostile("expandable_segments:False"))
    """, snapshot())
    assert out["held"] == "expandable_segments:False"


def test_keep_foreign_off_leaves_torchs_setter_alone():
    out = run_json("""
        import torch
        original = torch._C._accelerator_setAllocatorSettings
        import allocconf
        same = torch._C._accelerator_setAllocatorSettings is original
        original("expandable_segments:False")
    """, snapshot('"same": same'),
        env=dict(USER, ALLOCCONF_KEEP_FOREIGN="0"))
    assert out["same"] is True
    assert out["held"] == "expandable_segments:False"


def test_the_wrapper_looks_like_torchs_setter():
    out = run_json("""
        import torch
        original = torch._C._accelerator_setAllocatorSettings
        import allocconf, importlib
        importlib.reload(allocconf)
        w = torch._C._accelerator_setAllocatorSettings
        print(json.dumps({"name": w.__name__, "doc": w.__doc__ == original.__doc__,
                          "wrapped": w.__wrapped__ is original}))
    """)
    assert out == {"name": "_accelerator_setAllocatorSettings", "doc": True,
                   "wrapped": True}


def test_foreign_writes_and_windows_from_many_threads():
    out = run_json("""
        import threading
        import allocconf, torch
        set_ = torch._C._accelerator_setAllocatorSettings
        errors = []
        def windows():
            try:
                for _ in range(300):
                    with allocconf.ipc_safe():
                        pass
            except Exception as exc:
                errors.append(repr(exc))
        def writer(i):
            try:
                for j in range(300):
                    set_(f"roundup_power2_divisions:{1 << (j % 4)}")
            except Exception as exc:
                errors.append(repr(exc))
        ts = [threading.Thread(target=windows) for _ in range(4)]
        ts += [threading.Thread(target=writer, args=(i,)) for i in range(2)]
        for t in ts: t.start()
        for t in ts: t.join()
        st = allocconf.status()
        print(json.dumps({"errors": errors, "held": {GET},
                          "config": st.config, "depth": st.window_depth}))
    """.replace("{GET}", GET), env=USER)
    assert out["errors"] == []
    assert out["depth"] == 0
    assert out["held"] == out["config"]
    assert "max_split_size_mb:256" in out["held"]
    assert "expandable_segments:True" in out["held"]


# ---------------------------------------------------------------------------
# 3. Children
# ---------------------------------------------------------------------------

CHILD = textwrap.dedent(f"""
    import json, torch, allocconf
    torch.empty(1)
    print(json.dumps({{"held": {GET},
                       "auto": allocconf._C._internals()["auto"],
                       "env": {{k: v for k, v in __import__("os").environ.items()
                               if k.startswith(("PYTORCH_", "ALLOCCONF_"))}}}}))
""")


def run_child(env):
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_child_env_in_real_subprocesses():
    out = run_json("""
        import os, subprocess
        import allocconf, torch
        allocconf.configure(roundup_power2_divisions=8)
        before = dict(os.environ)
        envs = {c: allocconf.child_env(c) for c in ("same", "user", "off")}
        ray = allocconf.child_env("same", environ={})
        print(json.dumps({"envs": envs, "ray": ray, "held": {GET},
                          "unchanged": dict(os.environ) == before}))
    """.replace("{GET}", GET), env=USER)
    assert out["unchanged"] is True
    assert out["ray"] == {"ALLOCCONF_AUTO": "0",
                          "PYTORCH_CUDA_ALLOC_CONF": out["held"]}
    same = run_child(out["envs"]["same"])
    assert same["held"] == out["held"]
    assert same["auto"] is False
    user = run_child(out["envs"]["user"])
    assert user["held"] == ("max_split_size_mb:256,garbage_collection_"
                            "threshold:0.6,roundup_power2_divisions:8")
    off = run_child(out["envs"]["off"])
    assert off["env"]["PYTORCH_CUDA_ALLOC_CONF"] == \
        USER["PYTORCH_CUDA_ALLOC_CONF"]
    assert off["held"] == USER["PYTORCH_CUDA_ALLOC_CONF"]


def test_child_env_makes_every_set_variable_agree_and_names_bad_input():
    out = run_json("""
        import allocconf
        env = allocconf.child_env("same", environ={
            "PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "HOME": "/h"})
        try:
            allocconf.child_env("inherit")
        except ValueError as exc:
            err = str(exc)
        print(json.dumps({"env": env, "err": err}))
    """, env=USER)
    value = out["env"]["PYTORCH_CUDA_ALLOC_CONF"]
    assert out["env"]["PYTORCH_ALLOC_CONF"] == value
    assert out["env"]["HOME"] == "/h"
    assert "'inherit'" in out["err"] and "'same'" in out["err"]


def test_child_env_after_a_step_back_gives_the_child_expandable_off(standins):
    out = run_json(with_path(standins), """
        import warnings
        warnings.simplefilter("ignore")
        import allocconf, torch, torch_memory_saver
        print(json.dumps(allocconf.child_env("same", environ={})))
    """)
    assert out == {"ALLOCCONF_AUTO": "0",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}


SPAWN_MAIN = """
import json, multiprocessing as mp, sys
{top}

def report(q):
    st = None
    if "allocconf" in sys.modules:
        import torch
        st = sys.modules["allocconf"].status().reason
    q.put(["allocconf" in sys.modules, st])

if __name__ == "__main__":
    {guarded}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,))
    p.start()
    print(json.dumps(q.get(timeout=120)))
    p.join()
"""


@pytest.mark.parametrize("where", ["top level", "under the main guard"])
def test_spawned_children_run_a_top_level_import_again(tmp_path, where):
    top, guarded = (("import allocconf", "pass") if where == "top level"
                    else ("", "import allocconf"))
    script = tmp_path / "main.py"
    script.write_text(SPAWN_MAIN.format(top=top, guarded=guarded))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTORCH_", "ALLOCCONF_"))}
    proc = subprocess.run([sys.executable, str(script)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    imported, reason = json.loads(proc.stdout.strip().splitlines()[-1])
    if where == "top level":
        assert imported is True
        assert reason.startswith("expandable segments turned on by allocconf")
    else:
        assert imported is False


# ---------------------------------------------------------------------------
# 4. The opt-in export
# ---------------------------------------------------------------------------


def test_export_is_off_by_default():
    out = run_json("""
        import os
        import allocconf, torch
        allocconf.configure(max_split_size_mb=64)
        print(json.dumps(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))
    """)
    assert out is None


def test_export_writes_what_torch_holds_and_keeps_it_current(standins):
    out = run_json(with_path(standins), """
        import os, warnings
        import allocconf
        before_torch = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        import torch
        seen = [os.environ.get("PYTORCH_CUDA_ALLOC_CONF")]
        allocconf.configure(roundup_power2_divisions=4)
        seen.append(os.environ["PYTORCH_CUDA_ALLOC_CONF"])
        torch._C._accelerator_setAllocatorSettings("max_split_size_mb:128")
        seen.append(os.environ["PYTORCH_CUDA_ALLOC_CONF"])
        with allocconf.ipc_safe():
            seen.append(os.environ["PYTORCH_CUDA_ALLOC_CONF"])
        warnings.simplefilter("ignore")
        import torch_memory_saver
        seen.append(os.environ["PYTORCH_CUDA_ALLOC_CONF"])
        seen.append(os.environ["PYTORCH_ALLOC_CONF"])
        print(json.dumps({"before": before_torch, "seen": seen,
                          "parsed_held": allocconf.parse({GET}),
                          "parsed_seen": allocconf.parse(seen[-1])}))
    """.replace("{GET}", GET), env={"ALLOCCONF_EXPORT": "1",
                                    "PYTORCH_ALLOC_CONF": "max_split_size_mb:256"})
    assert out["before"] is None  # nothing before torch is attached
    seen = out["seen"]
    assert seen[0] == "max_split_size_mb:256,expandable_segments:True"
    assert "roundup_power2_divisions:4" in seen[1]
    assert "max_split_size_mb:128" in seen[2]
    assert seen[3] == seen[2]  # windows do not touch the environment
    assert "expandable_segments:False" in seen[4]
    assert seen[5] == seen[4]
    assert out["parsed_held"] == out["parsed_seen"]
