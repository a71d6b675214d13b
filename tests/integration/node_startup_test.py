#!/usr/bin/env python3
"""node_startup_test.py - a decode node with a 1 GiB KV pool comes up and
registers.

A router and one decode node whose pool is `pool_bytes: 1GiB` (the tiny
model: 131,072 blocks of 16 tokens x 2 layers, 512 MiB per layer slab).
Asserted by state, not by time: the node's stats file says registered,
the router lists it alive with every block of the pool, and the node
reports the pool's setup time (printed: the benchmark in docs/nodes.md
reads it).  Skips when the machine has under 3 GiB available.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (SKIP, Bins, Cluster, add_bin_args, check, make_model,  # noqa
                         run_main, workdir)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


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
    c = Cluster(bins, wd, model, n_prefill=0, n_decode=1)
    with open(c.config) as f:
        text = f.read()
    text = text.replace("    pool_blocks: 2048\n", "    pool_bytes: 1GiB\n")
    with open(c.config, "w") as f:
        f.write(text)
    dn = c.decodes[0]
    try:
        t0 = time.time()
        c.start(timeout=90)  # returns once the router lists it alive and it says registered
        t_up = time.time() - t0
        s = c.stats(dn)
        check(s.get("registered") is True, "not registered: %s" % s)
        bb, layers = s["block_bytes"], s["layers"]
        check(s["total_blocks"] * bb * layers == 1 << 30,
              "pool of %d blocks x %d bytes x %d layers is not 1 GiB" % (s["total_blocks"], bb,
                                                                        layers))
        st = c.status()
        node = [n for n in st["nodes"] if n["name"] == dn][0]
        check(node["alive"] and node["total_blocks"] == s["total_blocks"],
              "router's view of %s: %s" % (dn, node))
        print("1 GiB pool: set up in %.1f ms (huge pages %s); registered %.2f s after the "
              "cluster started" % (s["pool_setup_ns"] / 1e6, s["pool_huge_pages"], t_up))
        c.check_alive()
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
