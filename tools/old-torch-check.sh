#!/usr/bin/env bash
# Run the CPU test suite against an older torch from PyPI, in a virtual
# environment of its own: proves the 2.1-2.9 setter path
# (torch._C._cuda_cudaCachingAllocator_set_allocator_settings, CUDA builds)
# on a machine without a GPU.  Tests that need torch 2.13+'s getter skip
# with a reason.  PyPI's Linux torch wheels are CUDA builds: about 4 GB.
#
# Usage: tools/old-torch-check.sh [TORCH_VERSION] [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-2.6.0}"
venv="${2:-/tmp/allocconf-torch-$version}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==$version" numpy pytest
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests
