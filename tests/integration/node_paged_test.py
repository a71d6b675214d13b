#!/usr/bin/env python3
"""node_paged_test.py - KV that grows by the page, with preemption.

1 prefill + 1 decode node, the tiny model, a decode pool of 20 blocks of
16 tokens; 10 requests of a 16-token prompt and 64 output tokens (EOS
ignored), all sent at once.  Each needs 5 blocks by its end, so a
whole-request reservation (limits.reservation: whole) admits N = 4 at a
time.  With paged reservations (the prompt's block + 1 of headroom, grown
while decoding) the node runs more than N at once (its batch_max), the pool
runs out as they grow, the youngest are preempted and recomputed (prompt
prefilled again, generated tokens replayed), and every output is still
token for token that of `kvrail run`; afterwards both pools are back at
their baseline.  The prefill node got the decode node's address and rkeys in
one PrefillTarget of the ten (it keeps them per decode incarnation).  The whole-request run is checked the same way and must
never run more than N at once.
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, Cluster, add_bin_args, check, make_model, reference,  # noqa
                         run_main, workdir, check_outputs)

POOL, PROMPT, OUT, N_REQ = 20, 16, 64, 10
N_WHOLE = POOL // ((PROMPT + OUT + 15) // 16)  # 4


def run(bins, wd, model, prompts, ref, policy):
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, pool_blocks=POOL, queue_ms=60000,
                local_prefill_tokens=0)
    with open(c.config) as f:
        text = f.read()
    with open(c.config, "w") as f:
        f.write(text.replace("limits:\n", "limits:\n  reservation: %s\n"
                             "  reservation_headroom_blocks: 1\n" % policy, 1))
    try:
        c.start()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", str(N_REQ)], name=policy,
                                  timeout=120)
        print(log)
        check(rc == 0, "%s: kvrail-loadgen exit %d" % (policy, rc))
        check_outputs(outs, ref, range(len(prompts)), policy)
        ds = c.wait_idle(timeout=30)
        for n, s in ds.items():
            check(s["reserved_blocks"] == 0 and
                  s["free_blocks"] + s["evictable_blocks"] == s["total_blocks"] == POOL,
                  "%s: %s not at baseline: %s" % (policy, n, s))
            check(s["requests"] == 0 and s["batch"] == 0 and s["preempted"] == 0,
                  "%s: %s still holds requests" % (policy, n))
        for n in c.prefills:
            ps = c.stats(n)
            check(ps["staging_referenced"] == 0, "%s: %s staging held: %s" % (policy, n, ps))
            # D's address and rkeys reach P once per D incarnation
            check(ps["targets_with_address"] == 1 and
                  ps["targets_without_address"] == N_REQ - 1 and ps["decode_nodes_known"] == 1,
                  "%s: %s got D's address %d times in %d targets" % (
                      policy, n, ps["targets_with_address"],
                      ps["targets_with_address"] + ps["targets_without_address"]))
        c.check_alive()
        s = ds[c.decodes[0]]
        print("%s: batch max %d, preemptions %d, blocks grown %d" % (
            policy, s["batch_max"], s["preemptions"], s["grown_blocks"]))
        return s
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-node-paged-")
    model = make_model(bins, wd)
    rng = random.Random(21)
    prompts = [([rng.randrange(4, 512) for _ in range(PROMPT)], OUT) for _ in range(N_REQ)]
    ref = reference(bins, model, prompts, ignore_eos=True)
    whole = run(bins, wd, model, prompts, ref, "whole")
    check(whole["reservation"] == "whole" and whole["preemptions"] == 0, "whole: %s" % whole)
    check(whole["batch_max"] <= N_WHOLE,
          "whole-request reservations ran %d at once in a pool for %d" % (whole["batch_max"],
                                                                           N_WHOLE))
    paged = run(bins, wd, model, prompts, ref, "paged")
    check(paged["reservation"] == "paged", "paged: %s" % paged)
    # more at once than whole reservations can ever fit; how many more
    # depends on how the ten arrive and grow (7-10 seen; 7 in a loaded run)
    check(paged["batch_max"] > N_WHOLE,
          "paged reservations ran only %d at once (want > %d, what whole ones fit)" % (
              paged["batch_max"], N_WHOLE))
    check(paged["preemptions"] >= 1, "the pool never ran out: no preemption was exercised")
    check(paged["grown_blocks"] > 0, "no block was grown")
    return 0


if __name__ == "__main__":
    run_main(main)
