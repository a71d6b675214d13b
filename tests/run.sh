#!/bin/sh
# tests/run.sh - installs what the tests need, builds kvrail with warnings as
# errors, and runs the whole suite (meson test).  Build dir: build-ci/.
set -e
cd "$(dirname "$0")/.."
tools/install-deps.sh --test
if [ ! -f build-ci/build.ninja ]; then
    meson setup build-ci -Dwerror=true -Dbuildtype=debugoptimized >/dev/null
fi
ninja -C build-ci
meson test -C build-ci --print-errorlogs --num-processes 2 "$@"
