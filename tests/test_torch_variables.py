"""allocconf reads the variable the running torch reads.

Which of PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF and
PYTORCH_ALLOC_CONF a torch reads differs by version and build
(docs/compatibility.md, measured with tools/torch-variables.py): torch
before 2.10 (no torch._C._accelerator_setAllocatorSettings) reads only the
CUDA one (and the HIP one on ROCm builds); 2.10+ reads all three for
expandable_segments, and its CUDA allocator takes `backend` from the CUDA
one, then PYTORCH_ALLOC_CONF.  The decisions are checked with a stand-in
torch carrying only the capability; the real torch installed is the
oracle in the last tests (2.13's getter in CI; the backend torch chose on
the CUDA builds that tools/old-torch-check.sh installs)."""
import pytest

from helpers import run_json, torch_facts
from helpers.standin import decide, stand_in

OLD = dict(version="2.9.1+cu128", cuda="12.8",
           setter="_cuda_cudaCachingAllocator_set_allocator_settings")
NEW = dict(version="2.14.1+cu130", cuda="13.0")


def test_torch_before_2_10_does_not_read_PYTORCH_ALLOC_CONF():
    out = decide(**OLD, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
    # Its max_split_size_mb is not applied: torch alone would not apply it.
    assert out["calls"] == ["expandable_segments:True"]
    st = out["status"]
    assert st["source"] is None
    assert st["user_config"] == ""
    assert st["advice"] == [
        "PYTORCH_ALLOC_CONF is set ('max_split_size_mb:64') but torch "
        "2.9.1+cu128 does not read it for CUDA (it reads "
        "PYTORCH_CUDA_ALLOC_CONF), so allocconf does not apply it either. "
        "Move the settings to PYTORCH_CUDA_ALLOC_CONF."]


def test_torch_2_10_and_later_read_PYTORCH_ALLOC_CONF():
    out = decide(**NEW, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["calls"] == ["max_split_size_mb:64,expandable_segments:True"]
    assert out["status"]["source"] == "PYTORCH_ALLOC_CONF"
    assert not any("does not read" in a for a in out["status"]["advice"])


def test_an_opt_out_torch_cannot_see_is_still_honoured():
    out = decide(**OLD, env={
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:32",
        "PYTORCH_ALLOC_CONF": "expandable_segments:False"}, warns=1)
    assert out["calls"] == []  # torch keeps what it read: nothing to write
    assert out["warnings"] == [
        "allocconf: PYTORCH_ALLOC_CONF says expandable_segments:False, but "
        "the torch imported does not read it for CUDA; allocconf honours "
        "it as your opt-out and turns nothing on. Move your settings into "
        "the variable torch applies."]
    st = out["status"]
    assert st["expandable_segments"] is False
    assert st["source"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert st["reason"] == (
        "expandable_segments:False set by the user in PYTORCH_ALLOC_CONF, "
        "which this torch does not read for CUDA: allocconf honours it as "
        "an opt-out and turns nothing on")
    assert "honoured as an opt-out" in st["advice"][0]


def test_an_unread_variable_saying_true_changes_nothing():
    # allocconf's default turns expandable segments on anyway; the other
    # keys of the unread variable stay unapplied.
    out = decide(**OLD, env={
        "PYTORCH_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:64"})
    assert out["calls"] == ["expandable_segments:True"]
    assert out["status"]["reason"] == "expandable segments turned on by " \
                                      "allocconf"


@pytest.mark.parametrize("hip, read", [(None, False), ("7.0.51831", True)])
def test_the_hip_variable_before_2_10_only_on_rocm(hip, read):
    out = decide(**{**OLD, "hip": hip},
                 env={"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:64"})
    if read:
        assert out["calls"] == ["max_split_size_mb:64,"
                                "expandable_segments:True"]
        assert out["status"]["source"] == "PYTORCH_HIP_ALLOC_CONF"
    else:
        assert out["calls"] == ["expandable_segments:True"]
        assert "PYTORCH_HIP_ALLOC_CONF is set" in out["status"]["advice"][0]


@pytest.mark.parametrize("var, blocked", [
    ("PYTORCH_CUDA_ALLOC_CONF", True),
    ("PYTORCH_ALLOC_CONF", True),
    # 2.14.1's CUDA allocator takes no backend from the HIP variable
    # (measured), though its expandable_segments comes from there.
    ("PYTORCH_HIP_ALLOC_CONF", False),
])
def test_the_backend_comes_from_what_the_cuda_allocator_reads(var, blocked):
    out = decide(**NEW, env={var: "backend:cudaMallocAsync"})
    st = out["status"]
    if blocked:
        assert out["calls"] == []
        assert st["reason"] == (
            f"backend:cudaMallocAsync in {var}: that backend has no "
            f"expandable segments; allocconf turns nothing on and writes "
            f"only what configure() or another component gives it")
    else:
        # The backend key of a variable the CUDA allocator does not read
        # for its backend is not written: torch would refuse it.
        assert out["calls"] == ["expandable_segments:True"]
        assert st["expandable_segments"] is True


def test_a_backend_torch_ignores_does_not_block():
    out = decide(**OLD, env={"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert out["calls"] == ["expandable_segments:True"]
    assert "does not read it" in out["status"]["advice"][0]


def test_report_names_what_torch_ignores():
    out = run_json(stand_in(**OLD), """
        from allocconf import _report
        print(json.dumps(_report._variables()))
    """, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64",
              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:32"})
    assert out == {
        "set": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:32",
                "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"},
        "conflict": True,
        "torch_reads": ["PYTORCH_CUDA_ALLOC_CONF"],
        "ignored": {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}}


def warned(torch_kwargs, env, after=False):
    """The AllocConfWarnings `import allocconf` gives next to a stand-in
    torch imported before it (or, `after`, installed only once allocconf
    is imported), the calls torch received and the status."""
    tail = ('sys.modules["torch"] = torch\n'
            'with warnings.catch_warnings(record=True) as caught:\n'
            '    warnings.simplefilter("always")\n'
            '    import allocconf\n')
    code = stand_in(**torch_kwargs).replace(
        tail, 'import allocconf\nsys.modules["torch"] = torch\n'
        'allocconf._on_torch(torch)\n' if after else
        'sys.modules["torch"] = torch\nimport allocconf\n')
    assert "caught" not in code
    return run_json("""
        import warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            exec(CODE)
        print(json.dumps({"warnings": [str(w.message) for w in seen],
                          "calls": calls,
                          "status": allocconf.status().as_dict()}))
    """.replace("CODE", repr(code)), env=env)


BAD_UNREAD = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:6\udcff4"}


def test_a_malformed_variable_torch_does_not_read_is_no_warning():
    # torch before 2.10, imported first: it never reads PYTORCH_ALLOC_CONF,
    # so its bad bytes are advice, not a "writes nothing" warning.
    out = warned(OLD, BAD_UNREAD)
    assert out["warnings"] == []
    assert out["calls"] == ["expandable_segments:True"]
    assert out["status"]["advice"][0].startswith(
        "PYTORCH_ALLOC_CONF is set ('max_split_size_mb:6\ufffd4') but torch "
        "2.9.1+cu128 does not read it")


def test_a_malformed_variable_torch_reads_still_warns():
    out = warned(NEW, BAD_UNREAD)
    assert out["calls"] == []
    assert len(out["warnings"]) == 1
    assert out["warnings"][0].startswith(
        "allocconf: PYTORCH_ALLOC_CONF is malformed: ")
    assert out["warnings"][0].endswith(
        "allocconf writes nothing and leaves the allocator as torch will "
        "read it")


def test_before_torch_a_malformed_variable_torch_may_not_read():
    # allocconf first: which variables torch reads is not known yet.  The
    # warning says so, and the torch that comes (2.9.1) ignores the
    # variable: allocconf writes after all.
    out = warned(OLD, BAD_UNREAD, after=True)
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "PYTORCH_ALLOC_CONF is malformed" in out["warnings"][0]
    assert out["warnings"][0].endswith(
        "allocconf writes nothing unless the torch imported does not read "
        "PYTORCH_ALLOC_CONF (torch before 2.10 reads only "
        "PYTORCH_CUDA_ALLOC_CONF)")
    assert out["calls"] == ["expandable_segments:True"]


def test_a_torch_imported_first_whose_attributes_raise():
    # Reading the environment as the imported torch reads it asks torch
    # for its setter and ROCm version, and attaching wraps its setters:
    # attributes that raise mean "not there" (a torch before 2.10, CUDA
    # variable only), never an error out of `import allocconf`.
    out = run_json("""
        import types
        class Hostile(types.SimpleNamespace):
            def __getattr__(self, name):
                raise RuntimeError("no " + name)
        class HostileModule(types.ModuleType):
            def __getattr__(self, name):
                raise RuntimeError("no " + name)
        torch = HostileModule("torch")
        torch._C = Hostile()
        sys.modules["torch"] = torch
        import allocconf
        print(json.dumps([allocconf._C._internals()["reads"],
                          allocconf.status().api,
                          [w for w in allocconf.status().warnings
                           if "activation failed" in w]]))
    """, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:6\udcff4"})
    assert out == [["PYTORCH_CUDA_ALLOC_CONF"], None, []]


def test_before_torch_every_variable_counts():
    # torch not imported yet: allocconf cannot tell which it will read.
    out = run_json("""
        import allocconf
        print(json.dumps([allocconf.status().source,
                          allocconf._C._internals()["reads"]]))
    """, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == ["PYTORCH_ALLOC_CONF", ["PYTORCH_CUDA_ALLOC_CONF",
                                          "PYTORCH_HIP_ALLOC_CONF",
                                          "PYTORCH_ALLOC_CONF"]]


# ---------------------------------------------------------------------------
# The installed torch as the oracle
# ---------------------------------------------------------------------------

VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF")
# Each alone, and each pair in both orders, with values telling them apart.
SETS = [{v: "max_split_size_mb:101"} for v in VARS] + [
    {a: "max_split_size_mb:101", b: "max_split_size_mb:102"}
    for a in VARS for b in VARS if a != b] + [
    {a: "", b: "max_split_size_mb:102"} for a in VARS for b in VARS if a != b]


@pytest.mark.parametrize("env", SETS, ids=lambda e: ",".join(
    f"{k[8:-11] or 'ALLOC'}={v[-3:] or 'empty'}" for k, v in e.items()))
def test_allocconf_reads_what_torchs_getter_shows(env):
    if not torch_facts()["getter"]:
        pytest.skip("this torch has no getter to compare with")
    out = run_json("""
        import allocconf, torch
        print(json.dumps([allocconf.status().user_config,
                          torch._C._accelerator_getAllocatorSettings()]))
    """, env={**env, "ALLOCCONF_AUTO": "0"})
    assert out[0] == out[1]


@pytest.mark.parametrize("var", VARS)
def test_allocconf_blocks_exactly_when_torch_chose_the_async_backend(var):
    out = run_json("""
        import allocconf, torch
        if not torch.version.cuda:
            print(json.dumps(None)); raise SystemExit
        print(json.dumps([torch.cuda.get_allocator_backend(),
                          allocconf.status().reason]))
    """, env={var: "backend:cudaMallocAsync"})
    if out is None:
        pytest.skip("a CPU build has no CUDA allocator to ask")
    backend, reason = out
    assert (backend == "cudaMallocAsync") is (
        "that backend has no expandable segments" in reason), out
