"""The user's opt-outs hold on a real GPU, and a
malformed variable gives allocconf's warning and no write."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

RUN = """
from helpers import recorder; recorder.install()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import allocconf, torch
from helpers.gpu import alloc, expandable
t = alloc(64)
print(json.dumps({"calls": recorder.CALLS, "expandable": EXPANDABLE,
                  "warnings": [str(w.message) for w in caught
                               if w.category is allocconf.AllocConfWarning],
                  "status": allocconf.status().as_dict()}))
"""


def run(env, check_segment=True):
    return run_json(RUN.replace(
        "EXPANDABLE", "expandable(t)" if check_segment else "None"), env=env)


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF",
                                 "PYTORCH_HIP_ALLOC_CONF",
                                 "PYTORCH_ALLOC_CONF"])
def test_expandable_segments_false_in_the_environment_wins(var):
    out = run({var: "expandable_segments:False"})
    assert out["calls"] == []
    assert out["expandable"] is False
    assert out["status"]["applied"] is False
    assert out["status"]["expandable_segments"] is False


def test_allocconf_auto_0():
    out = run({"ALLOCCONF_AUTO": "0"})
    assert out["calls"] == []
    assert out["expandable"] is False
    assert "ALLOCCONF_AUTO=0" in out["status"]["reason"]


def test_cuda_malloc_async_no_write_no_crash():
    out = run({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
              check_segment=False)
    assert out["calls"] == []
    assert out["warnings"] == []
    assert "backend:cudaMallocAsync" in out["status"]["reason"]
    assert out["status"]["expandable_segments"] is None


@pytest.mark.parametrize("cuda_first", [False, True])
def test_configure_under_cuda_malloc_async_writes_the_backend_torch_runs(
        cuda_first):
    # configure() writes the user's backend key with the new settings:
    # torch refuses a backend other than the one it loaded, and takes the
    # same one, before and after CUDA is initialised.
    out = run_json("""
        from helpers import recorder; recorder.install()
        import allocconf, torch
        if CUDA_FIRST:
            torch.empty(1, device="cuda")
        ret = allocconf.configure(garbage_collection_threshold=0.5)
        t = torch.ones(1 << 20, device="cuda")
        print(json.dumps({
            "ret": ret, "calls": recorder.CALLS, "live": recorder.live(),
            "backend": torch.cuda.get_allocator_backend(),
            "sum": float(t.sum())}))
    """.replace("CUDA_FIRST", str(cuda_first)),
        env={"PYTORCH_CUDA_ALLOC_CONF":
             "backend:cudaMallocAsync,max_split_size_mb:64"})
    want = ("backend:cudaMallocAsync,max_split_size_mb:64,"
            "garbage_collection_threshold:0.5")
    assert out == {"ret": want, "calls": [want], "live": want,
                   "backend": "cudaMallocAsync", "sum": float(1 << 20)}


def test_malformed_variable_warns_with_key_and_offset_and_writes_nothing():
    out = run_json("""
        from helpers import recorder; recorder.install()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import allocconf, torch
        print(json.dumps({"calls": recorder.CALLS,
                          "warnings": [str(w.message) for w in caught
                                       if "allocconf" in str(w.message)]}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF":
              "max_split_size_mb:64,garbage_collection_threshold:1.5"})
    assert out["calls"] == []
    assert len(out["warnings"]) == 1
    assert ("garbage_collection_threshold at offset 50: must be between 0 "
            "and 1") in out["warnings"][0]


def test_unknown_key_refused_by_torch_warns_at_import_and_is_handed_back():
    # allocconf keeps unknown keys (new torch versions add keys), so a typo
    # is torch's to refuse: allocconf says so at import, naming torch's
    # reason, and hands torch back the string it held, with
    # expandable_segments named at its default, since the refused string
    # named it and torch keeps that key (it may have read it first).
    out = run_json("""
        from helpers import recorder; recorder.install()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import allocconf, torch
        try:
            torch.empty(1, device="cuda")
            torch_says = None
        except Exception as exc:  # torch's own error, at first use
            torch_says = str(exc)
        print(json.dumps({"calls": recorder.CALLS, "torch_says": torch_says,
                          "warnings": [str(w.message) for w in caught
                                       if "allocconf" in str(w.message)]}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"})
    assert out["calls"] == [
        "expandable_segment:True,expandable_segments:True",
        "expandable_segments:False,expandable_segment:True"]
    assert len(out["warnings"]) == 1
    assert "torch refused" in out["warnings"][0]
    assert "Unrecognized key 'expandable_segment'" in out["warnings"][0]
    assert "expandable_segment" in (out["torch_says"] or "")
