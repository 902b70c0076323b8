"""The backend key under backend:cudaMallocAsync: configure() writes the
user's settings with it, and what it returns, status(), child_env() and
torch's getter all say the same string."""
from helpers import needs_getter, run_json

ASYNC = "backend:cudaMallocAsync,max_split_size_mb:64"


def test_configure_under_cuda_malloc_async_keeps_the_backend():
    needs_getter()
    out = run_json("""
        import allocconf, torch
        get = torch._C._accelerator_getAllocatorSettings
        before = get()
        ret = allocconf.configure(garbage_collection_threshold=0.5)
        held = get()
        with allocconf.ipc_safe():
            inside = get()
        st = allocconf.status()
        print(json.dumps({
            "before": before, "ret": ret, "held": held, "inside": inside,
            "config": st.config, "user": st.user_config,
            "es": st.expandable_segments,
            "same": allocconf.child_env("same", environ={}),
            "user_env": allocconf.child_env("user", environ={})}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": ASYNC})
    want = ASYNC + ",garbage_collection_threshold:0.5"
    assert out["before"] == ASYNC  # nothing written at import
    assert out["ret"] == out["held"] == out["config"] == want
    assert out["inside"] == want  # a window holds nothing here
    assert out["user"] == want
    assert out["es"] is None
    for env in (out["same"], out["user_env"]):
        assert env == {"ALLOCCONF_AUTO": "0",
                       "PYTORCH_CUDA_ALLOC_CONF": want}


def test_configure_returns_what_torch_holds_where_nothing_is_written():
    # A stand-in torch without a setter: allocconf can write nothing, and
    # configure() says what torch holds instead of a string never written.
    out = run_json("""
        import sys, types
        torch = types.ModuleType("torch")
        torch.__version__ = "2.13.0"
        torch.version = types.SimpleNamespace(cuda="12.8", hip=None)
        sys.modules["torch"] = torch
        import allocconf
        print(json.dumps([allocconf.configure(max_split_size_mb=128),
                          allocconf.status().config]))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == ["max_split_size_mb:64", "max_split_size_mb:64"]
