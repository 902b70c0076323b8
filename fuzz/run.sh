#!/usr/bin/env bash
# Build the grammar fuzzer with clang (libFuzzer, ASan, UBSan) and run it.
# Usage: fuzz/run.sh [SECONDS]   (default 60); fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
cc="${CLANG:-$(command -v clang || command -v clang-16 || command -v clang-14)}"
"$cc" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Icsrc fuzz/fuzz_conf.c csrc/grammar/*.c -o fuzz/fuzz_conf
mkdir -p fuzz/corpus-work
./fuzz/fuzz_conf -max_total_time="$seconds" -max_len=4096 -timeout=5 \
    -print_final_stats=1 fuzz/corpus-work fuzz/corpus
