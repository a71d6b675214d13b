#!/usr/bin/env python3
"""xfer_netns.py - the verified two-process transfer between two network
namespaces joined by a veth pair, over UCX TCP.

    xfer_netns.py XFER_PEER [--mib N]

The target runs in one namespace, the initiator in the other, each told to
use only its veth device (cfg.devices -> UCX_NET_DEVICES) and TCP (cfg.tls ->
UCX_TLS), with UCX peer error handling as between hosts.  256 MiB in 4 KiB,
16 KiB and 1 MiB descriptors, every byte and every notification checked at
the target (xfer_peer.c).  Exits 77, with the reason, only where `ip netns
add` fails (not root, no netns support).
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)


def sh(*args, ok=True):
    r = sp_run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if ok and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    peer = sys.argv[1]
    mib = sys.argv[sys.argv.index("--mib") + 1] if "--mib" in sys.argv else "256"
    tag = "%d" % (os.getpid() % 100000)
    ns_t, ns_i = "kvx-t" + tag, "kvx-i" + tag
    dev_t, dev_i = "kvxt" + tag, "kvxi" + tag
    subnet = "10.79.%d" % (os.getpid() % 250)
    try:
        r = sh("ip", "netns", "add", ns_t, ok=False)
    except (OSError, subprocess.SubprocessError) as e:
        print("SKIP: cannot run ip netns add: %s" % e, file=sys.stderr)
        return 77
    if r.returncode != 0:
        print("SKIP: ip netns add failed: %s" % r.stderr.strip(), file=sys.stderr)
        return 77
    procs = []
    d = tempfile.mkdtemp(prefix="kvr-xfer-netns-")
    try:
        sh("ip", "netns", "add", ns_i)
        sh("ip", "link", "add", dev_t, "type", "veth", "peer", "name", dev_i)
        sh("ip", "link", "set", dev_t, "netns", ns_t)
        sh("ip", "link", "set", dev_i, "netns", ns_i)
        for ns, dev, ip in ((ns_t, dev_t, subnet + ".1"), (ns_i, dev_i, subnet + ".2")):
            sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

        env = dict(os.environ, KVR_UCX_ERR_MODE="peer")
        common = ["--tls", "tcp", "--mib", mib, "--timeout", "100"]
        target = spawn(["ip", "netns", "exec", ns_t, peer, "target", d, "--devices",
                                   dev_t] + common, env=env)
        procs.append(target)
        end = time.monotonic() + 20
        while not os.path.exists(os.path.join(d, "target.blob")):
            if time.monotonic() > end or target.poll() is not None:
                fail("target did not start")
            time.sleep(0.02)
        ini = spawn(["ip", "netns", "exec", ns_i, peer, "initiator", d, "--devices",
                                dev_i] + common, env=env, stderr=subprocess.PIPE)
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
        if not over or ("tcp/" + dev_i) not in over[0]:
            fail("connection did not use tcp/%s: %s" % (dev_i, over))
        if err.count("target says ok") != 3:
            fail("not every round was verified by the target")
        target.wait(timeout=20)
        if target.returncode != 0:
            fail("target exited %d" % target.returncode)
        print("netns: 3 rounds of %s MiB over UCX TCP across a veth pair, verified" % mib)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in (ns_t, ns_i):
            sh("ip", "netns", "del", ns, ok=False)
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)


if __name__ == "__main__":
    sys.exit(main())
