"""The user's settings, through each variable, are what torch
holds before activation, after it, and after 10,000 windows."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

USER = ("max_split_size_mb:64,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[256:1,512:2,>:8]")
VARS = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF"]

WINDOWS = """
for _ in range(10_000):
    with allocconf.ipc_safe():
        pass
s2 = settings(); m2 = torch.cuda.memory_stats()["max_split_size"]
print(json.dumps({"s0": s0, "s1": s1, "s2": s2, "m": [m0, m1, m2],
                  "status": allocconf.status().as_dict()}))
"""


def strip(s):
    return {k: v for k, v in s.items()
            if k not in ("expandable_segments", "PYTORCH_CUDA_ALLOC_CONF",
                         "PYTORCH_ALLOC_CONF")}


@pytest.mark.parametrize("var", VARS)
def test_torch_first_settings_unchanged(var):
    out = run_json("""
        import torch
        from helpers.gpu import alloc, settings
        alloc(1)
        s0 = settings(); m0 = torch.cuda.memory_stats()["max_split_size"]
        import allocconf
        s1 = settings(); m1 = torch.cuda.memory_stats()["max_split_size"]
    """, WINDOWS, env={var: USER})
    assert out["s0"]["expandable_segments"] is False
    assert out["s1"]["expandable_segments"] is True
    assert out["s2"]["expandable_segments"] is True
    assert strip(out["s0"]) == strip(out["s1"]) == strip(out["s2"])
    assert out["s0"]["max_split_size"] == 64 << 20
    assert out["s0"]["garbage_collection_threshold"] == 0.6
    assert out["m"] == [64 << 20] * 3
    assert out["status"]["source"] == var


@pytest.mark.parametrize("var", VARS)
def test_allocconf_first_settings_as_the_user_set_them(var):
    baseline = run_json("""
        import torch
        from helpers.gpu import alloc, settings
        alloc(1)
        print(json.dumps(settings()))
    """, env={var: USER})
    out = run_json("""
        import allocconf, torch
        from helpers.gpu import alloc, settings
        alloc(1)
        s0 = None; m0 = None
        s1 = settings(); m1 = torch.cuda.memory_stats()["max_split_size"]
    """, WINDOWS, env={var: USER})
    assert strip(out["s1"]) == strip(baseline) == strip(out["s2"])
    assert out["s1"]["expandable_segments"] is True
    assert out["m"][1:] == [64 << 20] * 2
    last = out["s2"].get("PYTORCH_CUDA_ALLOC_CONF",
                         out["s2"].get("PYTORCH_ALLOC_CONF"))
    assert last == USER + ",expandable_segments:True"
