"""What allocconf prints, and what it takes: every line says it is
allocconf's, once per problem, pointing at the user's code; values and
switches as docs/api.md and docs/environment.md say."""
import os
import subprocess
import sys

import pytest

from helpers import TESTS_DIR, child_env, run_json, run_script, torch_facts


def _stderr_of(code, env, cwd=None):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, env=child_env(env),
                          cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_one_line_per_problem_each_saying_whose():
    facts = torch_facts()
    if "PYTORCH_ALLOC_CONF" not in facts["reads"]:
        pytest.skip("this torch does not read PYTORCH_ALLOC_CONF")
    # A shadowed opt-out: one AllocConfWarning, and status().advice; no
    # second, bare copy from logging's last-resort handler.
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
           "PYTORCH_ALLOC_CONF": "expandable_segments:False"}
    err = _stderr_of("import allocconf, torch", env)
    lines = [ln for ln in err.splitlines()
             if ln.strip() and not ln.startswith("  ")]
    assert lines, err
    assert all("allocconf" in ln for ln in lines), err
    assert err.count("PYTORCH_ALLOC_CONF") == 1, err
    # Advice alone (no warning): one line, saying whose, with or without
    # logging set up.
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}
    err = _stderr_of("import allocconf, torch", env)
    assert err.startswith("allocconf: max_split_size_mb is set"), err
    assert err.count("\n") == 1, err
    err = _stderr_of("import logging; logging.basicConfig()\n"
                     "import allocconf, torch", env)
    assert err.count("max_split_size_mb is set") == 1, err
    assert "WARNING:allocconf:" in err


def test_the_report_prints_each_advice_once():
    proc = subprocess.run(
        [sys.executable, "-m", "allocconf", "--no-probe"], capture_output=True,
        text=True, timeout=300,
        env=child_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}))
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert both.count("max_split_size_mb is set") == 1, both
    assert "ADVICE:       max_split_size_mb is set" in proc.stdout


def test_two_variables_holding_the_same_string_need_no_fixing():
    facts = torch_facts()
    out = run_json("""
        import allocconf, torch
        child = allocconf.child_env("same", environ={
            "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
        print(json.dumps(child))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    del out["ALLOCCONF_AUTO"]
    assert len(set(out.values())) == 1  # child_env writes both alike
    advice = run_json("""
        import allocconf, torch
        print(json.dumps(allocconf.status().advice))
    """, env=out)
    assert all("Keep one of the two" not in a for a in advice), advice
    if "PYTORCH_ALLOC_CONF" in facts["reads"]:
        assert advice == []


def test_the_step_back_warning_points_at_the_users_import(tmp_path):
    (tmp_path / "vllm.py").write_text("STANDIN = True\n")
    (tmp_path / "train.py").write_text(
        "import allocconf\nimport torch\nimport vllm  # here\n")
    err = _stderr_of("import runpy; runpy.run_path('train.py')", {},
                     cwd=str(tmp_path))
    assert "train.py:3: AllocConfWarning: allocconf: vllm is in this " \
        "process" in err, err
    assert "_hook.py" not in err


def test_a_malformed_variable_under_warnings_as_errors_imports():
    out = run_json("""
        import allocconf
        print(json.dumps(list(allocconf.status().warnings)))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"})
    assert len(out) == 1 and "is malformed" in out[0]


def test_ipc_capable_names_what_it_got():
    out = run_json("""
        import allocconf
        try:
            allocconf.ipc_capable("x")
        except ValueError as exc:
            print(json.dumps(str(exc)))
    """)
    assert out == ("allocconf.ipc_capable: expected a CUDA tensor, got str "
                   "(no device)")


def test_allocconf_debug_with_another_value_warns():
    out = run_json("""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import allocconf
        print(json.dumps([str(w.message) for w in caught]))
    """, env={"ALLOCCONF_DEBUG": "banana"})
    assert out == ["allocconf: ALLOCCONF_DEBUG=banana is not one of "
                   "0/1/true/false/yes/no/on/off; tracing stays off"]


def test_integers_and_booleans_of_any_type():
    pytest.importorskip("numpy")
    out = run_json("""
        import fractions, numpy, allocconf
        print(json.dumps([
            allocconf.merge("", max_split_size_mb=numpy.int64(512)),
            allocconf.merge("", max_split_size_mb=numpy.uint16(512)),
            allocconf.merge("", expandable_segments=numpy.bool_(True)),
            allocconf.merge("", expandable_segments=numpy.bool_(False)),
            allocconf.merge("", garbage_collection_threshold=
                            numpy.float32(0.5)),
            allocconf.merge("", garbage_collection_threshold=
                            fractions.Fraction(1, 4)),
            allocconf.merge("", roundup_power2_divisions={
                numpy.int64(256): numpy.int32(2)}),
        ]))
    """)
    assert out == ["max_split_size_mb:512", "max_split_size_mb:512",
                   "expandable_segments:True", "expandable_segments:False",
                   "garbage_collection_threshold:0.5",
                   "garbage_collection_threshold:0.25",
                   "roundup_power2_divisions:[256:2]"]


def test_other_objects_are_still_refused_by_name():
    out = run_json("""
        import allocconf
        try:
            allocconf.merge("", max_split_size_mb=object())
        except TypeError as exc:
            print(json.dumps(str(exc)))
    """)
    assert out == ("allocconf: max_split_size_mb: a value must be a str, a "
                   "bool, an integer, a real number, a dict or a list, not "
                   "object")


def test_the_example_says_it_needs_a_gpu():
    if not torch_facts()["cpu_only"]:
        pytest.skip("a CUDA build: the example may find a GPU")
    example = os.path.join(os.path.dirname(TESTS_DIR), "examples",
                           "rl_weight_sync.py")
    proc = subprocess.run([sys.executable, example], capture_output=True,
                          text=True, timeout=120, env=child_env())
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("rl_weight_sync.py: needs a CUDA GPU")


def test_a_sub_interpreter_first_makes_the_main_import_say_why():
    if sys.version_info >= (3, 12):
        pytest.skip("3.12+ refuses allocconf in sub-interpreters by the "
                    "module slot, so the main interpreter's import works")
    proc = run_script("""
        import _xxsubinterpreters as si
        interp = si.create()
        si.run_string(interp, "import sys; sys.path[:0] = %r; "
                              "import allocconf" % sys.path)
        try:
            import allocconf
            print(json.dumps(None))
        except ImportError as exc:
            print(json.dumps(str(exc)))
    """, timeout=60)
    said = proc.stdout.strip().splitlines()[-1]
    assert "already imported by another interpreter of this process" in said
    assert "Import allocconf in one interpreter only" in said
