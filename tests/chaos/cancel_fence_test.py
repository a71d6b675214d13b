#!/usr/bin/env python3
"""cancel_fence_test.py - a canceled (or abandoned) request whose prefill
node may still write into the decode node's blocks: the blocks stay
quarantined until that writer is fenced, and a writer that was stopped for
longer than it may hold its write lease writes nothing when it wakes.

1 prefill + 1 decode node, an 8-layer hidden-512 model, a 140-block decode
pool: a 1,600-token prompt takes 102 of them, short prompts (prefilled on
the decode node itself, below local_prefill_tokens) fit in the rest.

Phase A, cancel: once the prefill node is seen computing the long prompt it
is SIGSTOPped and its client disconnects (the router cancels the request on
both nodes; the prefill node reads its cancel only when continued).  Short
prompts are driven through the cluster for more than the 2 s the decode
node used to hold such blocks.  Asserted: the 102 blocks are still held
(one cancel quarantine, counted, and reported in the heartbeat to the
router's status); the short prompts equal `kvrail run`; continued, the
prefill node's KV_ABORT fences the quarantine - and before that, a HELLO
sent under its name by a peer the router never introduced, claiming it
restarted, does not (quarantines_fenced, nothing
expired) and the pool is back at its baseline.

Phase B, a writer nobody cancels: the prefill node is SIGSTOPped mid-prefill
of another long prompt and the router is killed and restarted (the new
router never heard of the request, so the prefill node gets no cancel).
The decode node's lease runs out: the request fails there but its blocks
are fenced the same way (a lease quarantine).  Short prompts run through
the new router and enter the decode node's prefix cache; the prefill node
is continued: it finds it sent no sign of life for over half its lease and
writes nothing (self_fenced), so the short prompts sent again - served
from their cached blocks - still equal `kvrail run`.  Before this fence
the decode node freed the blocks at the lease's end and the woken prefill
node wrote its remaining layers into them (the cached prefixes of other
requests): the second run differed.
"""
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import (check, Cluster, killgroup, reference, ROGUE, run, run_main,  # noqa: E402
                         SLOW_MODEL, stop_group, test_start, TOKENS, wait_for)

LEASE_MS = 12000
POOL = 140


def short_prompts(seed, n=12):
    rng = random.Random(seed)
    return [([rng.randrange(4, 512) for _ in range(100)], 8) for _ in range(n)]


def computing_prefill(c, h, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and h[0].poll() is None:
        if c.stats(c.prefills[0]).get("computing"):
            return True
        time.sleep(0.01)  # polling the stats file, not synchronization
    return False


def run_short(c, prompts, refs, name):
    rc, outs, log = c.loadgen(prompts, ["--no-ignore-eos", "--concurrency", "2"], name=name,
                              timeout=120)
    check(rc == 0, "%s: kvrail-loadgen exit %d:\n%s" % (name, rc, log))
    for i, ref in enumerate(refs):
        o = outs.get(i)
        check(o is not None and o["status"] == 0, "%s: prompt %d failed: %s" % (name, i, o))
        check(o["tokens"] == ref, "%s: prompt %d: cluster %s, kvrail run %s (its blocks were "
              "written by a writer that was not fenced)" % (name, i, o["tokens"], ref))
    return outs


def ended(c, name):
    p = c.stats(name)
    return p.get("prefills_ok", 0) + p.get("prefills_failed", 0) + p.get("prefills_canceled", 0)


def node_status(c, name):
    st = c.status(timeout_ms=2000) or {}
    return {n["name"]: n for n in st.get("nodes", [])}.get(name, {})


def main():
    args, bins, wd, model = test_start("kvr-cancel-fence-", [ROGUE, TOKENS], SLOW_MODEL)
    rng = random.Random(21)
    long_a = [rng.randrange(4, 512) for _ in range(args.tokens)]
    long_b = [rng.randrange(4, 512) for _ in range(args.tokens)]
    short_a, short_b = short_prompts(31), short_prompts(32)
    refs = reference(bins, model, short_a + short_b, jobs=2)
    ref_a, ref_b = refs[:len(short_a)], refs[len(short_a):]
    # prompt blocks + the paged headroom, at most the whole request's
    n_victim = min((args.tokens + 15) // 16 + 2, (args.tokens + 6 + 15) // 16)
    # the router does not declare the stopped prefill node dead (no retry):
    # only the cancel (A) and the lease (B) act on the decode node
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, pool_blocks=POOL,
                local_prefill_tokens=200, lease_ms=LEASE_MS, heartbeat_timeout_ms=60000)
    pname, dname = c.prefills[0], c.decodes[0]
    victim_p = None
    try:
        c.start()
        victim_p = [p for n, p in c.procs if n == pname][0]
        d_base = c.wait_idle()[dname]
        base_usable = d_base["free_blocks"] + d_base["evictable_blocks"]

        # ---- phase A: cancel while the writer is stopped ----
        h = c.loadgen_start([(long_a, 6)], ["--no-ignore-eos"], name="victim-a", timeout=120)
        check(computing_prefill(c, h), "the prefill node was not seen computing the long prompt")
        killgroup(victim_p, signal.SIGSTOP)
        stop_group(h[0], grace=0)  # the client goes away: the router cancels the request
        wait_for("the decode node to see the cancel",
                 lambda: c.stats(dname).get("canceled", 0) >= 1, timeout=20)
        t_cancel = time.time()
        d = c.stats(dname)
        check(d.get("cancel_quarantines") == 1 and d.get("cancel_quarantined_blocks") == n_victim,
              "the cancel did not quarantine the %d blocks the stopped writer holds: %s" %
              (n_victim, {k: d.get(k) for k in ("cancel_quarantines",
                                                "cancel_quarantined_blocks", "quarantined")}))
        # load, for longer than the old 2 s hold, while the writer is stopped
        rounds = 0
        while rounds == 0 or time.time() - t_cancel < 2.5:
            run_short(c, short_a, ref_a, "short-a%d" % rounds)
            rounds += 1
        d = c.stats(dname)
        print("phase A, %.1f s after the cancel, %d rounds of load: %s" % (
            time.time() - t_cancel, rounds, {k: d.get(k) for k in (
                "quarantined", "quarantined_blocks", "cancel_quarantines", "quarantines_expired",
                "reserved_blocks")}))
        check(d.get("quarantined") == 1 and d.get("quarantined_blocks") == n_victim and
              d.get("quarantines_expired") == 0,
              "the stopped writer's blocks were released while it may still write: %s" % d)
        # a HELLO under the stopped writer's name claiming a restart (any peer
        # that reaches the transfer engine can send one; here with auth:
        # none, no token) must not end its quarantine: only the router's
        # word (a Reserve naming a new incarnation) does
        addr = c.stats(dname).get("transfer_address", "")
        r = run([args.rogue, "--xfer-connect", addr, "--xfer-hello", "%s:999" % pname],
                timeout=30)
        check(r.returncode == 0 and "XFER KVR_OK KVR_OK" in r.stdout,
              "kvr-rogue-peer --xfer-hello: %s %s" % (r.stdout, r.stderr[-300:]))
        wait_for("the decode node to read the HELLO",
                 lambda: "prefill node '%s' refused" % pname in open(c.logs[dname]).read(),
                 timeout=20)
        d = c.stats(dname)
        check(d.get("quarantined") == 1 and d.get("quarantines_fenced") == 0,
              "a HELLO under %s's name ended its quarantine: %s" % (pname, d))
        print("a HELLO claiming %s restarted (from a peer the router never introduced): the "
              "quarantine holds" % pname)
        # the decode node reports its quarantine in its heartbeat, and `kvrail
        # status --json` shows it
        wait_for("the router's status to show the quarantined blocks",
                 lambda: node_status(c, dname).get("quarantined_blocks") == n_victim,
                 timeout=10)
        killgroup(victim_p, signal.SIGCONT)
        wait_for("the writer's KV_ABORT to fence the quarantine",
                 lambda: c.stats(dname).get("quarantined") == 0, timeout=30)
        d = c.stats(dname)
        check(d.get("quarantines_fenced") == 1 and d.get("quarantines_expired") == 0,
              "the quarantine did not end by the writer's own word: %s" % d)
        run_short(c, short_a, ref_a, "short-a-again")
        d = c.wait_idle()[dname]
        check(d["free_blocks"] + d["evictable_blocks"] == base_usable,
              "decode pool after phase A: free %d + evictable %d, baseline %d" % (
                  d["free_blocks"], d["evictable_blocks"], base_usable))

        # ---- phase B: nobody cancels (router restarted), the lease runs out ----
        ended_before = ended(c, pname)
        h = c.loadgen_start([(long_b, 6)], ["--no-ignore-eos"], name="victim-b", timeout=120)
        check(computing_prefill(c, h), "the prefill node was not seen computing the second prompt")
        killgroup(victim_p, signal.SIGSTOP)
        c.kill("router")
        c.procs = [(n, p) for n, p in c.procs if n != "router" or p.poll() is None]
        os.replace(c.logs["router"], c.logs["router"] + ".killed")
        c._start("router", [bins.router, "--config", c.config, "--node", "router"])
        stop_group(h[0], grace=0)
        wait_for("the decode node to register with the new router",
                 lambda: node_status(c, dname).get("alive"), timeout=30)
        wait_for("the reservation's lease to run out on the decode node",
                 lambda: c.stats(dname).get("expired", 0) >= 1, timeout=3 * LEASE_MS / 1000)
        d = c.stats(dname)
        print("phase B, lease expired: %s" % {k: d.get(k) for k in (
            "expired", "lease_quarantines", "lease_quarantined_blocks", "quarantined",
            "reserved_blocks")})
        run_short(c, short_b, ref_b, "short-b")
        killgroup(victim_p, signal.SIGCONT)
        # the woken writer ends its request (self-fenced): KV_ABORT or expiry
        wait_for("the woken prefill node to end the request",
                 lambda: c.stats(pname).get("active") == 0 and ended(c, pname) > ended_before,
                 timeout=60)
        wait_for("the decode node's quarantine to end",
                 lambda: c.stats(dname).get("quarantined") == 0, timeout=3 * LEASE_MS / 1000)
        # served from the prefix cache: the blocks the woken writer would
        # have overwritten
        outs = run_short(c, short_b, ref_b, "short-b-again")
        cached = sum(o.get("cached_tokens", 0) for o in outs.values())
        p = c.stats(pname)
        d = c.stats(dname)
        print("phase B, after SIGCONT: prefill %s; decode %s; %d prompt tokens served from the "
              "cache" % ({k: p.get(k) for k in ("self_fenced", "prefills_failed")},
                         {k: d.get(k) for k in ("lease_quarantines", "quarantines_fenced",
                                                "quarantines_expired", "tokens_revoked")}, cached))
        check(cached > 0, "the second short run reused no cached block: the test shows nothing")
        check(p.get("self_fenced", 0) >= 1,
              "the woken prefill node did not give up writing after half a lease of silence: %s" % p)
        check(d.get("lease_quarantines") == 1 and d.get("lease_quarantined_blocks") == n_victim,
              "the expired reservation's blocks were not fenced: %s" % d)
        check(d.get("quarantines_fenced", 0) + d.get("quarantines_expired", 0) == 2,
              "two quarantines, not both ended: %s" % d)
        # a fence that ran out revokes the writer's token; a revocation the
        # engine logs names the node the token was given to
        with open(os.path.join(c.dir, dname + ".log")) as f:
            text = f.read()
        check("a peer not named at allow" not in text,
              "the decode node gave a transfer token without naming its prefill node")
        # and the router's status shows both (from the heartbeats)
        wait_for("kvrail status to show the prefill node's self-fence and the ended quarantines",
                 lambda: node_status(c, pname).get("self_fenced", 0) >= 1 and
                 node_status(c, dname).get("quarantines_fenced", 0) +
                 node_status(c, dname).get("quarantines_expired", 0) == 2, timeout=10)
        d = c.wait_idle()[dname]
        check(d["free_blocks"] + d["evictable_blocks"] == base_usable,
              "decode pool at the end: free %d + evictable %d, baseline %d" % (
                  d["free_blocks"], d["evictable_blocks"], base_usable))
        c.check_alive()
        print("cancel fence: %d blocks held past the old 2 s for a stopped writer and released by "
              "its KV_ABORT; a writer woken after its lease wrote nothing" % n_victim)
    finally:
        if victim_p is not None and victim_p.poll() is None:
            killgroup(victim_p, signal.SIGCONT)
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
