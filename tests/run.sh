#!/bin/sh
# tests/run.sh - installs what the tests need, builds kvrail with warnings as
# errors, and runs the whole suite (meson test).  Build dir: build-ci/.
#
# The suite runs with TMPDIR a fresh directory of this run's own, so no test
# sees what an earlier run (or another checkout's run) left in /tmp.  A
# passing test removes its work directory (tests/integration/cluster_lib.py
# workdir(), tests/unit/kvr_test.h kvr_test_mkdtemp()); so after a passing
# run that directory must be empty, and this script fails if it is not (a
# test that fills the disk again).  After a failing run it is kept and named:
# the failed tests' logs are in it (their model weights are not).
set -e
cd "$(dirname "$0")/.."
tools/install-deps.sh --test
if [ ! -f build-ci/build.ninja ]; then
    meson setup build-ci -Dwerror=true -Dbuildtype=debugoptimized >/dev/null
fi
ninja -C build-ci
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvr-suite.XXXXXX")
rc=0
TMPDIR=$run_tmp meson test -C build-ci --print-errorlogs --num-processes 2 "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "run.sh: the suite failed; its tests' TMPDIR kept for diagnosis: $run_tmp" >&2
    exit "$rc"
fi
left=$(find "$run_tmp" -mindepth 1 -maxdepth 2 | head -20)
rm -rf "$run_tmp"
if [ -n "$left" ]; then
    echo "run.sh: the suite passed but its tests left in TMPDIR (each test must remove its" >&2
    echo "work directory when it passes):" >&2
    echo "$left" >&2
    exit 1
fi
