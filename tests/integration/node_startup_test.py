#!/usr/bin/env python3
"""node_startup_test.py - a decode node with a 1 GiB KV pool registers
before its pool is faulted in, serves from the faulted part meanwhile, and
grows to the whole pool.

A router and one decode node whose pool is `pool_bytes: 1GiB` (the tiny
model: 131,072 blocks of 16 tokens x 2 layers, 512 MiB per layer slab).
The node pre-faults its pool on a thread (node/pool.c) and hands out only
blocks below the faulted horizon.  KVR_NODE_PREFAULT_GATE holds that thread
after its first chunk until the test creates the gate file, so every step
is asserted by state, not by time:

 1. registered, the router lists it alive with every block of the pool,
    while the horizon is still short of the pool (faulted at registration
    and now < total; free blocks never above the horizon, in the node's
    stats and, after a heartbeat, in the router's view);
 2. requests served during the pre-fault are token for token `kvrail run`,
    and only blocks below the horizon were used (free + evictable = horizon
    at rest, nothing withheld was handed out);
 3. after the gate opens the horizon reaches every block, the router sees
    the whole pool free, and the same requests again are token-exact.
Prints the pool's setup and fault times (the benchmark in docs/nodes.md is
node_startup_bench.py).  Skips when the machine has under 3 GiB available.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (SKIP, Bins, Cluster, add_bin_args, check, make_model,  # noqa
                         make_prompts, reference, run_main, wait_for, workdir, check_outputs)

OK = "KVR_OK"  # pool_fault_status when the pre-fault had no error


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def stats_when(c, name, what, pred, timeout=30):
    """The node's stats once pred(stats) holds, from a stats file written
    after this call: the node rewrites it periodically, and an older one may
    predate the work just done (8 requests can take 10 ms)."""
    since_ns = time.time_ns()

    def fresh():
        if c.stats_mtime_ns(name) < since_ns:  # (before reading: never an older body)
            return None
        x = c.stats(name)
        return x if pred(x) else None

    return wait_for(what, fresh, timeout)


def router_when(c, name, what, pred, timeout=30):
    """The router's view of the node once pred(view) holds."""
    return wait_for(what, lambda: (lambda n: n if n and pred(n) else None)(router_view(c, name)),
                    timeout)


def router_view(c, name):
    st = c.status()
    nodes = [n for n in (st or {}).get("nodes", []) if n["name"] == name]
    return nodes[0] if nodes else None


def serve(c, prompts, ref, name):
    rc, outs, log = c.loadgen(prompts, ["--concurrency", "3"], name=name, timeout=120)
    print(log)
    check(rc == 0, "%s: kvrail-loadgen exit %d" % (name, rc))
    check_outputs(outs, ref, range(len(prompts)), name)


def main():
    import argparse
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    args = ap.parse_args()
    if mem_available() < 3 << 30:
        print("SKIP: under 3 GiB of memory available for a 1 GiB pool")
        return SKIP
    bins = Bins(args)
    wd = workdir("kvr-node-startup-")
    model = make_model(bins, wd)
    prompts = make_prompts(n=8, seed=14, max_len=300, max_tokens=8)
    ref = reference(bins, model, prompts)
    c = Cluster(bins, wd, model, n_prefill=0, n_decode=1)
    with open(c.config) as f:
        text = f.read()
    text = text.replace("    pool_blocks: 2048\n", "    pool_bytes: 1GiB\n")
    with open(c.config, "w") as f:
        f.write(text)
    gate = os.path.join(wd, "prefault-go")
    os.environ["KVR_NODE_PREFAULT_GATE"] = gate  # the nodes inherit it
    dn = c.decodes[0]
    try:
        t0 = time.time()
        c.start(timeout=90)  # returns once the router lists it alive and it says registered
        t_up = time.time() - t0
        s = stats_when(c, dn, "stats with the horizon at registration",
                       lambda x: x.get("pool_faulted_at_register", -1) >= 0)
        check(s.get("registered") is True, "not registered: %s" % s)
        total, bb, layers = s["total_blocks"], s["block_bytes"], s["layers"]
        check(total * bb * layers == 1 << 30,
              "pool of %d blocks x %d bytes x %d layers is not 1 GiB" % (total, bb, layers))
        # 1. registered before the pool is faulted (the gate holds the thread)
        at_reg, horizon = s["pool_faulted_at_register"], s["pool_faulted_blocks"]
        check(at_reg < total and 0 < horizon < total,
              "faulted %d at registration, %d now, of %d: the pool should still be faulting"
              % (at_reg, horizon, total))
        check(s["free_blocks"] + s["evictable_blocks"] <= horizon and s["pool_fault_ns"] == 0,
              "free blocks above the faulted horizon %d: %s" % (horizon, s))
        node = router_view(c, dn)
        check(node and node["alive"] and node["total_blocks"] == total,
              "router's view of %s: %s" % (dn, node))
        node = router_when(c, dn, "the router's free blocks at or below the horizon %d" % horizon,
                           lambda n: n["free_blocks"] <= horizon)
        print("registered %.2f s after the cluster started, %d of %d blocks faulted then; "
              "the router sees %d free" % (t_up, at_reg, total, node["free_blocks"]))

        # 2. served from the faulted part, token-exact
        serve(c, prompts, ref, "during")
        s = stats_when(c, dn, "the node at rest",
                       lambda x: x.get("requests") == 0 and x.get("reserved_blocks") == 0)
        check(s["pool_faulted_blocks"] == horizon and s["pool_fault_ns"] == 0,
              "the horizon moved while the gate was closed: %s" % s)
        check(s["done"] >= len(prompts), "done %d of %d" % (s["done"], len(prompts)))
        check(s["free_blocks"] + s["evictable_blocks"] == horizon,
              "at rest: free %d + evictable %d != the %d faulted blocks" % (
                  s["free_blocks"], s["evictable_blocks"], horizon))
        print("served %d requests while %d of %d blocks were faulted" % (s["done"], horizon, total))

        # 3. the gate opens: the whole pool
        with open(gate, "w"):
            pass
        s = stats_when(c, dn, "the whole pool faulted",
                       lambda x: x.get("pool_faulted_blocks") == total and
                       x.get("pool_fault_ns", 0) > 0, timeout=100)
        check(s["pool_fault_status"] == OK, "pre-fault status %s" % s["pool_fault_status"])
        check(s["free_blocks"] + s["evictable_blocks"] == total, "not all usable: %s" % s)
        router_when(c, dn, "the router seeing the whole pool free",
                    lambda n: n["free_blocks"] == total)
        serve(c, prompts, ref, "after")
        ds = c.wait_idle(timeout=30)
        s = ds[dn]
        check(s["free_blocks"] + s["evictable_blocks"] == total and s["reserved_blocks"] == 0,
              "not at baseline: %s" % s)
        print("1 GiB pool: allocated + registered in %.1f ms (huge pages %s), all %d blocks "
              "faulted %.1f ms later (gate held meanwhile)" % (
                  s["pool_setup_ns"] / 1e6, s["pool_huge_pages"], total, s["pool_fault_ns"] / 1e6))
        c.check_alive()
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
