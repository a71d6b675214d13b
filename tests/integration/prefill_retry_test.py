#!/usr/bin/env python3
"""prefill_retry_test.py - a prefill node killed mid-prefill: the router
retries on the other prefill node ON THE SAME RESERVATION of the decode node.

2 prefill + 1 decode node, an 8-layer hidden-512 model and one prompt of
--tokens tokens (long enough that the prefill takes a while).  As soon as
one prefill node's stats show it computing the prompt, it is killed with
SIGKILL.  The router finds it dead (heartbeat timeout) and re-sends the
Prefill to the other prefill node under the same dispatch id with the
attempt counted up, after a Reserve(attempt 1) that renews the decode
node's lease on the blocks it already reserved.  Asserted:
- the request completes, token for token equal to `kvrail run`;
- the decode node reserved ONCE (stats: reservations == 1), renewed that
  reservation once for the retry (reserve_renewals == 1) and got its KV
  from a prefill node (remote_prefills == 1, nothing prefilled locally);
- the router logged the retry as attempt 1 on the survivor, and did not
  dispatch the request afresh (its retry count is 1: no second dispatch);
- the survivor computed it (prefills_ok == 1);
- every pool is back at its baseline afterwards: the decode node holds no
  request and no referenced block, its free + evictable blocks are every
  usable block; the survivor's staging pool is as it was before.
"""
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, Cluster, add_bin_args, check, make_model, reference,  # noqa
                         run_main, workdir, diff_output)


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--tokens", type=int, default=1600)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-prefill-retry-")
    model = make_model(bins, wd, ["--layers", "8", "--hidden", "512", "--heads", "8",
                                  "--kv-heads", "2", "--intermediate", "1024", "--seed", "5"])
    rng = random.Random(11)
    prompt = [rng.randrange(4, 512) for _ in range(args.tokens)]
    ref = reference(bins, model, [(prompt, 6)], jobs=1)[0]
    c = Cluster(bins, wd, model, n_prefill=2, n_decode=1, local_prefill_tokens=0)
    try:
        c.start()
        dname = c.decodes[0]
        d0 = c.stats(dname)
        p0 = {p: c.stats(p) for p in c.prefills}
        check(d0.get("reservations") == 0 and d0.get("requests") == 0,
              "decode node not fresh: %s" % d0)
        h = c.loadgen_start([(prompt, 6)], ["--no-ignore-eos"], name="retry", timeout=120)
        victim = None
        deadline = time.time() + 60
        while time.time() < deadline and victim is None and h[0].poll() is None:
            for p in c.prefills:
                if c.stats(p).get("computing"):
                    victim = p
                    break
            time.sleep(0.01)  # polling the stats files, not synchronization
        check(victim is not None, "no prefill node was seen computing the prompt")
        c.kill(victim)
        survivor = [p for p in c.prefills if p != victim][0]
        print("killed %s mid-prefill; %s should take over" % (victim, survivor))
        rc, outs, log = c.loadgen_wait(h)
        print(log)
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        o = outs.get(0)
        check(o is not None and o["status"] == 0, "the request failed: %s" % (o,))
        check(not o["local_prefill"], "the prompt was prefilled on the decode node")
        check(not diff_output(o, ref), "the request: %s" % diff_output(o, ref))

        # the pools back at baseline (the decode node's prompt blocks may stay
        # cached: evictable, so free + evictable is the baseline)
        deadline = time.time() + 15
        while True:
            d = c.stats(dname)
            ps = c.stats(survivor)
            idle = (d.get("requests") == 0 and d.get("reserved_blocks") == 0 and
                    ps.get("active") == 0 and ps.get("queued") == 0 and
                    ps.get("staging_referenced") == 0)
            if idle or time.time() > deadline:
                break
            time.sleep(0.1)
        check(d.get("requests") == 0 and d.get("reserved_blocks") == 0,
              "the decode node still holds the request: %s" % d)
        # (the pool is pre-faulted in the background: the usable blocks are
        # those below its faulted horizon, all of them once it is done)
        d_base = d.get("pool_faulted_blocks", d["total_blocks"])
        check(d["free_blocks"] + d["evictable_blocks"] == d_base,
              "decode pool: free %d + evictable %d, baseline %d usable blocks" % (
                  d["free_blocks"], d["evictable_blocks"], d_base))
        sp0 = p0[survivor]
        check(ps.get("active") == 0 and ps.get("queued") == 0 and
              ps.get("staging_referenced") == 0 and
              ps["staging_free"] + ps["staging_cached"] ==
              sp0["staging_free"] + sp0["staging_cached"],
              "%s's staging pool not at baseline: %s (before %s)" % (survivor, ps, sp0))

        # one reservation, renewed once for the retry
        check(d.get("reservations") == 1, "the decode node reserved %s times (want 1): the "
              "retry reserved again instead of reusing the reservation" % d.get("reservations"))
        check(d.get("reserve_renewals") == 1,
              "reserve_renewals %s (want 1: the retry renews the lease)" % d.get("reserve_renewals"))
        check(d.get("remote_prefills") == 1 and d.get("local_prefills") == 0,
              "decode node: remote %s local %s" % (d.get("remote_prefills"),
                                                    d.get("local_prefills")))
        check(ps.get("prefills_ok") == 1, "%s: %s" % (survivor, ps))
        with open(c.logs["router"]) as f:
            rlog = f.read()
        check("prefill attempt 1 on %s" % survivor in rlog,
              "the router did not retry on %s's reservation:\n%s" % (dname, rlog[-3000:]))
        check("retry 2 of" not in rlog, "the prefill was retried more than once:\n%s" % rlog[-3000:])
        st = c.status()
        rs = (st or {}).get("retries")
        if rs is not None:
            check(rs == 1, "router retries %s, want 1" % rs)
        with open(c.logs[dname]) as f:
            dlog = f.read()
        check("prefill attempt 1 from '%s'" % survivor in dlog,
              "the decode node did not log the renewal:\n%s" % dlog[-3000:])
        print("decode node: reservations %d, renewals %d, lease renewals by KV_PROGRESS %d, "
              "stale notifications %d" % (d["reservations"], d["reserve_renewals"],
                                          d.get("lease_renewals", 0),
                                          d.get("stale_notifications", 0)))
        for name, p in c.procs:
            if name != victim:
                check(p.poll() is None, "%s died too:\n%s" % (name, c.tail(name)))
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
