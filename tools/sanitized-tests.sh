#!/usr/bin/env bash
# Run the CPU test suite against allocconf._C built with AddressSanitizer
# and UndefinedBehaviorSanitizer (gcc's runtimes, preloaded so that the
# uninstrumented Python can load the instrumented extension).  Any report
# aborts the process that made it, so the tests fail.  Rebuilds the
# normal extension afterwards.
#
# Usage: tools/sanitized-tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
cc="${CC:-gcc}"

rebuild() {
    rm -f python/allocconf/_C*.so
    env "$@" "$py" setup.py -q build_ext --inplace --force
}
trap 'rebuild ALLOCCONF_WERROR=1 >/dev/null' EXIT

rebuild ALLOCCONF_WERROR=1 ALLOCCONF_DEBUG_BUILD=1 \
    ALLOCCONF_SANITIZE=address,undefined
# Not `nm | grep -q`: grep stops at the first match, nm dies of SIGPIPE,
# and pipefail would call the check failed.
symbols="$(nm -D python/allocconf/_C*.so)"
grep -q __asan_report <<<"$symbols" \
    || { echo "the extension is not instrumented" >&2; exit 1; }
preload="$("$cc" -print-file-name=libasan.so) $("$cc" -print-file-name=libubsan.so)"
# detect_leaks=0: the interpreter itself "leaks" at exit; tests/test_leaks.py
# checks allocconf's own memory.
LD_PRELOAD="$preload" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$py" -m pytest -q -p no:cacheprovider "$@"
