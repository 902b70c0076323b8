"""allocconf next to the real torch_memory_saver (docs/neighbours.md).

torch_memory_saver 0.0.10 in its "preload" hook mode (LD_PRELOAD, SGLang's
default) sees only cudaMalloc: with expandable segments on, a region's
memory lands in an expandable segment and pause() frees nothing
(docs/gpu-validation.md).  allocconf's default steps back when it is in the process, so the
whole region comes back.  Each case allocates 8 GiB in a region in a fresh
process, pauses, resumes, and reads the device's free memory from
``torch.cuda.mem_get_info()``.  Skipped where torch_memory_saver is not
installed (tools/gpu-check.sh installs the wheel carried in .whl/).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

SPEC = importlib.util.find_spec("torch_memory_saver")
pytestmark = pytest.mark.skipif(SPEC is None,
                                reason="torch_memory_saver not installed")
GIB = 1 << 30

SCRIPT = """
import json, sys
{imports}
from torch_memory_saver import torch_memory_saver as tms
tms.hook_mode = {mode!r}
torch.empty(1, device="cuda")
torch.cuda.synchronize()
free = lambda: torch.cuda.mem_get_info()[0]
f0 = free()
with tms.region():
    x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
x.fill_(7)
torch.cuda.synchronize()
f1 = free()
tms.pause()
f2 = free()
tms.resume()
f3 = free()
x.fill_(3)
ok = bool((x[:: 1 << 20] == 3).all())
segs = [s for s in torch.cuda.memory_snapshot()
        if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
st = allocconf.status()
print(json.dumps({{"taken": f0 - f1, "freed": f2 - f1, "back": f2 - f3,
                  "ok": ok, "expandable": [s.get("is_expandable") for s in segs],
                  "neighbours": list(st.neighbours), "reason": st.reason}}),
      flush=True)
# torch_memory_saver's "torch" hook mode asserts when its pool's memory is
# freed outside a region, which interpreter teardown does (its own
# behaviour, with or without allocconf): leave without tearing down.
import os; os._exit(0)
"""

ORDERS = {
    "allocconf first": "import warnings; warnings.simplefilter('ignore')\n"
                       "import allocconf, torch",
    # torch and CUDA up before allocconf arrives.
    "torch and CUDA first": "import warnings; warnings.simplefilter('ignore')\n"
                            "import torch; torch.empty(1, device='cuda')\n"
                            "import allocconf",
}


def preload_library() -> str:
    root = os.path.dirname(os.path.dirname(SPEC.origin))
    found = glob.glob(os.path.join(
        root, "torch_memory_saver_hook_mode_preload_cu13.abi3.so"))
    assert found, f"no preload library under {root}"
    return found[0]


def run(mode: str, order: str, extra_env=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTORCH_", "ALLOCCONF_"))}
    if mode == "preload":
        env["LD_PRELOAD"] = preload_library()
    env.update(extra_env or {})
    code = SCRIPT.format(imports=ORDERS[order], mode=mode)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{mode:8s} {order:22s} {extra_env or ''}: taken "
          f"{out['taken'] / GIB:.2f} GiB, pause freed {out['freed'] / GIB:.2f}"
          f" GiB, resume took back {out['back'] / GIB:.2f} GiB, expandable "
          f"{out['expandable']}")
    return out


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("mode", ["preload", "torch"])
def test_pause_frees_the_whole_region(mode, order):
    out = run(mode, order)
    assert out["taken"] >= 8 * GIB
    assert out["freed"] >= 8 * GIB, out  # all 8 GiB come back
    assert out["back"] >= 8 * GIB, out   # and resume() takes them again
    assert out["ok"] is True
    assert out["expandable"] == [False]
    assert out["neighbours"] == ["torch_memory_saver"]
    assert "stepped back for torch_memory_saver" in out["reason"]


def test_without_the_step_back_preload_mode_frees_nothing():
    # The failure the step-back prevents (docs/neighbours.md), with allocconf told
    # to keep its default on.
    out = run("preload", "allocconf first", {"ALLOCCONF_STEP_BACK": "0"})
    assert out["expandable"] == [True]
    assert out["freed"] < 1 * GIB, out


NESTED = """
import json, os
import allocconf, torch
from torch_memory_saver import torch_memory_saver as tms
tms.hook_mode = "torch"
torch.empty(1, device="cuda")
got = {}
with tms.region():
    with allocconf.ipc_safe():
        window_in_region = torch.empty(8 << 20, dtype=torch.uint8,
                                       device="cuda")
with allocconf.ipc_safe():
    with tms.region():
        region_in_window = torch.empty(8 << 20, dtype=torch.uint8,
                                       device="cuda")
    after_region = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
print(json.dumps({
    "scope": allocconf.status().window_scope,
    "window_in_region": allocconf.ipc_capable(window_in_region),
    "region_in_window": allocconf.ipc_capable(region_in_window),
    "after_region": allocconf.ipc_capable(after_region)}), flush=True)
os._exit(0)  # torch_memory_saver's torch mode asserts at teardown
"""


def test_pool_contexts_nest_innermost_wins():
    # A window opened inside a torch_memory_saver region (torch hook mode:
    # its own MemPool) and a region opened inside a window: torch routes
    # to the innermost pool context (docs/neighbours.md).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTORCH_", "ALLOCCONF_"))}
    proc = subprocess.run([sys.executable, "-c", NESTED], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"scope": "opener", "window_in_region": True,
                   "region_in_window": False, "after_region": True}
