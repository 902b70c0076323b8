"""The import-order guarantee (docs/import-order.md): in every import order, new CUDA memory
lands in expandable segments; the user's settings survive."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

CHECK = """
import allocconf
from helpers.gpu import alloc, expandable
b = alloc(64)
print(json.dumps({"expandable": expandable(b),
                  "status": allocconf.status().as_dict(),
                  "initialized_before": initialized_before}))
"""

ORDERS = {
    "allocconf-then-torch": """
        import allocconf, torch
        initialized_before = torch.cuda.is_initialized()
    """,
    "torch-then-allocconf": """
        import torch
        import allocconf
        initialized_before = torch.cuda.is_initialized()
    """,
    "after-cuda-init": """
        import torch
        torch.cuda.init()
        initialized_before = torch.cuda.is_initialized()
        import allocconf
    """,
    "after-first-allocation": """
        import torch
        from helpers.gpu import alloc, expandable
        first = alloc(64)
        assert not expandable(first)
        initialized_before = torch.cuda.is_initialized()
        import allocconf
    """,
    "torch-imported-in-a-thread": """
        import threading
        import allocconf
        t = threading.Thread(target=lambda: __import__("torch"))
        t.start(); t.join()
        import torch
        initialized_before = torch.cuda.is_initialized()
    """,
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_new_allocations_are_expandable(order):
    out = run_json(ORDERS[order], CHECK)
    assert out["expandable"] is True
    st = out["status"]
    assert st["applied"] is True
    assert st["expandable_segments"] is True
    assert st["api"] == "torch._C._accelerator_setAllocatorSettings"
    # allocconf itself never initialised CUDA.
    assert out["initialized_before"] is (order in ("after-cuda-init",
                                                   "after-first-allocation"))
    assert "CPU-only" not in st["reason"]


def test_ipc_safe_window_then_expandable_again():
    out = run_json("""
        import allocconf, torch
        from helpers.gpu import alloc, expandable
        before = alloc(64)
        with allocconf.ipc_safe():
            inside = alloc(64)
        after = alloc(64)
        print(json.dumps([expandable(before), expandable(inside),
                          expandable(after)]))
    """)
    assert out == [True, False, True]


def test_max_split_size_survives_activation_and_1000_windows():
    out = run_json("""
        import allocconf, torch
        from helpers.gpu import alloc
        alloc(1)
        first = torch.cuda.memory_stats()["max_split_size"]
        for _ in range(1000):
            with allocconf.ipc_safe():
                pass
        after = torch.cuda.memory_stats()["max_split_size"]
        print(json.dumps([first, after, allocconf.status().config]))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == [67108864, 67108864,
                   "max_split_size_mb:64,expandable_segments:True"]


def test_without_allocconf_the_setter_alone_loses_max_split_size():
    # The trap allocconf exists for (docs/design.md, "What torch does with
    # a write"), on this torch: a bare write
    # before CUDA starts resets the user's max_split_size_mb.
    out = run_json("""
        import torch
        from helpers.gpu import alloc, settings
        torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
        alloc(1)
        print(json.dumps([torch.cuda.memory_stats()["max_split_size"],
                          settings()["max_split_size"]]))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out[0] == -1
    assert out[1] != 64 << 20
