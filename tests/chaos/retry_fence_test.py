#!/usr/bin/env python3
"""retry_fence_test.py - the two-writer window of a prefill retry: a prefill
node that only LOOKS dead (SIGSTOP mid-prefill: its heartbeats stop, the
router declares it dead and retries the prefill on the other prefill node,
on the same reservation of the decode node) is still alive and resumes
writing into the blocks it was given when it is continued.  The decode node
must not hand those blocks to the retry, nor to anyone, until the old
writer is fenced.

2 prefill + 1 decode node, an 8-layer hidden-512 model, one prompt of
--tokens tokens.  Once a prefill node is seen computing it, it is stopped.
Asserted:
- the request completes on the survivor, token for token equal to
  `kvrail run`;
- while the old writer is stopped, after the request has ended, the decode
  node still holds the blocks the old attempt was writing: one retry
  quarantine (retry_quarantines == 1) of every uncached prompt block
  (retry_quarantined_blocks), held (reserved_blocks == that count, one
  request record) - and the survivor was given other blocks (the decode
  node's log says how many were fresh);
- continued, the old writer ends its attempt (KV_ABORT or KV_READY, ordered
  after its writes) and that fences the quarantine (quarantines_fenced == 1,
  quarantines_expired == 0): the pool is back at its baseline;
- the old writer registers again, and the prompt sent again (its prefix
  now cached on the decode node) still gives `kvrail run`'s tokens.
"""
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import (check, Cluster, diff_output, killgroup, reference, run_main,  # noqa: E402
                         SLOW_MODEL, test_start, TOKENS, wait_for)


def main():
    args, bins, wd, model = test_start("kvr-retry-fence-", [TOKENS], SLOW_MODEL)
    rng = random.Random(12)
    prompt = [rng.randrange(4, 512) for _ in range(args.tokens)]
    ref = reference(bins, model, [(prompt, 6)], jobs=1)[0]
    # a lease long enough that only the old writer's own word ends the
    # quarantine in this test (expiry would be counted, and is asserted 0)
    c = Cluster(bins, wd, model, n_prefill=2, n_decode=1, local_prefill_tokens=0,
                lease_ms=60000)
    victim_p = None
    try:
        c.start()
        dname = c.decodes[0]
        d_base = c.wait_idle()[dname]
        base_usable = d_base["free_blocks"] + d_base["evictable_blocks"]
        h = c.loadgen_start([(prompt, 6)], ["--no-ignore-eos"], name="first", timeout=120)
        victim = None
        deadline = time.time() + 60
        while time.time() < deadline and victim is None and h[0].poll() is None:
            for p in c.prefills:
                if c.stats(p).get("computing"):
                    victim = p
                    break
            time.sleep(0.01)  # polling the stats files, not synchronization
        check(victim is not None, "no prefill node was seen computing the prompt")
        victim_p = [p for n, p in c.procs if n == victim][0]
        killgroup(victim_p, signal.SIGSTOP)
        survivor = [p for p in c.prefills if p != victim][0]
        print("stopped %s mid-prefill; %s should take over" % (victim, survivor))
        rc, outs, log = c.loadgen_wait(h)
        print(log)
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        o = outs.get(0)
        check(o is not None and not diff_output(o, ref), "the request: %s" % (
            diff_output(o, ref) if o else "no output"))

        # the old writer is still stopped: its blocks stay quarantined
        n_uncached = (args.tokens + 15) // 16
        wait_for("the decode node's stats after the request",
                 lambda: c.stats(dname).get("done", 0) >= 1 and
                 c.stats(dname).get("batch") == 0, timeout=20)
        d = c.stats(dname)
        print("while %s is stopped: %s" % (victim, {k: d.get(k) for k in (
            "requests", "quarantined", "reserved_blocks", "retry_quarantines",
            "retry_quarantined_blocks", "reserve_renewals")}))
        check(d.get("reserve_renewals") == 1, "no retry on the reservation: %s" % d)
        check(d.get("retry_quarantines") == 1 and
              d.get("retry_quarantined_blocks") == n_uncached,
              "the retry did not quarantine the old writer's %d blocks: %s" % (n_uncached, d))
        check(d.get("requests") == 1 and d.get("quarantined") == 1 and
              d.get("reserved_blocks") == n_uncached,
              "the old writer's blocks were not held while it may still write: %s" % d)
        with open(c.logs[dname]) as f:
            dlog = f.read()
        check("%d of them fresh" % n_uncached in dlog,
              "the survivor was not given fresh blocks:\n%s" % dlog[-3000:])

        # continued: its own KV_ABORT / KV_READY fences the quarantine
        killgroup(victim_p, signal.SIGCONT)
        wait_for("the quarantine to end", lambda: c.stats(dname).get("requests") == 0 and
                 c.stats(dname).get("reserved_blocks") == 0, timeout=30)
        d = c.stats(dname)
        check(d.get("quarantines_fenced") == 1 and d.get("quarantines_expired") == 0,
              "the quarantine did not end by the old writer's word: %s" % d)
        wait_for("%s to register again" % victim,
                 lambda: victim in {n["name"] for n in (c.status(timeout_ms=1000) or {}).get(
                     "nodes", []) if n.get("alive")}, timeout=30)
        rc, outs, log = c.loadgen([(prompt, 6)], ["--no-ignore-eos"], name="again", timeout=120)
        check(rc == 0 and outs.get(0, {}).get("status") == 0, "second run failed:\n%s" % log)
        check(not diff_output(outs[0], ref), "second run: %s" % diff_output(outs[0], ref))
        d = c.wait_idle()[dname]
        check(d["free_blocks"] + d["evictable_blocks"] == base_usable,
              "decode pool: free %d + evictable %d, baseline %d" % (
                  d["free_blocks"], d["evictable_blocks"], base_usable))
        print("retry fence: %d blocks quarantined for the stopped writer, released by its own "
              "notification on SIGCONT; cached tokens on the second run: %s" % (
                  n_uncached, outs[0].get("cached_tokens")))
        c.check_alive()
    finally:
        if victim_p is not None and victim_p.poll() is None:
            killgroup(victim_p, signal.SIGCONT)
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
