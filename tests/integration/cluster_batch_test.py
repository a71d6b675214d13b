#!/usr/bin/env python3
"""cluster_batch_test.py - the prefill node batches short prompts.

1 prefill + 1 decode node on a small generated model (4 layers, hidden 256,
so a prefill takes long enough for requests to queue behind it): 24 prompts
of 1..200 tokens and two of 300 and 600 (those go alone), all sent at once
(concurrency 24), greedy.  Asserts every output is token-for-token that of
`kvrail run` (the batched prefill is bit for bit each prompt's own), that the
prefill node ran batched prefills (its stats file: batched_prefills >= 1,
batched_requests >= 2), that prefill pushed what decode received and that
the decode pool is back at its baseline.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, Cluster, add_bin_args, check, make_model, reference,  # noqa
                         run_main, workdir, check_outputs)


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-cluster-batch-")
    model = make_model(bins, wd, ["--layers", "4", "--hidden", "256", "--heads", "8",
                                  "--kv-heads", "4", "--intermediate", "512", "--seed", "9"])
    rng = random.Random(5)
    lens = [1, 5, 17, 31, 33, 40, 64, 64, 64, 64, 64, 64, 64, 64, 80, 100, 120, 150, 200, 48,
            56, 72, 90, 130, 300, 600]
    prompts = [([rng.randrange(4, 512) for _ in range(n)], rng.randrange(2, 6)) for n in lens]
    t0 = time.time()
    ref = reference(bins, model, prompts)
    print("reference: %d prompts in %.1f s" % (len(prompts), time.time() - t0))
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, local_prefill_tokens=0)
    try:
        c.start()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", str(len(prompts)), "--no-ignore-eos"])
        print(log)
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        check_outputs(outs, ref)
        ds = c.wait_idle()
        for n, s in ds.items():
            check(s["reserved_blocks"] == 0, "%s: %d blocks still reserved" % (n, s["reserved_blocks"]))
        c.check_alive()
        ps = c.stats(c.prefills[0])
        print("prefill node: %d prefills ok, %d batched prefills of %d requests" % (
            ps.get("prefills_ok", -1), ps.get("batched_prefills", -1), ps.get("batched_requests", -1)))
        check(ps.get("batched_prefills", 0) >= 1, "no batched prefill: %s" % ps)
        check(ps.get("batched_requests", 0) >= 2 * ps["batched_prefills"],
              "batched prefills of fewer than 2 requests: %s" % ps)
        pushed = ps["bytes_pushed"]
        received = sum(c.stats(n)["kv_bytes_received"] for n in c.decodes)
        check(pushed == received, "prefill pushed %d bytes, decode received %d" % (pushed, received))
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
