#!/usr/bin/env python3
"""container_test.py - the runtime stage of deploy/container/Containerfile,
built without an image registry.

mmdebstrap makes a Debian 12 rootfs from the Debian archive (no image pull)
with exactly deploy/container/runtime-packages.txt, the list the
Containerfile's runtime stage installs; `meson install` puts this build into
it (the build stage's step) with the entry point.  Asserts, chrooted into the
rootfs: ldd finds every shared library of every installed binary (the
runtime list is complete); the entry point's `--version` prints this
project's version; `kvrail-mkmodel` then `kvrail run` on the tiny model gives
the same tokens as `kvrail run` on this machine.  Prints the rootfs size
(what the runtime image holds).  The rootfs is cached in the build dir, keyed
by the package list.  The build stage itself (install-deps.sh on
debian:12, meson) is what every build of this repository runs.

Exits 77 when mmdebstrap is missing, this is not root (chroot), or the Debian
archive cannot be reached (mmdebstrap's error is printed).

usage: container_test.py --src DIR --build DIR --kvrail BIN --work DIR
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Fail, check, reap_all, run  # noqa: E402


def mirror():
    try:
        with open("/etc/apt/sources.list.d/debian.sources") as f:
            m = re.search(r"^URIs:\s*(\S+/debian)\s*$", f.read(), re.M)
            if m:
                return m.group(1)
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def chroot(root, argv, timeout=120):
    return run([shutil.which("chroot") or "/usr/sbin/chroot", root] + argv, timeout=timeout,
               env={"PATH": "/usr/local/bin:/usr/bin:/bin", "KVR_LOG_LEVEL": "warn",
                    "LD_LIBRARY_PATH": ""})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    if not shutil.which("mmdebstrap"):
        print("SKIP: mmdebstrap not installed (tools/install-deps.sh --test installs it)")
        return 77
    if os.geteuid() != 0:
        print("SKIP: chroot into the rootfs needs root")
        return 77
    cdir = os.path.join(a.src, "deploy", "container")
    with open(os.path.join(cdir, "runtime-packages.txt")) as f:
        pkgs = [x.strip() for x in f if x.strip() and not x.startswith("#")]
    cf = open(os.path.join(cdir, "Containerfile")).read()
    check("runtime-packages.txt" in cf and "debian:12" in cf and "install-deps.sh" in cf,
          "the Containerfile does not use runtime-packages.txt / debian:12 / install-deps.sh")
    os.makedirs(a.work, exist_ok=True)
    key = hashlib.sha256(("\n".join(pkgs) + mirror()).encode()).hexdigest()[:16]
    cache = os.path.join(a.work, "rootfs-%s" % key)
    if not os.path.exists(cache):
        shutil.rmtree(cache + ".part", ignore_errors=True)
        r = run(["mmdebstrap", "--variant=essential", "--format=directory",
                 "--include=" + ",".join(pkgs), "bookworm", cache + ".part", mirror()], timeout=900)
        if r.returncode != 0:
            if run(["sh", "-c", "getent hosts %s" % mirror().split("/")[2]], timeout=30).returncode:
                print("SKIP: the Debian archive %s cannot be reached:\n%s" % (mirror(),
                                                                             r.stderr[-800:]))
                return 77
            print("FAIL: mmdebstrap:\n" + r.stderr[-2000:])
            return 1
        os.rename(cache + ".part", cache)
    root = tempfile.mkdtemp(prefix="kvr-rootfs-")
    try:
        r = run(["cp", "-a", cache + "/.", root], timeout=300)
        check(r.returncode == 0, "copying the cached rootfs: %s" % r.stderr)
        size = run(["du", "-sm", "--exclude=usr/local", root], timeout=60).stdout.split()[0]
        r = run(["meson", "install", "-C", a.build, "--destdir", root, "--no-rebuild", "--quiet"],
                timeout=120)
        check(r.returncode == 0, "meson install into the rootfs: %s" % r.stderr)
        shutil.copy(os.path.join(cdir, "entrypoint.sh"), os.path.join(root, "usr/bin/kvrail-entrypoint"))
        total = run(["du", "-sm", root], timeout=60).stdout.split()[0]
        check(chroot(root, ["/sbin/ldconfig"]).returncode == 0, "ldconfig in the rootfs failed")
        bins = sorted(os.listdir(os.path.join(root, "usr/local/bin")))
        check("kvrail" in bins and "kvrail-router" in bins, "installed binaries: %s" % bins)
        for b in bins:
            r = chroot(root, ["ldd", "/usr/local/bin/" + b])
            check(r.returncode == 0 and "not found" not in r.stdout,
                  "%s in the runtime rootfs: %s%s" % (b, r.stdout, r.stderr))
        print("runtime rootfs (%d packages): ldd resolves every library of %s" % (
            len(pkgs), ", ".join(bins)))
        r = chroot(root, ["/usr/bin/kvrail-entrypoint", "--version"])
        want = run([a.kvrail, "--version"], timeout=30).stdout
        check(r.returncode == 0 and r.stdout == want and want.startswith("kvrail "),
              "--version in the rootfs: %r (want %r) %s" % (r.stdout, want, r.stderr))
        r = chroot(root, ["kvrail-mkmodel", "--out", "/tmp/tiny"])
        check(r.returncode == 0, "kvrail-mkmodel in the rootfs: %s" % r.stderr)
        argv = ["run", "--model", "/tmp/tiny", "--prompt-tokens", "5,17,99,3,250,42", "--max-tokens",
                "8", "--temperature", "0", "--json", "--ignore-eos"]
        got = chroot(root, ["kvrail"] + argv)
        ref = run([a.kvrail] + argv[:2] + [os.path.join(root, "tmp/tiny")] + argv[3:], timeout=60)
        ids = lambda s: [o["token_id"] for o in map(json.loads, s.splitlines()) if "token_id" in o]  # noqa: E731,E501
        check(got.returncode == 0 and ref.returncode == 0 and ids(got.stdout) == ids(ref.stdout)
              and len(ids(got.stdout)) == 8, "kvrail run in the rootfs %s %s != here %s" % (
                  got.stdout, got.stderr, ref.stdout))
        print("in the rootfs: %s; kvrail run == kvrail run here (8 tokens)" % want.strip())
        # no CUDA library in the image: a CUDA build still runs on the CPU
        # (above) and refuses cuda:0 at start with the reason, not a loader error
        r = chroot(root, ["kvrail"] + argv[:3] + ["--device", "cuda:0"] + argv[3:])
        check(r.returncode != 0 and "--device: cuda:0" in r.stderr
              and "shared librar" not in r.stderr and "token_id" not in r.stdout,
              "kvrail run --device cuda:0 in the rootfs: rc %d, %r" % (r.returncode, r.stderr))
        print("in the rootfs: --device cuda:0 refused at start: %s"
              % r.stderr.strip().splitlines()[0])
        print("size: runtime rootfs %s MiB, with kvrail installed %s MiB (uncompressed)" % (
            size, total))
        return 0
    except Fail as e:
        print("FAIL:", e)
        return 1
    finally:
        reap_all()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
