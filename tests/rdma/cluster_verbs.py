#!/usr/bin/env python3
"""cluster_verbs.py BUILD [--linkdown] - 1 prefill + 1 decode node with the KV
cache moved over the verbs backend (soft-RoCE rxe_lo inside the test VM),
every output token-for-token equal to `kvrail run`.  Run by tests/rdma/guest.sh.

--linkdown: the nodes stripe over two rails on two veth pairs (prefill rxe0 +
rxe2, decode rxe1 + rxe3, per node in the cluster file), and while a load of
requests runs, rail 0's link (veth0: the rail notifications go on) is taken
down: every request completes, equal to `kvrail run`, and the prefill node's
log shows the rail failed over.

Uses tests/integration/cluster_lib.py (real router, prefill and decode
processes, kvrail-loadgen).  Prompts are longer than the local-prefill
threshold, so every request is disaggregated; the decode node's stats must
show KV blocks received.  Exits 77 when the cluster binaries are not built.
"""
import contextlib
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from cluster_lib import (Bins, Cluster, Fail, check, make_model, reference, run_main, sp_run,  # noqa
                         workdir, check_outputs)


class SlowCluster(Cluster):
    """cluster_lib's Cluster with the patience a loaded TCG guest needs: a
    status call that takes longer than a second is not a failure here."""

    def status(self, timeout_ms=3000):
        return Cluster.status(self, max(timeout_ms, 5000))


@contextlib.contextmanager
def cluster_up(c):
    """c started; the tails of its logs on a failure; stopped on every exit path"""
    try:
        c.start(timeout=100)
        yield c
    except Fail:
        for n in ("router", "prefill0", "decode0"):
            print(c.tail(n), file=sys.stderr)
        raise
    finally:
        c.stop()


RAILS = {"prefill": "rxe0:1:0,rxe2:1:0", "decode": "rxe1:1:0,rxe3:1:0"}


def two_rails(config):
    """each node's devices in the cluster file: two rails, one per veth pair"""
    out, role = [], None
    for line in open(config).read().splitlines():
        out.append(line)
        if line.strip().startswith("role:"):
            role = line.split(":", 1)[1].strip()
        if line.strip() == "backend: verbs" and role in RAILS:
            out.append(line.replace("backend: verbs", "devices: " + RAILS[role]))
    with open(config, "w") as f:
        f.write("\n".join(out) + "\n")


def set_link(dev, state):
    r = sp_run(["ip", "link", "set", "dev", dev, state], capture_output=True, text=True,
               timeout=60)
    check(r.returncode == 0, "ip link set %s %s: %s" % (dev, state, r.stderr))


def rxe_counter(dev, name):
    try:
        return open("/sys/class/infiniband/%s/ports/1/hw_counters/%s" % (dev, name)).read().strip()
    except OSError:
        return "?"


def linkdown(b, wd, model):
    rng = random.Random(12)
    warm = [([rng.randrange(4, 512) for _ in range(60)], 4)]
    prompts = [([rng.randrange(4, 512) for _ in range(rng.randrange(40, 120))], 6)
               for _ in range(10)]
    t0 = time.time()
    ref = reference(b, model, warm + prompts)
    print("kvrail run: %.1f s" % (time.time() - t0))
    c = SlowCluster(b, wd, model, transport="verbs", local_prefill_tokens=8)
    two_rails(c.config)
    down = False
    try:
        with cluster_up(c):
            print("cluster up: %.1f s" % (time.time() - t0))
            # one request first: the prefill node's connection (both rails) is made
            rc, outs, log = c.loadgen(warm, ["--no-ignore-eos"], timeout=150, name="warm")
            check(rc == 0, "warm-up request: kvrail-loadgen exit %d: %s" % (rc, log[-800:]))
            check_outputs(outs, ref[:1], what="warm-up over two rails")
            kv0 = c.stats("decode0").get("kv_bytes_received", 0)
            check(kv0 > 0, "decode0 received no KV bytes")
            plog = open(c.logs["prefill0"]).read()
            check("rxe0:1->rxe1:1,rc/rxe2:1->rxe3:1" in plog,
                  "prefill0 is not on two rails:\n" + plog[-1500:])
            print("warm-up done: %.1f s" % (time.time() - t0))
            h = c.loadgen_start(prompts, ["--concurrency", "2", "--no-ignore-eos"], name="load")
            # rail 0's link goes down once the load has moved more KV
            deadline = time.time() + 120
            while (c.stats("decode0").get("kv_bytes_received", 0) <= kv0 and
                   time.time() < deadline):
                time.sleep(0.05)
            set_link("veth0", "down")
            down = True
            print("veth0 (rail 0) down under load: %.1f s" % (time.time() - t0))
            rc, outs, log = c.loadgen_wait(h)
            print("load done: %.1f s" % (time.time() - t0))
            check(rc == 0, "kvrail-loadgen exit %d under the link failure: %s" %
                  (rc, log[-800:]))
            check_outputs(outs, ref[1:], what="over two rails, rail 0's link down")
            plog = open(c.logs["prefill0"]).read()
            check("rail 0 (rxe0" in plog and "failed" in plog,
                  "prefill0's log shows no failover of rail 0:\n" + plog[-2000:])
            moved = [l for l in plog.splitlines() if "rail 0 (rxe0" in l and "failed" in l]
            print("prefill0: %s" % moved[0][moved[0].find("rail 0"):][:300])
            # the port state comes from the device's async events: rxe delivers
            # IBV_EVENT_PORT_ERR when its netdev goes down
            check("rxe0:1: port down (async event IBV_EVENT_PORT_ERR)" in plog,
                  "prefill0 saw no port-down event of rxe0:\n" + plog[-2000:])
            print("prefill0 took rxe0's port down from its async event; rxe0 send errors: %s" %
                  rxe_counter("rxe0", "send_err"))
            ds = c.stats("decode0")
            print("1P+1D over two rails, rail 0's link down under load: %d requests, every one "
                  "equal to kvrail run; decode0 kv_bytes_received %d" %
                  (len(prompts), ds.get("kv_bytes_received", 0)))
            return 0
    finally:
        if down:
            set_link("veth0", "up")


def main():
    build = sys.argv[1]
    b = Bins.from_build(build)
    for k, p in vars(b).items():
        if not os.access(p, os.X_OK):
            print("SKIP: %s not built (%s)" % (k, p), file=sys.stderr)
            return 77
    os.environ.setdefault("KVR_VERBS_DEVICES", "rxe_lo")
    wd = workdir("kvr-verbs-cluster-")
    model = make_model(b, wd)
    if "--linkdown" in sys.argv[2:]:
        return linkdown(b, wd, model)
    rng = random.Random(11)
    prompts = [([rng.randrange(4, 512) for _ in range(n)], 5) for n in (40, 90)]
    ref = reference(b, model, prompts)
    c = SlowCluster(b, wd, model, transport="verbs", local_prefill_tokens=8)
    with cluster_up(c):
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "2", "--no-ignore-eos"], timeout=150)
        check(rc == 0, "kvrail-loadgen exit %d: %s" % (rc, log[-800:]))
        check_outputs(outs, ref, what="over verbs")
        ds = c.stats("decode0")
        check(ds.get("kv_bytes_received", 0) > 0, "decode0 received no KV bytes: %s" % ds)
        print("decode0 stats: %s" % {k: v for k, v in ds.items() if "kv" in k or "block" in k
                                     or "transport" in k})
        print("1P+1D over verbs: %d prompts, tokens equal to kvrail run" % len(prompts))
        return 0


if __name__ == "__main__":
    run_main(main)
