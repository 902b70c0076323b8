"""What the replay check of allocconf.transfer costs (`Sources.still` in
python/allocconf/transfer/_replay.py, docs/design.md, "Replay, then
check"): the check a state dict sent again passes
before its kept copies are announced, in the bucketed and the one-copy
mode alike, and each of its steps alone, for N tensors of a model's
(512 by default) on the GPU where there is one, else on the CPU.

Steps: names and tensor objects (Python, no call on a tensor); the
addresses in one call (torch's CUDA build) or one ``data_ptr()`` each;
dtypes, shapes and strides tensor by tensor (the exact check, the first
replay's); torch's TensorGuards over them in one call (later replays').
Medians of interleaved rounds, microseconds per check.

Usage: python benchmarks/transfer/replay_check.py [--tensors N] [--out DIR]
"""
from __future__ import annotations

import operator
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(sys.path[0]))  # benchmarks/: common.py

from common import interleaved, machine, option, out_dir_arg, save  # noqa: E402

from allocconf.transfer import _replay as R  # noqa: E402


def main() -> None:
    n = int(option("--tensors", "512"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ts = {f"model.layers.{i // 8}.w{i % 8}": torch.empty(
        256, 64, dtype=torch.bfloat16, device=device) for i in range(n)}
    src = R.Sources({})
    for name, t in ts.items():
        src.add(name, t)
    exact = R.Sources({})
    for name, t in ts.items():
        exact.add(name, t)
    assert src.still(ts) and src._guard is not None  # guarded from now on
    tensors = list(ts.values())
    indices = list(range(n))
    guard = src._guard

    def ptrs() -> None:
        if R.PTRS_EQUAL is not None:
            assert R.PTRS_EQUAL(tensors, src.ptrs, indices)
        else:
            assert list(map(torch.Tensor.data_ptr, tensors)) == src.ptrs

    def first() -> None:  # the exact check, then a guard made
        exact._guard = None
        assert exact.still(ts)

    cases = {
        "still, guarded (later replays)": lambda: src.still(ts) or 1 / 0,
        "still, exact then guarded (first replay)": first,
        "names and objects": lambda: (
            list(ts) == src.names
            and all(map(operator.is_, ts.values(), tensors))) or 1 / 0,
        "addresses": ptrs,
        "dtypes, shapes, strides, one call each": lambda: (
            list(map(R.DTYPE, tensors)) == src.dtypes
            and list(map(R.SHAPE, tensors)) == src.shapes
            and list(map(R.STRIDE, tensors)) == src.strides) or 1 / 0,
        "TensorGuards.check": lambda: guard.check(*tensors) or 1 / 0,
    }
    got = interleaved(cases, 50, 21)
    how = ("torch._C._tensors_data_ptrs_at_indices_equal"
           if R.PTRS_EQUAL is not None else "data_ptr() each")
    print(f"{n} tensors on {device}; addresses by {how}")
    for k, s in got.items():
        print(f"  {k:42s} {s * 1e6:8.1f} us")
    save("replay_check", {"machine": machine(), "tensors": n,
                          "device": device, "addresses": how,
                          "us": {k: s * 1e6 for k, s in got.items()}},
         out_dir_arg())


if __name__ == "__main__":
    main()
