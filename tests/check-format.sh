#!/bin/sh
# check-format.sh - every tracked C source and header is formatted with the
# project's .clang-format (clang-format --dry-run -Werror).
cd "$1" || exit 1
command -v clang-format >/dev/null 2>&1 || { echo "SKIP: clang-format not installed"; exit 77; }
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
[ -n "$files" ] || files=$(find . -path ./build\* -prune -o \( -name '*.c' -o -name '*.h' \) -print)
bad=0
for f in $files; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "not clang-formatted: $f (run: clang-format -i $f)"
        bad=1
    fi
done
exit $bad
