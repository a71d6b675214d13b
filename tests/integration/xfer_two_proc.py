#!/usr/bin/env python3
"""xfer_two_proc.py - the transfer engine between two real processes.

    xfer_two_proc.py XFER_PEER CASE [--mib N]

CASE:
  shm        UCX shared memory (tls sm: posix/sysv + cma): 256 MiB in 4 KiB,
             16 KiB and 1 MiB descriptors, every byte verified at the target,
             every notification checked against its data on arrival
  tcp        the same over UCX TCP (peer error handling as between hosts)
  death-shm  kill -9 the target mid-transfer (shared memory): the initiator
             must report PEER_FAILURE or TIMEOUT within 5 s, then transfer to
             a restarted target
  death-tcp  the same over TCP
  badinput   damaged blobs and bad descriptors against a live target
  idead-shm  kill -9 the initiator mid-transfer: the target lives on and
  idead-tcp  serves a new initiator (verified)

Addresses and keys go through a file in a fresh directory.  Every wait is
bounded; the children die with the driver (PR_SET_PDEATHSIG).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)

TLS = {"shm": ("sm", ("posix", "sysv", "cma")), "tcp": ("tcp", ("tcp",))}


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def start(peer, mode, d, tls, extra, env, **kw):
    args = [peer, mode, d, "--tls", tls] + extra
    return spawn(args, env=env, **kw)


def wait_file(path, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return
        time.sleep(0.02)
    fail("%s did not appear within %d s" % (path, timeout))


def readline(proc, want, timeout):
    """reads the child's stdout until a line starting with want (bounded)"""
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end:
        if not sel.select(max(0.0, end - time.monotonic())):
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.decode()
            print("initiator> " + line, file=sys.stderr)
            if line.startswith(want):
                return line
    fail("no '%s' line from the initiator within %d s" % (want, timeout))


def reap(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    peer, case = sys.argv[1], sys.argv[2]
    mib = sys.argv[sys.argv.index("--mib") + 1] if "--mib" in sys.argv else "256"
    transport = case.split("-")[-1] if case != "badinput" else "tcp"
    tls, expect_tl = TLS[transport]
    env = dict(os.environ)
    if transport == "tcp":
        env["KVR_UCX_ERR_MODE"] = "peer"  # UCX peer errors + keepalive, as between hosts
    extra = ["--mib", mib, "--timeout", "100"]
    procs = []
    d = tempfile.mkdtemp(prefix="kvr-xfer-")
    try:
        target = start(peer, "target", d, tls, extra, env)
        procs.append(target)
        wait_file(os.path.join(d, "target.blob"), 20)

        if case in ("shm", "tcp", "badinput"):
            mode = "initiator" if case != "badinput" else "badinput"
            ini = start(peer, mode, d, tls, extra, env, stderr=subprocess.PIPE)
            procs.append(ini)
            try:
                _, err = ini.communicate(timeout=100)
            except subprocess.TimeoutExpired:
                fail("initiator did not finish within 100 s")
            err = err.decode()
            sys.stderr.write(err)
            if ini.returncode != 0:
                fail("initiator exited %d" % ini.returncode)
            over = [l for l in err.splitlines() if "connected to" in l and " over " in l]
            if not over or not any(t in over[0] for t in expect_tl):
                fail("connection did not use %s: %s" % ("/".join(expect_tl), over))
            if case != "badinput" and err.count("target says ok") != 3:
                fail("not every round was verified by the target")
            target.wait(timeout=20)
            if target.returncode != 0:
                fail("target exited %d" % target.returncode)
            print("%s: %s" % (case, "verified" if case != "badinput" else "typed errors"))
            return 0

        if case.startswith("idead"):
            ini = start(peer, "stream", d, tls, extra, env, stdout=subprocess.PIPE)
            procs.append(ini)
            readline(ini, "STREAMING", 30)
            time.sleep(0.2)
            ini.kill()
            ini.wait(timeout=10)
            time.sleep(0.5)
            if target.poll() is not None:
                fail("the target died with its initiator (exit %s)" % target.returncode)
            ini2 = start(peer, "initiator", d, tls, extra + ["--desc", "1048576"], env,
                         stderr=subprocess.PIPE)
            procs.append(ini2)
            try:
                _, err = ini2.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                fail("second initiator did not finish within 60 s")
            sys.stderr.write(err.decode())
            if ini2.returncode != 0 or b"target says ok" not in err:
                fail("second initiator failed (exit %d)" % ini2.returncode)
            target.wait(timeout=20)
            if target.returncode != 0:
                fail("target exited %d" % target.returncode)
            print("%s: target survived, served a new initiator, verified" % case)
            return 0

        # peer death
        ini = start(peer, "stream", d, tls, extra, env, stdout=subprocess.PIPE)
        procs.append(ini)
        readline(ini, "STREAMING", 30)
        time.sleep(0.3)
        t_kill = time.monotonic_ns()
        os.kill(target.pid, signal.SIGKILL)
        target.wait(timeout=10)
        line = readline(ini, "FAILED", 10)
        status, seen = line.split()[1], int(line.split()[2])
        dt = (seen - t_kill) / 1e9
        print("peer death (%s): initiator saw %s %.3f s after kill -9" % (transport, status, dt))
        if status not in ("KVR_ERR_PEER_FAILURE", "KVR_ERR_TIMEOUT"):
            fail("status %s" % status)
        if dt > 5.0:
            fail("failure seen after %.3f s (> 5 s)" % dt)
        target2 = start(peer, "target", d, tls, extra, env)
        procs.append(target2)
        readline(ini, "RECONNECTED ok", 60)
        ini.wait(timeout=30)
        if ini.returncode != 0:
            fail("initiator exited %d" % ini.returncode)
        target2.wait(timeout=20)
        print("%s: detected in %.3f s, reconnected, verified" % (case, dt))
        return 0
    finally:
        reap(procs)
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)


if __name__ == "__main__":
    sys.exit(main())
