"""One rank of a torchrun job (tests/test_dist.py, tests/gpu/test_multigpu.py).

Environment: ALLOCCONF_TEST_ORDER=allocconf-first|torch-first,
ALLOCCONF_TEST_BACKEND=gloo|nccl, ALLOCCONF_TEST_OUT=<dir>.  Writes
<dir>/rank<R>.json with what the rank saw.
"""
import json
import os
import subprocess
import sys

if os.environ["ALLOCCONF_TEST_ORDER"] == "allocconf-first":
    import allocconf
    import torch
else:
    import torch
    import allocconf
import torch.distributed as dist

backend = os.environ["ALLOCCONF_TEST_BACKEND"]
env_before = dict(os.environ)
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
cuda = backend == "nccl"
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
device = torch.device("cuda") if cuda else torch.device("cpu")
n = (1 << 30) // 4 if cuda else (1 << 20)  # 1 GiB of float32 on GPUs

x = torch.full((n,), float(rank + 1), device=device)
dist.all_reduce(x)
want = world * (world + 1) / 2
allreduce_ok = bool((x == want).all().item())
with allocconf.ipc_safe():  # a window around a collective
    y = torch.full((1 << 20,), 1.0, device=device)
    dist.all_reduce(y)
window_ok = bool((y == world).all().item())

out = {"rank": rank, "allreduce_ok": allreduce_ok, "window_ok": window_ok,
       "status": allocconf.status().as_dict(),
       "environ_unchanged": dict(os.environ) == env_before}
if cuda:
    from helpers.gpu import expandable
    out["x_expandable"] = expandable(x)
    out["y_expandable"] = expandable(y)
# A child that does not import allocconf starts with the user's settings.
child = subprocess.run(
    [sys.executable, "-c",
     "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
     "('PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_ALLOC_CONF')}))"],
    capture_output=True, text=True, check=True)
out["child_env"] = json.loads(child.stdout)
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(os.environ["ALLOCCONF_TEST_OUT"], f"rank{rank}.json"),
          "w") as f:
    json.dump(out, f)
