"""allocconf.configure(): merge, write, and leave everything as it was on
bad input."""
import pytest

from helpers import run_json, skip_if_torch_dies

CONFIGURE = """
from helpers import recorder; recorder.install()
import allocconf, torch
{body}
print(json.dumps({{"calls": recorder.CALLS, "live": recorder.live(),
                   "status": allocconf.status().as_dict(), "out": out}}))
"""


def run(body, env=None):
    return run_json(CONFIGURE.format(body=body), env=env)


def test_configure_merges_into_the_users_configuration():
    out = run("out = allocconf.configure('garbage_collection_threshold:0.6', "
              "max_split_size_mb=128)",
              env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    want = ("max_split_size_mb:128,garbage_collection_threshold:0.6,"
            "expandable_segments:True")
    assert out["out"] == want
    assert out["calls"][-1] == want
    assert out["live"] == want
    assert out["status"]["user_config"] == (
        "max_split_size_mb:128,garbage_collection_threshold:0.6")
    assert "configure()" in out["status"]["reason"]


def test_configure_expandable_segments_false_is_the_users_choice():
    out = run("out = allocconf.configure(expandable_segments=False)")
    assert out["out"] == "expandable_segments:False"
    assert out["live"] == "expandable_segments:False"
    assert out["status"]["expandable_segments"] is False


def test_configure_none_removes_a_key():
    out = run("out = allocconf.configure(max_split_size_mb=None)",
              env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["out"] == "expandable_segments:True"


def test_configure_with_nothing_new_writes_nothing_more():
    out = run("out = allocconf.configure()")
    assert out["calls"] == ["expandable_segments:True"]


@pytest.mark.parametrize("call, key, offset", [
    ("allocconf.configure('max_split_size_mb:5')", "max_split_size_mb", 18),
    ("allocconf.configure(garbage_collection_threshold=2)",
     "garbage_collection_threshold", 29),
    ("allocconf.configure('expandable_segments:yes')",
     "expandable_segments", 20),
])
def test_bad_input_raises_and_changes_nothing(call, key, offset):
    out = run(f"""
before = allocconf.status().as_dict()
try:
    {call}
    out = None
except allocconf.AllocConfError as exc:
    out = [exc.key, exc.offset, str(exc)]
assert allocconf.status().as_dict() == before
""", env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["out"][:2] == [key, offset]
    assert out["calls"] == ["max_split_size_mb:64,expandable_segments:True"]
    assert out["live"] == "max_split_size_mb:64,expandable_segments:True"


def test_backend_cannot_change_at_run_time():
    out = run("""
try:
    allocconf.configure(backend="cudaMallocAsync")
    out = None
except allocconf.AllocConfError as exc:
    out = str(exc)
""")
    assert "torch reads it once" in out["out"]
    assert out["calls"] == ["expandable_segments:True"]


def test_torch_refusing_a_configure_write_rolls_back():
    out = run("""
recorder.REJECT.add("max_split_size_mb:256,expandable_segments:True")
try:
    allocconf.configure(max_split_size_mb=256)
    out = None
except allocconf.AllocConfError as exc:  # as documented, not torch's own
    out = [str(exc), str(exc.__cause__)]
out = [out, allocconf.configure()]
""")
    message, cause = out["out"][0]
    assert message.startswith("allocconf: torch refused "
                              "'max_split_size_mb:256,expandable_segments:True'")
    assert cause.startswith("recorder refused")
    assert out["out"][1] == "expandable_segments:True"
    assert out["live"] == "expandable_segments:True"


def test_configure_before_torch_is_written_when_torch_arrives():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf
        allocconf.configure(max_split_size_mb=256)
        import torch
        print(json.dumps(recorder.CALLS))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == ["max_split_size_mb:256,expandable_segments:True"]


def test_configure_inside_a_window_takes_effect_when_it_closes():
    out = run("""
with allocconf.ipc_safe():
    out = allocconf.configure(max_split_size_mb=96)
    inside = recorder.live()
assert inside == "max_split_size_mb:96,expandable_segments:False", inside
""")
    assert out["out"] == "max_split_size_mb:96,expandable_segments:True"
    assert out["live"] == "max_split_size_mb:96,expandable_segments:True"


def test_configure_refuses_to_merge_into_a_malformed_variable():
    skip_if_torch_dies({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:1"})
    out = run_json("""
        warnings.simplefilter("ignore")  # the import-time warning
        import allocconf, torch
        try:
            allocconf.configure(max_split_size_mb=64)
        except allocconf.AllocConfError as exc:
            print(json.dumps(str(exc)))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:1"})
    assert "PYTORCH_CUDA_ALLOC_CONF is malformed" in out
    assert "fix it before configure()" in out


def test_set_expandable_segments_keeps_every_other_key():
    # verl's one-liner writes "expandable_segments:False" alone, which
    # resets max_split_size_mb; the drop-in writes the full configuration.
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        allocconf.set_expandable_segments(False)
        off = [recorder.live(), allocconf.status().expandable_segments]
        allocconf.set_expandable_segments(True)
        on = [recorder.live(), allocconf.status().expandable_segments]
        try:
            allocconf.set_expandable_segments("False")
            err = None
        except TypeError as exc:
            err = str(exc)
        print(json.dumps([off, on, err, recorder.live()]))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    off, on, err, last = out
    assert off == ["max_split_size_mb:64,expandable_segments:False", False]
    assert on == ["max_split_size_mb:64,expandable_segments:True", True]
    assert "takes True or False, not 'False'" in err
    assert last == on[0]  # the refused call changed nothing


def test_set_expandable_segments_inside_a_window_waits_for_it_to_close():
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        with allocconf.ipc_safe():
            allocconf.set_expandable_segments(True)
            inside = recorder.live()
        print(json.dumps([inside, recorder.live()]))
    """, env={"ALLOCCONF_AUTO": "0"})
    assert out == ["expandable_segments:False", "expandable_segments:True"]
