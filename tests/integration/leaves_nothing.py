#!/usr/bin/env python3
"""leaves_nothing.py CMD [ARG...] - runs a test with TMPDIR a fresh empty
directory of its own and fails it if, having passed (0) or skipped (77), it
left anything there.

meson runs a few real tests through this (see meson.build) so that a test
suite which fills /tmp again (work directories never removed: the defect
cluster_lib.workdir() and kvr_test_mkdtemp() fix) fails a test instead of a
disk.  The directory is this run's alone, so tests running in parallel
cannot make it fail.  A failed test keeps its work directory there for
diagnosis; then this directory is kept too, and named.
"""
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) < 2:
        print("usage: leaves_nothing.py CMD [ARG...]", file=sys.stderr)
        return 2
    cmd = sys.argv[1:]
    if cmd[0].endswith(".py"):  # a test script: run by this Python, as meson would
        cmd.insert(0, sys.executable)
    tmp = tempfile.mkdtemp(prefix="kvr-leaves-nothing-")
    env = dict(os.environ, TMPDIR=tmp)
    env.pop("KVR_KEEP_WORKDIR", None)  # the test's own policy, not a keep-all
    try:
        rc = subprocess.call(cmd, env=env)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    left = []
    for root, dirs, files in os.walk(tmp):
        left += [os.path.relpath(os.path.join(root, n), tmp) for n in dirs + files]
    if rc not in (0, 77):
        if left:
            print("leaves_nothing: the test failed (exit %d); its TMPDIR kept: %s" % (rc, tmp),
                  file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return rc
    shutil.rmtree(tmp, ignore_errors=True)
    if left:
        print("FAIL: the test %s (exit %d) but left in its TMPDIR: %s" % (
            "passed" if rc == 0 else "skipped", rc, ", ".join(sorted(left)[:20])),
            file=sys.stderr)
        return 1
    print("leaves_nothing: exit %d, nothing left in TMPDIR" % rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
