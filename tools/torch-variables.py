"""Which of PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF and
PYTORCH_ALLOC_CONF does this torch read, and in what order?  Runs on a
machine without a GPU (docs/compatibility.md has the answers per version).

Two of torch's configurations answer, each in a fresh interpreter:

- the CUDA allocator's own (CUDA builds): `backend` is parsed from the
  variable it reads at `import torch`, and torch.cuda.get_allocator_backend()
  says which backend it chose;
- the generic one that holds expandable_segments on torch 2.10+: its getter,
  torch._C._accelerator_getAllocatorSettings() (2.13+), returns the
  variable's string.

Usage: python tools/torch-variables.py   (with the torch to ask on the path)
"""
import os
import subprocess
import sys

VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF")
CODE = """
import torch
b = torch.cuda.get_allocator_backend() if torch.version.cuda else "-"
g = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
print(b, repr(g()) if g else "-")
"""


def ask(values):
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env.update(values)
    p = subprocess.run([sys.executable, "-c", CODE], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return f"exit {p.returncode}"
    return p.stdout.strip()


def main():
    version = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True).stdout.strip()
    print(f"torch {version}: backend chosen | generic getter")
    # Each variable alone, then each pair both ways: the one torch reads
    # first decides.  Values tell the variables apart.
    for name in VARS:
        print(f"  {name} alone: "
              f"{ask({name: 'backend:cudaMallocAsync'})}")
    for i, a in enumerate(VARS):
        for b in VARS[i + 1:]:
            for first, second in ((a, b), (b, a)):
                got = ask({first: "backend:cudaMallocAsync",
                           second: "backend:native"})
                print(f"  {first}=cudaMallocAsync, {second}=native: {got}")
    for name in VARS:
        others = {n: "backend:cudaMallocAsync" for n in VARS if n != name}
        print(f"  {name} empty, the others cudaMallocAsync: "
              f"{ask({**others, name: ''})}")
    for name in VARS:
        print(f"  {name} with an unclosed bracket: "
              f"{ask({name: 'roundup_power2_divisions:[256:1'})}")


if __name__ == "__main__":
    main()
