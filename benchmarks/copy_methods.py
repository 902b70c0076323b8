"""How to copy many tensors into one flat buffer on the GPU fastest: the
question behind allocconf.transfer's packing (and its receiver's load).

For the weights of --model uniform (8 GiB of bf16 in 512 tensors) and
llama8b (the shapes of an 8B Llama-style model, 15 GiB), each copied into
one classic flat buffer, in the same run:

  foreach      one torch._foreach_copy_ over all the tensors, as bf16
               (not bit for bit: its kernel rounds through float)
  foreach-int  the same over the tensors seen as int64 (bit for bit)
  copy_        one Tensor.copy_ per tensor (cudaMemcpyAsync, device to
               device)
  split:N      copy_ for tensors of at least N bytes, one _foreach_copy_
               as int64 for the smaller ones (allocconf.transfer's way)
  reference    one copy_ of a single tensor of the same total bytes

Each is checked (the buffer zeroed, copied once, compared), then timed:
median of 5 after one warm-up; GB/s counts the bytes copied.  Writes
copy_methods.json.

Usage: python benchmarks/copy_methods.py [--out DIR]
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import allocconf  # noqa: E402  (the weights in expandable segments)
import torch  # noqa: E402

from common import cuda_median, machine, out_dir_arg, save  # noqa: E402
from ipc_sync import llama8b_shapes  # noqa: E402

GiB = 1 << 30
SPLITS = [4 << 20, 16 << 20, 32 << 20, 64 << 20]


def methods(src: List[torch.Tensor], dst: List[torch.Tensor],
            flat: torch.Tensor, whole: torch.Tensor
            ) -> Dict[str, Callable[[], None]]:
    def foreach() -> None:
        torch._foreach_copy_(dst, src)

    def as_int(ts: List[torch.Tensor]) -> List[torch.Tensor]:
        return [t.view(-1).view(torch.int64) for t in ts]

    def foreach_int() -> None:
        torch._foreach_copy_(as_int(dst), as_int(src))

    def each() -> None:
        for d, s in zip(dst, src):
            d.copy_(s)

    def split(n: int) -> Callable[[], None]:
        big = [(d, s) for d, s in zip(dst, src)
               if s.numel() * s.element_size() >= n]
        small = [(d, s) for d, s in zip(dst, src)
                 if s.numel() * s.element_size() < n]

        def run() -> None:
            for d, s in big:
                d.copy_(s)
            if small:
                torch._foreach_copy_(as_int([d for d, _ in small]),
                                     as_int([s for _, s in small]))
        return run

    out = {"foreach": foreach, "foreach-int": foreach_int, "copy_": each}
    out.update({f"split:{n >> 20}MiB": split(n) for n in SPLITS})
    out["reference"] = lambda: flat.copy_(whole)
    return out


def main() -> None:
    uniform = [(8 * GiB // 512 // 2,)] * 512
    llama = [shape for _, shape in llama8b_shapes()]
    record: Dict[str, object] = {"machine": machine()}
    for model, shapes in (("uniform", uniform), ("llama8b", llama)):
        src = [torch.full(s, 1.0, dtype=torch.bfloat16, device="cuda")
               for s in shapes]
        n = sum(t.numel() for t in src)
        with allocconf.ipc_safe():  # the buffer in classic memory
            flat = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        whole = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        dst = [v.view(t.shape) for v, t in
               zip(flat.split([t.numel() for t in src]), src)]
        nbytes = n * 2
        figures = {}
        for name, fn in methods(src, dst, flat, whole).items():
            flat.zero_()
            fn()
            assert torch.equal(flat, whole), name  # it copied everything
            s = cuda_median(fn)
            figures[name] = {"ms": s * 1e3, "gbps": nbytes / s / 1e9}
            print(f"{model:<8} {len(src):4d} tensors {nbytes / GiB:5.2f} GiB "
                  f"{name:<14} {s * 1e3:7.2f} ms {nbytes / s / 1e9:7.0f} GB/s",
                  flush=True)
        record[model] = {"tensors": len(src), "gib": nbytes / GiB,
                         "methods": figures}
        del src, flat, whole, dst
        torch.cuda.empty_cache()
    save("copy_methods", record, out_dir_arg())


if __name__ == "__main__":
    main()
