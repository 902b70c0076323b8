"""Classic CUDA IPC and the driver's answers: memory allocated inside
ipc_safe() goes through classic CUDA IPC to another process, and the
driver tells shareable from expandable memory."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu


def test_torch_multiprocessing_spawn_child_reads_exact_values():
    out = run_json("""
        import allocconf, torch
        from helpers.gpu import arange_seen_by_spawned_child, expandable

        with allocconf.ipc_safe():
            t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
        same, exitcode = arange_seen_by_spawned_child(t)
        print(json.dumps({"same": same, "exitcode": exitcode,
                          "expandable": expandable(t),
                          "ipc_capable": allocconf.ipc_capable(t)}))
    """, timeout=300)
    assert out == {"same": True, "exitcode": 0, "expandable": False,
                   "ipc_capable": True}


REBUILD_CHILD = (
    "import base64, hashlib, pickle, sys, torch\n"
    "func, args = pickle.loads(base64.b64decode(sys.stdin.read()))\n"
    "t = func(*args)\n"
    "print(hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest())\n"
)


def test_reduce_tensor_to_a_child_process():
    out = run_json(f"""
        import base64, hashlib, pickle, subprocess
        import allocconf, torch
        from torch.multiprocessing.reductions import reduce_tensor
        from helpers.gpu import expandable

        with allocconf.ipc_safe():
            t = torch.randn(1 << 20, device="cuda")
        func, args = reduce_tensor(t)
        blob = base64.b64encode(pickle.dumps((func, args))).decode()
        got = subprocess.run([sys.executable, "-c", {REBUILD_CHILD!r}],
                             input=blob, capture_output=True, text=True,
                             timeout=120)
        want = hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()
        print(json.dumps({{"same": got.stdout.strip() == want,
                           "stderr": got.stderr[-500:],
                           "expandable": expandable(t),
                           "ipc_capable": allocconf.ipc_capable(t)}}))
    """, timeout=300)
    assert out["same"] is True, out["stderr"]
    assert out["expandable"] is False
    assert out["ipc_capable"] is True


def test_driver_tells_expandable_from_shareable_and_check_ipc_names_it():
    out = run_json("""
        import allocconf, torch
        outside = torch.empty(16 << 20, device="cuda")
        with allocconf.ipc_safe():
            inside = torch.empty(16 << 20, device="cuda")
        try:
            allocconf.check_ipc({"inside": inside, "outside": outside})
            named = None
        except ValueError as exc:
            named = str(exc)
        try:
            allocconf.check_ipc([inside, inside[1:], outside])
            positional = None
        except ValueError as exc:
            positional = str(exc)
        print(json.dumps({"outside": allocconf.ipc_capable(outside),
                          "inside": allocconf.ipc_capable(inside),
                          "view": allocconf.ipc_capable(inside[1000:]),
                          "ok": allocconf.check_ipc([inside]),
                          "named": named, "positional": positional}))
    """)
    assert out["outside"] is False
    assert out["inside"] is True
    assert out["view"] is True
    assert out["ok"] is None
    assert "1 of 2 items" in out["named"]
    assert "'outside' (float32[16777216] on cuda:0: in an expandable" in (
        out["named"])
    assert "'inside'" not in out["named"]
    assert "ipc_safe() window" in out["named"]
    assert "1 of 3 items" in out["positional"]
    assert "#2 (float32" in out["positional"]
