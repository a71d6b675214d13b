#!/usr/bin/env python3
"""vm.py - runs kvrail's soft-RoCE tests inside a qemu VM (TCG).

The machines kvrail is built on have no RDMA NIC and a kernel without
modules; Debian's own kernel booted in qemu has rdma_rxe, i.e. the real
kernel verbs stack.  How it works (see ../shared/RDMA_VM.md):

  * the uncompressed vmlinux is cut out of /boot/vmlinuz-* (the xz stream
    inside the bzImage, decompressed with lzma) and booted directly (PVH);
  * a tiny initramfs holds static busybox and the virtio/9p modules; its
    /init mounts the host's / read-only over 9p at /host, the results
    directory writable over a second 9p share at the same path inside
    /host, proc/sys/dev/tmp, points the kernel's modprobe helper at a script
    that chroots into /host, and runs tests/rdma/guest.sh chrooted into
    /host: host-built binaries run in the guest unchanged;
  * guest.sh writes NAME.rc / NAME.log for each guest test into the results
    directory and the VM powers off.

One boot runs every guest test.  meson has one test() per guest test; each
calls `vm.py --result NAME`: the first one to take the lock boots the VM,
the others wait for it and read their result (results count only when they
are newer than every input and younger than --max-age seconds).  vmlinux and
the initramfs are cached in the build directory.

Exit status: the guest test's own (0 pass, 1 fail, 77 skip); 77 with the
reason when qemu or the kernel is not there; 1 when the VM fails.
"""
import argparse
import fcntl
import glob
import lzma
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)

KVER_GLOB = "/boot/vmlinuz-*"
MODULES = ["virtio_pci", "9pnet_virtio", "9p"]
SKIP = 77


def skip(why):
    print("SKIP: " + why, file=sys.stderr)
    sys.exit(SKIP)


def newest_kernel():
    kernels = sorted(glob.glob(KVER_GLOB))
    if not kernels:
        return None, None
    path = kernels[-1]
    return path, os.path.basename(path)[len("vmlinuz-"):]


def extract_vmlinux(vmlinuz, out):
    """The bzImage carries the kernel ELF as an xz stream; find and inflate it."""
    data = open(vmlinuz, "rb").read()
    magic = b"\xfd7zXZ\x00"
    pos = data.find(magic)
    while pos >= 0:
        try:
            d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
            elf = d.decompress(data[pos:])
            if elf[:4] == b"\x7fELF":
                tmp = out + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(elf)
                os.replace(tmp, out)
                return True
        except lzma.LZMAError:
            pass
        pos = data.find(magic, pos + 1)
    return False


INIT = r"""#!/bin/sh
# /init of kvrail's rdma test VM (written by tests/rdma/vm.py)
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.list); do insmod "$m" || echo "vm: insmod $m failed"; done
mkdir -p /host
i=0
until mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 100 ] && { echo "vm: 9p host mount failed"; cat /proc/modules; poweroff -f; }; sleep 0.05
done
RES=$(cat /results.path)
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
CWD=$(cat /cwd.path)
case "$RES:$CWD" in
/tmp/*|*:/tmp/*) export TMPDIR=$RES ;;  # the build lives in the host's /tmp: keep it visible
*) mount -t tmpfs tmp /host/tmp ;;
esac
mount -t tmpfs run /host/run 2>/dev/null
mkdir -p /host$RES 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /host$RES || { echo "vm: results mount failed"; poweroff -f; }
echo /sbin/modprobe-host > /proc/sys/kernel/modprobe
chroot /host /bin/sh -c "cd $(cat /cwd.path) && exec /bin/sh $(cat /guest.path) $RES" > /host$RES/guest.console 2>&1
echo $? > /host$RES/guest.rc
sync
umount /host$RES
poweroff -f
"""

MODPROBE_HOST = """#!/bin/sh
exec chroot /host /sbin/modprobe "$@"
"""


def build_initramfs(kver, out, results, guest, cwd):
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        return "busybox not found (apt-get install busybox-static)"
    mods = []
    for mod in MODULES:
        r = sp_run(["modprobe", "-S", kver, "--show-depends", mod],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return "modprobe --show-depends %s failed: %s" % (mod, r.stderr.strip())
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "insmod" and parts[1] not in mods:
                mods.append(parts[1])
    root = out + ".d"
    shutil.rmtree(root, ignore_errors=True)
    for d in ["bin", "sbin", "proc", "sys", "dev", "tmp", "mods"]:
        os.makedirs(os.path.join(root, d))
    shutil.copy(busybox, os.path.join(root, "bin", "busybox"))
    for applet in ["sh", "mount", "umount", "insmod", "cat", "echo", "mkdir",
                   "chroot", "poweroff", "sync", "sleep", "ls", "grep"]:
        os.symlink("busybox", os.path.join(root, "bin", applet))
    lst = []
    for m in mods:
        dst = os.path.join("/mods", os.path.basename(m))
        shutil.copy(m, root + dst)
        lst.append(dst)
    with open(os.path.join(root, "modules.list"), "w") as f:
        f.write("\n".join(lst) + "\n")
    for name, text in [("results.path", results), ("guest.path", guest),
                       ("cwd.path", cwd)]:
        with open(os.path.join(root, name), "w") as f:
            f.write(text + "\n")
    for name, text in [("init", INIT), ("sbin/modprobe-host", MODPROBE_HOST)]:
        p = os.path.join(root, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, 0o755)
    files = sp_run("cd %s && find . | sort" % root, shell=True,
                           capture_output=True, check=True).stdout
    with open(out + ".tmp", "wb") as f:
        sp_run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root,
                       input=files, stdout=f, check=True)
    os.replace(out + ".tmp", out)
    shutil.rmtree(root, ignore_errors=True)
    return None


def results_fresh(resdir, inputs, max_age):
    stamp = os.path.join(resdir, "guest.rc")
    if not os.path.exists(stamp):
        return False
    t = os.path.getmtime(stamp)
    if time.time() - t > max_age:
        return False
    for p in inputs:
        if os.path.exists(p) and os.path.getmtime(p) > t:
            return False
    return True


def boot(args, cache, resdir):
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
    vmlinuz, kver = newest_kernel()
    if not vmlinuz:
        skip("no kernel in /boot (apt-get install linux-image-amd64)")
    if not os.path.isdir("/lib/modules/" + kver):
        skip("no modules for kernel " + kver)
    vmlinux = os.path.join(cache, "vmlinux-" + kver)
    if not os.path.exists(vmlinux) and not extract_vmlinux(vmlinuz, vmlinux):
        skip("could not extract an ELF vmlinux from " + vmlinuz)
    initrd = os.path.join(cache, "initramfs-" + kver + ".cpio")
    key = "\n".join([resdir, args.guest, args.cwd, INIT, MODPROBE_HOST])
    keyfile = initrd + ".key"
    if not (os.path.exists(initrd) and os.path.exists(keyfile)
            and open(keyfile).read() == key):
        why = build_initramfs(kver, initrd, resdir, args.guest, args.cwd)
        if why:
            skip(why)
        with open(keyfile, "w") as f:
            f.write(key)
    for f in glob.glob(os.path.join(resdir, "*")):
        os.unlink(f)
    if args.mode != "test":
        with open(os.path.join(resdir, "mode"), "w") as f:
            f.write(args.mode + "\n")
    if args.only:
        with open(os.path.join(resdir, "only"), "w") as f:
            f.write(args.only + "\n")
    cmd = ["timeout", "-k", "5", str(args.vm_timeout), qemu,
           "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "1536",
           "-kernel", vmlinux, "-initrd", initrd,
           "-append", "console=ttyS0 panic=-1 quiet loglevel=3",
           "-nographic", "-no-reboot", "-nic", "none", "-monitor", "none",
           "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,"
                      "readonly=on,multidevs=remap",
           "-virtfs", "local,path=%s,mount_tag=results,security_model=none" % resdir]
    t0 = time.time()
    with open(os.path.join(cache, "qemu.log"), "wb") as log:
        r = sp_run(cmd, stdout=log, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=args.vm_timeout + 30)
    dt = time.time() - t0
    print("vm: qemu exited %d after %.1f s" % (r.returncode, dt), file=sys.stderr)
    if not os.path.exists(os.path.join(resdir, "guest.rc")):
        qlog = open(os.path.join(cache, "qemu.log"), "rb").read()[-3000:]
        sys.stderr.write(qlog.decode(errors="replace"))
        if b"failed to initialize" in qlog or b"Could not" in qlog:
            skip("qemu could not start: see " + os.path.join(cache, "qemu.log"))
        with open(os.path.join(resdir, "guest.rc"), "w") as f:
            f.write("vm-failed %d\n" % r.returncode)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--guest", required=True, help="guest script (absolute path)")
    ap.add_argument("--cwd", required=True, help="directory the guest script runs in")
    ap.add_argument("--result", help="print and return this guest test's result")
    ap.add_argument("--input", action="append", default=[],
                    help="file whose change invalidates old results")
    ap.add_argument("--max-age", type=float, default=600)
    ap.add_argument("--vm-timeout", type=int, default=240)
    ap.add_argument("--force", action="store_true", help="boot even if results are fresh")
    ap.add_argument("--only", help="comma-separated guest tests to run (always boots; results "
                                   "go to results-only/)")
    ap.add_argument("--mode", default="test",
                    help="'test' (every guest test) or 'bench' (tests/rdma/bench-vm.sh only; "
                         "always boots, prints the benchmark)")
    args = ap.parse_args()

    cache = os.path.abspath(os.path.join(args.build_dir, "rdma-vm"))
    if args.only:
        args.mode = "only"
    resdir = os.path.join(cache, "results" if args.mode == "test" else "results-" + args.mode)
    os.makedirs(resdir, exist_ok=True)
    if args.mode != "test":
        args.force = True
    if args.mode == "bench":
        args.vm_timeout = max(args.vm_timeout, 1500)
        args.result = args.result or ("verbs_bench" if args.mode == "bench" else None)
    inputs = [args.guest] + args.input
    with open(os.path.join(cache, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if args.force or not results_fresh(resdir, inputs, args.max_age):
            boot(args, cache, resdir)
    rc_all = open(os.path.join(resdir, "guest.rc")).read().strip()
    if not args.result:
        console = os.path.join(resdir, "guest.console")
        if os.path.exists(console):
            sys.stdout.write(open(console).read())
        return 0 if rc_all == "0" else 1
    base = os.path.join(resdir, args.result)
    if os.path.exists(base + ".log"):
        sys.stdout.write(open(base + ".log", errors="replace").read())
    if not os.path.exists(base + ".rc"):
        print("vm: guest test %s left no result (guest status %s); console:" %
              (args.result, rc_all), file=sys.stderr)
        console = os.path.join(resdir, "guest.console")
        if os.path.exists(console):
            sys.stderr.write(open(console, errors="replace").read()[-4000:])
        return 1
    rc = int(open(base + ".rc").read().strip() or "1")
    return rc if rc in (0, 77) else 1


if __name__ == "__main__":
    sys.exit(main())
