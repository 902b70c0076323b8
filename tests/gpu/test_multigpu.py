"""Two GPUs: trainer on GPU 0 to receiver on GPU 1 through CUDA
IPC, and torchrun with two NCCL ranks.  Skipped with fewer than 2 GPUs."""
import pytest

from helpers import run_json
from test_dist import USER, run_torchrun

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def test_trainer_gpu0_to_receiver_gpu1_bit_for_bit():
    out = run_json("""
        import hashlib
        import allocconf, torch
        import torch.multiprocessing as mp
        from helpers.gpu import expandable, mp_copy_to_device_and_hash

        weights = [torch.randn(1 << 22, device="cuda:0").bfloat16()
                   for _ in range(64)]
        sizes = [w.numel() for w in weights]
        with allocconf.ipc_safe():
            flat = torch.empty(sum(sizes), dtype=torch.bfloat16,
                               device="cuda:0")
        torch._foreach_copy_(list(flat.split(sizes)), weights)
        torch.cuda.synchronize()
        want = hashlib.sha256(flat.view(torch.int16).cpu().numpy()
                              .tobytes()).hexdigest()
        ctx = mp.get_context("spawn")
        q, done = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=mp_copy_to_device_and_hash, args=(q, done, 1))
        p.start()
        q.put(flat)
        got = done.get(timeout=300)
        p.join(timeout=120)
        print(json.dumps({"same": got == want, "exitcode": p.exitcode,
                          "weights_expandable": expandable(weights[0]),
                          "flat_expandable": expandable(flat)}))
    """, timeout=600)
    assert out == {"same": True, "exitcode": 0, "weights_expandable": True,
                   "flat_expandable": False}


@pytest.mark.parametrize("order", ["allocconf-first", "torch-first"])
def test_two_nccl_ranks(tmp_path, order):
    for r in run_torchrun(tmp_path, order, "nccl",
                          extra_env={"NCCL_NVLS_ENABLE": "0"}):
        assert r["allreduce_ok"] and r["window_ok"]
        assert r["x_expandable"] is True
        assert r["y_expandable"] is False
        assert r["status"]["window_depth"] == 0
        assert r["environ_unchanged"] is True
        assert r["child_env"]["PYTORCH_CUDA_ALLOC_CONF"] == USER
