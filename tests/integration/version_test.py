#!/usr/bin/env python3
"""version_test.py: every kvrail binary answers --version and --help.

usage: version_test.py PROJECT_VERSION SOURCE_ROOT BINARY...

For each binary: `--version` exits 0 and prints exactly one line
"NAME VERSION (git REVISION)" where NAME is the binary's file name and VERSION
meson's project version; `--help` exits 0 and prints a usage line naming the
binary on stdout.  Every binary carries the same REVISION (one generated
header); in a git checkout with git installed the revision, less a trailing
'+' (a dirty tree), names a commit of the repository, otherwise it is
"unknown".  The revision is not compared with HEAD: others may commit
between the build and this test.
"""
import os
import re
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    if len(sys.argv) < 4:
        fail(__doc__)
    version, root, bins = sys.argv[1], sys.argv[2], sys.argv[3:]
    revs = set()
    for b in bins:
        name = os.path.basename(b)
        p = subprocess.run([b, "--version"], capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            fail("%s --version: exit %d, stderr %r" % (name, p.returncode, p.stderr))
        m = re.fullmatch(r"(\S+) (\S+) \(git (\S+)\)\n", p.stdout)
        if not m:
            fail("%s --version printed %r, want 'NAME VERSION (git REV)'" % (name, p.stdout))
        if m.group(1) != name or m.group(2) != version:
            fail("%s --version printed %r, want name %s version %s" % (name, p.stdout, name, version))
        revs.add(m.group(3))
        h = subprocess.run([b, "--help"], capture_output=True, text=True, timeout=30)
        if h.returncode != 0:
            fail("%s --help: exit %d, stderr %r" % (name, h.returncode, h.stderr))
        first = h.stdout.splitlines()[0] if h.stdout else ""
        if not first.startswith("usage: ") or name not in first:
            fail("%s --help: first line %r is not a usage line naming the binary" % (name, first))
        print("%s: %s" % (name, p.stdout.strip()))
    if len(revs) != 1:
        fail("binaries disagree on the revision: %s" % sorted(revs))
    rev = revs.pop()
    git = shutil.which("git")
    in_git = git and subprocess.run([git, "-C", root, "rev-parse", "--git-dir"],
                                    capture_output=True).returncode == 0
    if not in_git:
        if rev != "unknown":
            fail("outside git the revision should be 'unknown', got %r" % rev)
        return 0
    commit = rev[:-1] if rev.endswith("+") else rev
    if not re.fullmatch(r"[0-9a-f]{7,40}|.+-g[0-9a-f]{7,40}", commit):
        fail("revision %r is not a git describe of a commit" % rev)
    ok = subprocess.run([git, "-C", root, "cat-file", "-e", commit + "^{commit}"],
                        capture_output=True).returncode == 0
    if not ok:
        fail("revision %r names no commit of %s" % (rev, root))
    print("revision %s is a commit of %s" % (rev, root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
