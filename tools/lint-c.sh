#!/usr/bin/env bash
# C hygiene for csrc/ and fuzz/: clang-format (the .clang-format in the
# root) and cppcheck must both be clean.  CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt="${CLANG_FORMAT:-$(command -v clang-format || command -v clang-format-14)}"
"$fmt" --dry-run --Werror csrc/*.[ch] csrc/*/*.[ch] fuzz/*.c
# cppcheck does not read Python.h here (too many configurations); the few
# macros that change control flow are spelled out for it instead.
# Twice: the 3.9-3.12 lock (PyThread) and the 3.13+ one (PyMutex) are
# different code.
for hex in 0x030B0000 0x030D0000; do
    cppcheck --enable=warning,style,performance,portability --inline-suppr \
        --error-exitcode=1 -q -I csrc --suppress=missingIncludeSystem \
        --suppress=missingInclude \
        -D__linux__ -D__unix__ -DPY_VERSION_HEX="$hex" \
        "-DPy_RETURN_NONE=return Py_None" \
        "-DPy_BEGIN_ALLOW_THREADS={" "-DPy_END_ALLOW_THREADS=}" \
        "-DPy_UNUSED(x)=x" \
        csrc/ fuzz/
done
echo "C lint clean"
