#!/usr/bin/env python3
"""node_decode_stream_test.py - a decode node keeps streaming while it
prefills a long prompt locally.

One decode node (no prefill node: every prompt is prefilled on it) on an
8-layer, hidden-512 model.  Sequence A (a short prompt, a long max_tokens)
starts decoding; once it streams, prompt B of 2,000 tokens arrives and is
prefilled in chunks of limits.prefill_chunk_tokens (512) between decode
steps.  Asserted from the node's own stats and timings:
  - B's prefill took several chunks, each in a step together with A's
    decode step (mixed_steps), i.e. A kept running during it;
  - the largest gap between two of a running sequence's tokens
    (itl_ns_max) is at most 1.5 x (the longest chunk + the longest decode
    step), a ratio of the node's own clock readings;
  - B's output is token for token that of `kvrail run`;
  - after A is canceled (its client goes away), the pool is at baseline.
Before chunking, A stopped for the whole prefill (4 chunks' time).
"""
import argparse
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, Cluster, add_bin_args, check, make_model, reference,  # noqa
                         run_main, wait_for, workdir, diff_output)

CHUNK = 512


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--tokens", type=int, default=2000)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-node-stream-")
    model = make_model(bins, wd, ["--layers", "8", "--hidden", "512", "--heads", "8",
                                  "--kv-heads", "2", "--intermediate", "1024", "--seed", "5"])
    rng = random.Random(8)
    a = [rng.randrange(4, 512) for _ in range(20)]
    b = [rng.randrange(4, 512) for _ in range(args.tokens)]
    t0 = time.time()
    ref_b = reference(bins, model, [(b, 3)], jobs=1)[0]
    print("reference: %d-token prompt in %.1f s" % (len(b), time.time() - t0))
    c = Cluster(bins, wd, model, n_prefill=0, n_decode=1, local_prefill_tokens=1 << 20,
                extra_yaml="")
    with open(c.config) as f:
        text = f.read()
    text = text.replace("limits:\n", "limits:\n  prefill_chunk_tokens: %d\n" % CHUNK, 1)
    with open(c.config, "w") as f:
        f.write(text)
    dn = c.decodes[0]
    try:
        c.start()
        ha = c.loadgen_start([(a, 3000)], name="a", timeout=200)
        wait_for("sequence A to stream", lambda: c.stats(dn).get("tokens_out", 0) >= 5, timeout=60)
        rc, outs, log = c.loadgen([(b, 3)], ["--no-ignore-eos"], name="b", timeout=120)
        print(log)
        # the stats file is rewritten periodically: read the one that counts B
        # finished (state, not time), so its chunk and step counters are B's
        s = wait_for("the decode node's stats to count B finished",
                     lambda: (lambda st: st if st.get("done", 0) >= 1 else None)(c.stats(dn)),
                     timeout=30)
        check(ha[0].poll() is None, "sequence A ended before B's prefill was over")
        # A goes away: the router cancels it on the node
        ha[0].send_signal(signal.SIGTERM)
        c.loadgen_wait(ha)
        check(rc == 0, "kvrail-loadgen exit %d for B" % rc)
        o = outs.get(0)
        check(o is not None and o["status"] == 0, "B failed: %s" % (o,))
        check(o["local_prefill"], "B was not prefilled on the decode node")
        check(not diff_output(o, ref_b), "B: %s" % diff_output(o, ref_b))
        chunks_b = (len(b) + CHUNK - 1) // CHUNK
        print("decode node: %d chunks (%d with a decode step), chunk max %.1f ms, decode step max "
              "%.1f ms, largest inter-token gap %.1f ms" % (
                  s["chunks"], s["mixed_steps"], s["chunk_ns_max"] / 1e6,
                  s["decode_step_ns_max"] / 1e6, s["itl_ns_max"] / 1e6))
        check(s["prefill_chunk_tokens"] == CHUNK, "chunk size %s" % s["prefill_chunk_tokens"])
        check(s["chunks"] >= chunks_b, "%d chunks for a %d-token prompt" % (s["chunks"], len(b)))
        check(s["mixed_steps"] >= chunks_b,
              "only %d of B's %d chunks ran in a step with A" % (s["mixed_steps"], chunks_b))
        bound = 1.5 * (s["chunk_ns_max"] + s["decode_step_ns_max"])
        ratio = s["itl_ns_max"] / (s["chunk_ns_max"] + s["decode_step_ns_max"])
        print("gap / (chunk + decode step) = %.2f (must be <= 1.5)" % ratio)
        check(s["itl_ns_max"] <= bound,
              "A's largest inter-token gap %.1f ms > 1.5 x (chunk %.1f ms + step %.1f ms)" % (
                  s["itl_ns_max"] / 1e6, s["chunk_ns_max"] / 1e6, s["decode_step_ns_max"] / 1e6))
        ds = c.wait_idle(timeout=30)
        for n, st in ds.items():
            check(st["reserved_blocks"] == 0 and
                  st["free_blocks"] + st["evictable_blocks"] == st["total_blocks"],
                  "%s: pool not at baseline: %s" % (n, st))
        c.check_alive()
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
