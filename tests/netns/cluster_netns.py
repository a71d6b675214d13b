#!/usr/bin/env python3
"""cluster_netns.py - the cluster end to end with the router, the prefill node
and the decode node each in its own network namespace, joined by veth pairs
on a bridge (in a fourth namespace), KV moved over UCX TCP between them.

Prompts of 1..700 tokens (several sharing long prefixes), greedy, 8 in
flight: every output must equal `kvrail run`.  Exits 77 only when network
namespaces cannot be created here (not root, no ip/netns support).
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from cluster_lib import (Bins, Cluster, Fail, add_bin_args, check, make_model, make_prompts,  # noqa
                         reference, run_main, sp_run, spawn, workdir, check_outputs)


def sh(*argv, ok=True):
    r = sp_run(list(argv), capture_output=True, text=True, timeout=20)
    if ok and r.returncode != 0:
        raise Fail("%s: %s" % (" ".join(argv), r.stderr.strip()))
    return r


class Net:
    def __init__(self, tag, members):
        self.br = "kvb%s" % tag
        self.ns = {m: "kv%s%s" % (m[0], tag) for m in members}
        self.ip = {}
        self.created = []

    def up(self):
        sh("ip", "netns", "add", self.br)
        self.created.append(self.br)
        sh("ip", "-n", self.br, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.br, "link", "set", "br0", "up")
        for i, (m, ns) in enumerate(sorted(self.ns.items())):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            a, b = "va%s" % ns[-6:], "vb%s" % ns[-6:]
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", self.br)
            sh("ip", "link", "set", b, "netns", ns)
            sh("ip", "-n", self.br, "link", "set", a, "master", "br0")
            sh("ip", "-n", self.br, "link", "set", a, "up")
            ip = "10.77.0.%d" % (i + 1)
            sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", b)
            sh("ip", "-n", ns, "link", "set", b, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            self.ip[m] = ip

    def down(self):
        for ns in reversed(self.created):
            sh("ip", "netns", "pids", ns, ok=False)
            r = sh("ip", "netns", "pids", ns, ok=False)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except OSError:
                    pass
            sh("ip", "netns", "del", ns, ok=False)


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--prompts", type=int, default=24)
    args = ap.parse_args()
    bins = Bins(args)
    for b in (bins.router, bins.prefill, bins.decode, bins.kvrail, bins.mkmodel, bins.loadgen):
        if not os.path.exists(b):
            print("SKIP: %s not built" % b)
            return 77
    if os.geteuid() != 0:
        print("SKIP: network namespaces need root")
        return 77
    tag = "%05d" % (os.getpid() % 100000)
    net = Net(tag, ["router", "prefill", "decode"])
    try:
        net.up()
    except (Fail, OSError) as e:
        net.down()
        print("SKIP: cannot create network namespaces here: %s" % e)
        return 77
    wd = workdir("kvr-netns-")
    c = None
    try:
        model = make_model(bins, wd)
        prompts = make_prompts(args.prompts, seed=3)
        ref = reference(bins, model, prompts)
        # TCP across the bridge first: a broken set-up is a failure, not a skip
        srv = spawn(["ip", "netns", "exec", net.ns["decode"], sys.executable, "-c",
                                "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,"
                                " socket.SO_REUSEADDR, 1); s.bind(('%s', 17999)); s.listen(1); "
                                "s.settimeout(10); c,_=s.accept(); c.sendall(b'ok')" % net.ip["decode"]])
        # the client retries until the server listens (no sleep as synchronization)
        r = sp_run(["ip", "netns", "exec", net.ns["prefill"], sys.executable, "-c",
                            "import socket, time\n"
                            "t = time.time() + 10\n"
                            "while True:\n"
                            "    try:\n"
                            "        print(socket.create_connection(('%s', 17999), 5).recv(2).decode()); break\n"
                            "    except ConnectionRefusedError:\n"
                            "        if time.time() > t: raise\n"
                            "        time.sleep(0.05)\n" % net.ip["decode"]],
                           capture_output=True, text=True, timeout=15)
        srv.wait(timeout=15)
        check(r.stdout.strip() == "ok", "no TCP connectivity over the veth bridge: %s" % r.stderr)
        c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, tls="tcp",
                    hosts={"router": net.ip["router"]},
                    netns={"router": net.ns["router"], "client": net.ns["router"],
                           "prefill0": net.ns["prefill"], "decode0": net.ns["decode"]})
        c.start()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "8", "--no-ignore-eos"])
        print(log)
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        check_outputs(outs, ref, range(len(prompts)), "across namespaces")
        c.wait_idle()
        pushed = c.stats("prefill0")["bytes_pushed"]
        check(pushed > 0, "no KV moved between the namespaces")
        print("%d prompts over veth/UCX TCP, %d KV bytes prefill -> decode, all equal to kvrail run"
              % (len(prompts), pushed))
        with open(c.logs["prefill0"]) as f:
            lines = [l.strip() for l in f if "connected to decode node" in l]
        print("\n".join(lines))
        return 0
    finally:
        if c:
            c.stop()
            for n in ("router", "prefill0", "decode0"):
                print(c.tail(n, 15))
        net.down()


if __name__ == "__main__":
    run_main(main)
