#!/usr/bin/env bash
# Prove allocconf's promises on a machine with a CUDA GPU, in one command:
# build the extension here, run the GPU suite (pytest -m gpu), print the
# report, and (with --bench) run every benchmark.  Logs go to OUT_DIR.
#
# Usage: tools/gpu-check.sh [OUT_DIR] [--bench] [--only-bench]
#   OUT_DIR defaults to $OUT, else ./gpu-check-out.
# Wheels in .whl/ (torch_memory_saver: pip download --no-deps
# torch-memory-saver==0.0.10 -d .whl) are installed for the suite.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
bench=0
tests=1
for a in "$@"; do
    case "$a" in
        --bench) bench=1 ;;
        --only-bench) bench=1; tests=0 ;;
        -*) echo "unknown option $a" >&2; exit 2 ;;
        *) out="$a" ;;
    esac
done
mkdir -p "$out"
export PYTHONUNBUFFERED=1

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader | sed 's/^/gpu: /'
    python3 -c 'import sys, torch; print("torch:", torch.__version__, "cuda", torch.version.cuda); print("python:", sys.version.split()[0])'
    uname -r | sed 's/^/kernel: /'
} 2>&1 | tee "$out/versions.txt"

# Build strictly; fall back to an in-place build where pip cannot install.
if ! ALLOCCONF_WERROR=1 python3 -m pip install -q --no-build-isolation \
        --no-deps -e . > "$out/build.log" 2>&1; then
    cat "$out/build.log"
    ALLOCCONF_WERROR=1 python3 setup.py -q build_ext --inplace || exit 1
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
fi
rm -f "$out/build.log"

# Neighbours the GPU suite runs next to (tests/gpu/test_torch_memory_saver.py):
# wheels carried in .whl/ (the machine has no network), installed aside.
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

rc=0
if [ "$tests" = 1 ]; then
    python3 -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider 2>&1 \
        | tee "$out/gpu-suite.log"
    rc=${PIPESTATUS[0]}
    python3 -m allocconf 2>&1 | tee "$out/report.txt"
fi
if [ "$bench" = 1 ]; then
    python3 benchmarks/run_all.py --out "$out" 2>&1 | tee "$out/bench.log"
fi
exit "$rc"
