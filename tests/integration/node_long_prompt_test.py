#!/usr/bin/env python3
"""node_long_prompt_test.py - a long prefill does not silence the node.

1 prefill + 1 decode node with the DEFAULT heartbeat settings (1000 ms
interval, 3000 ms timeout) on an 8-layer, hidden-512 model; one prompt of
--tokens tokens (default 3,500, the issue's size: its prefill takes about
5.6 s on a quiet 2-core machine, longer than the 3 s heartbeat timeout)
goes through the prefill node.  While it runs, `kvrail status --json` is sampled: the
router's heartbeat age of the prefill node must stay under two intervals
in every sample and no node may be declared dead; the prefill node's own
stats file must show it computing in some of the samples (the samples were
taken during the prefill).  The output must be token for token that of
`kvrail run`, and both nodes keep their incarnation (nobody restarted or
re-registered).
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, ClientCluster, add_bin_args, check, make_model, reference,  # noqa
                         run_main, workdir, diff_output)

HEARTBEAT_MS = 1000  # the default of timeouts.heartbeat_ms


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--tokens", type=int, default=3500)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-node-long-")
    model = make_model(bins, wd, ["--layers", "8", "--hidden", "512", "--heads", "8",
                                  "--kv-heads", "2", "--intermediate", "1024", "--seed", "4"])
    rng = random.Random(3)
    prompt = [rng.randrange(4, 512) for _ in range(args.tokens)]
    t0 = time.time()
    ref = reference(bins, model, [(prompt, 4)], jobs=1)[0]
    t_ref = time.time() - t0
    print("reference: %d-token prompt in %.1f s" % (len(prompt), t_ref))
    c = ClientCluster(bins, wd, model, n_prefill=1, n_decode=1, local_prefill_tokens=0)
    # the default heartbeat settings: drop the test harness's fast ones
    with open(c.config) as f:
        lines = [ln for ln in f if "heartbeat_ms:" not in ln and "heartbeat_timeout_ms:" not in ln]
    with open(c.config, "w") as f:
        f.writelines(lines)
    try:
        c.start()
        pname, dname = c.prefills[0], c.decodes[0]
        inc = {n: c.stats(n).get("incarnation") for n in (pname, dname)}
        h = c.loadgen_start([(prompt, 4)], ["--no-ignore-eos"], name="long", timeout=120)
        ages, during, samples = [], 0, 0
        t_start = time.time()
        while h[0].poll() is None:
            st = c.status(timeout_ms=2000)
            computing = c.stats(pname).get("computing", False)
            if st is None:
                continue
            samples += 1
            nodes = {n["name"]: n for n in st.get("nodes", [])}
            for n in (pname, dname):
                check(n in nodes and nodes[n].get("alive"),
                      "%s not alive in the router's status during the prefill: %s" % (n, nodes.get(n)))
            age = nodes[pname].get("last_heartbeat_ms_ago", 0)
            ages.append(age)
            during += 1 if computing else 0
            check(age < 2 * HEARTBEAT_MS,
                  "the router's heartbeat age of %s is %d ms (>= two intervals of %d ms) %.1f s "
                  "into the request" % (pname, age, HEARTBEAT_MS, time.time() - t_start))
            time.sleep(0.2)  # pacing of the samples, not synchronization
        rc, outs, log = c.loadgen_wait(h)
        t_run = time.time() - t_start
        print(log)
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        o = outs.get(0)
        check(o is not None and o["status"] == 0, "the long prompt failed: %s" % (o,))
        check(not o["local_prefill"], "the prompt was prefilled on the decode node")
        check(not diff_output(o, ref), "the long prompt: %s" % diff_output(o, ref))
        check(during >= 1, "no status sample was taken while the prefill node computed "
              "(%d samples)" % samples)
        # the nodes' stats files are rewritten periodically and the prefill
        # node closes its request after the client has its tokens: wait (by
        # state) for files written after the request, with the prefill node
        # idle, before reading its counters
        c.wait_idle()
        ps = c.stats(pname)
        check(ps.get("prefills_ok") == 1 and ps.get("prefills_failed") == 0,
              "prefill node: %s" % ps)
        for n in (pname, dname):
            check(c.stats(n).get("incarnation") == inc[n], "%s restarted" % n)
        with open(c.logs["router"]) as f:
            dead = [ln for ln in f if "is dead" in ln]
        check(not dead, "the router declared a node dead:\n%s" % "".join(dead))
        c.check_alive()
        print("%d status samples (%d while computing) over %.1f s, heartbeat age max %d ms "
              "(interval %d ms)" % (samples, during, t_run, max(ages), HEARTBEAT_MS))
        if t_run < 2 * HEARTBEAT_MS / 1000.0:
            print("note: the request took under two heartbeat intervals on this machine")
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
