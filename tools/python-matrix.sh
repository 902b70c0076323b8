#!/usr/bin/env bash
# Build the extension with -Werror on every Python from 3.9 to 3.13 this
# machine has (pyenv's, or python3.X on PATH) and run the tests that need
# no torch build there: the grammar, and the hook, windows, locks, fork
# and neighbour logic against tests/standin/torch.  This is what compiles
# and runs the 3.13 PyMutex lock path and the 3.9 paths.
#
# Usage: tools/python-matrix.sh [VERSION...]   (default: 3.9 ... 3.13)
set -uo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ "${#versions[@]}" -gt 0 ] || versions=(3.9 3.10 3.11 3.12 3.13)
root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
work="$(mktemp -d)"
failed=()
found=0
for v in "${versions[@]}"; do
    py="$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -1)"
    [ -n "$py" ] || py="$(command -v "python$v" || true)"
    if [ -z "$py" ]; then
        echo "=== Python $v: not on this machine, skipped"
        continue
    fi
    found=$((found + 1))
    echo "=== Python $v ($py)"
    venv="$work/venv$v"
    lib="$work/lib$v"
    # The extension is built into $lib, next to a copy of the package:
    # nothing lands in the tree but build/matrix$v.
    if ! { "$py" -m venv "$venv" &&
           "$venv/bin/python" -m pip install -q --upgrade pip setuptools \
               wheel pytest &&
           ALLOCCONF_WERROR=1 "$venv/bin/python" setup.py -q build_ext \
               --force --build-temp "build/matrix$v" --build-lib "$lib" &&
           cp python/allocconf/*.py python/allocconf/*.pyi \
               python/allocconf/py.typed "$lib/allocconf/"; }; then
        failed+=("$v (build)")
        continue
    fi
    if ! PYTHONPATH="$lib" "$venv/bin/python" -c \
            'import sys, allocconf._C as c; assert c.__file__.startswith(sys.argv[1])' \
            "$lib"; then
        failed+=("$v (import)")
        continue
    fi
    if ! PYTHONPATH="$lib" "$venv/bin/python" -m pytest -q \
            -p no:cacheprovider tests/test_grammar.py tests/test_standin_torch.py; then
        failed+=("$v (tests)")
    fi
done
rm -rf "$work"
[ "$found" -gt 0 ] || { echo "no Python 3.9-3.13 found"; exit 1; }
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"; exit 1
fi
echo "Python matrix passed ($found interpreters)"
