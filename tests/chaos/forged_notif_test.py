#!/usr/bin/env python3
"""forged_notif_test.py - a registered prefill node, with its own key and
its own transfer token, speaks for another prefill node's request: the
decode node takes a notification about a reservation only under the token
the router gave for that reservation's writer (issue 12).

With `auth: curve`: the router, decode0, and kvr-rogue-peer --forge
registered as prefill1 with prefill1's own key.  prefill0 is not yet up, so
the router gives a first long prompt (the bait) to the rogue: with the
PrefillTarget it gets decode0's address and the token of the pair
(prefill1, decode0), connects with it (admitted by decode0's transfer
engine), and holds the request (its in-flight tokens make the router give
the next prompts to prefill0).  Then prefill0 starts; a long prompt (the
victim) is dispatched to it and prefill0 is SIGSTOPped mid-prefill.

The rogue then sends, under its own token, a KV_ABORT and a KV_PROGRESS
naming prefill0 for every request id and first block (brute force: it
knows neither), twice: while the victim's reservation is in flight, and
after its client went away and the decode node quarantined the blocks
prefill0 may still be writing.  Asserted: decode0 drops and counts them
(forged_notifications; bad_notifications in `kvrail status`); the forged
KV_ABORT did not mark the reservation given up, so the cancel quarantines
the victim's blocks (with the old decode node it did not: the forged abort
had released them to the pool while prefill0 was still writing); the
quarantine survives the second forgery; continued, prefill0's own KV_ABORT
fences it; and prompts run afterwards (local and through prefill0) equal
`kvrail run`.
"""
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import (check, check_outputs, Cluster, killgroup, reference, ROGUE,  # noqa: E402
                         run, run_main, SLOW_MODEL, spawn, stop_group, test_start, wait_for)

LEASE_MS = 40000
POOL = 200


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def node_status(c, name):
    st = c.status(timeout_ms=2000) or {}
    return {n["name"]: n for n in st.get("nodes", [])}.get(name, {})


def main():
    args, bins, wd, model = test_start("kvr-forged-notif-", [ROGUE], SLOW_MODEL)
    rng = random.Random(41)
    bait = [rng.randrange(4, 512) for _ in range(1500)]
    victim = [rng.randrange(4, 512) for _ in range(1200)]
    checks = [([rng.randrange(4, 512) for _ in range(100)], 8) for _ in range(6)] + \
        [([rng.randrange(4, 512) for _ in range(300)], 8)]
    refs = reference(bins, model, checks, jobs=2)
    c = Cluster(bins, wd, model, n_prefill=2, n_decode=1, pool_blocks=POOL,
                local_prefill_tokens=200, lease_ms=LEASE_MS, heartbeat_timeout_ms=60000,
                extra_yaml="auth: curve\nkeys: keys\n")
    r = run([bins.kvrail, "keygen", "--config", c.config, "--client", "tester"], timeout=30)
    check(r.returncode == 0, "kvrail keygen failed: %s %s" % (r.stdout, r.stderr))
    keys = os.path.join(wd, "keys")
    os.environ["KVRAIL_ROUTER_KEY"] = os.path.join(keys, "router.pub")
    os.environ["KVRAIL_CLIENT_KEY"] = os.path.join(keys, "clients", "tester.key")
    c.prefills = []  # prefill0 starts later; prefill1 is the rogue
    rogue = bait_h = victim_h = victim_p = None
    try:
        c.start()
        dname = c.decodes[0]
        log = open(c.logs["router"]).read()
        m = re.search(r"node %s registered: decode, \S+ transport, layout (\d+)x(\d+)x(\d+) "
                      r"(\S+) bs \d+, \d+ blocks, model (\S+)" % dname, log)
        check(m, "no registration line of %s in the router's log" % dname)
        out = os.path.join(wd, "rogue.out")
        rogue = spawn([args.rogue, "--endpoint", c.node_ep, "--name", "prefill1", "--role",
                       "prefill", "--router-pub", os.path.join(keys, "router.pub"), "--key",
                       os.path.join(keys, "prefill1.key"), "--layers", m.group(1), "--kv-heads",
                       m.group(2), "--head-dim", m.group(3), "--dtype", m.group(4),
                       "--fingerprint", m.group(5), "--forge", "prefill0", "--listen-ms",
                       "300000"], stdin=subprocess.PIPE, stdout=open(out, "w"), text=True,
                      stderr=subprocess.STDOUT)
        wait_for("the rogue registered", lambda: any(ln.startswith("REPLY ") for ln in lines(out)),
                 timeout=20)
        reply = [ln for ln in lines(out) if ln.startswith("REPLY ")][0]
        check(reply.startswith("REPLY 0 "), "the rogue (prefill1's own key) was not registered: "
              "%s" % reply)
        # the bait: the rogue is the only prefill node; it gets its own token
        bait_h = c.loadgen_start([(bait, 4)], ["--no-ignore-eos"], name="bait", timeout=120)
        wait_for("the rogue to get its transfer token with a PrefillTarget",
                 lambda: any(ln.startswith("TOKEN ") for ln in lines(out)), timeout=30)
        tok = [ln for ln in lines(out) if ln.startswith("TOKEN ")][0]
        check(tok == "TOKEN %s %s KVR_OK" % (dname, tok.split()[2]),
              "the rogue did not connect to %s with its own token: %s" % (dname, tok))

        c.prefills = ["prefill0"]
        victim_p = c._start("prefill0", [bins.prefill, "--config", c.config, "--node",
                                         "prefill0", "--stats-file", c.stats_path("prefill0")])
        wait_for("prefill0 registered", lambda: c.stats("prefill0").get("registered") and
                 node_status(c, "prefill0").get("alive"), timeout=40)

        # the victim, on prefill0 (the rogue holds the bait's 1,500 tokens)
        victim_h = c.loadgen_start([(victim, 6)], ["--no-ignore-eos"], name="victim",
                                   timeout=120)
        wait_for("prefill0 computing the victim",
                 lambda: c.stats("prefill0").get("computing"), timeout=60, step=0.01)
        killgroup(victim_p, signal.SIGSTOP)
        # (prefill0 sends KV_PROGRESS every third of the 40 s lease: none yet)
        renewals = c.stats(dname).get("lease_renewals", 0)

        def forge(n_before):
            rogue.stdin.write("FORGE 1 32 %d\n" % POOL)
            rogue.stdin.flush()
            wait_for("the rogue's forgery sent",
                     lambda: len([ln for ln in lines(out) if ln.startswith("FORGED ")]) > n_before,
                     timeout=60)
            return [ln for ln in lines(out) if ln.startswith("FORGED ")][-1]

        f1 = forge(0)
        check(f1.split()[2] == "KVR_OK", "the rogue's notifications were not sent: %s" % f1)
        # the victim's reservation is the only one the forgeries name (the
        # bait is the rogue's own): its KV_ABORT and KV_PROGRESS, dropped
        wait_for("%s to read the forged notifications" % dname,
                 lambda: c.stats(dname).get("forged_notifications", 0) >= 2 or
                 c.stats(dname).get("lease_renewals", 0) > renewals, timeout=20)
        d = c.stats(dname)
        check(d.get("lease_renewals") == renewals,
              "a KV_PROGRESS forged by prefill1 renewed prefill0's reservation: %s" % {
                  k: d.get(k) for k in ("lease_renewals", "forged_notifications")})
        check(d.get("forged_notifications") == 2 and d.get("bad_notifications", 0) >= 2,
              "the forged KV_ABORT and KV_PROGRESS naming the victim were not counted: %s" % d)
        print("forgery 1 (in flight): %s sent, %s: %s" % (f1.split()[1], dname, {
            k: d.get(k) for k in ("forged_notifications", "bad_notifications", "lease_renewals",
                                  "transfer_refused")}))

        # the victim's client goes away: the router cancels on both nodes;
        # prefill0 (stopped) may still write: the blocks are quarantined,
        # unless a forged KV_ABORT was taken as prefill0's word
        stop_group(victim_h[0], grace=0)
        victim_h = None
        wait_for("%s to see the cancel" % dname, lambda: c.stats(dname).get("canceled", 0) >= 1,
                 timeout=20)
        d = c.stats(dname)
        check(d.get("cancel_quarantines") == 1 and d.get("quarantined") == 1,
              "the victim's blocks were not quarantined at the cancel (a forged KV_ABORT from "
              "prefill1 was taken for prefill0's): %s" % {
                  k: d.get(k) for k in ("cancel_quarantines", "quarantined", "forged_notifications")})
        n_forged = d["forged_notifications"]
        f2 = forge(1)
        check(f2.split()[2] == "KVR_OK", "the rogue's notifications were not sent: %s" % f2)
        wait_for("%s to drop the second forgery" % dname,
                 lambda: c.stats(dname).get("forged_notifications", 0) >= n_forged + 2, timeout=20)
        d = c.stats(dname)
        print("forgery 2 (quarantined): %s" % {k: d.get(k) for k in (
            "forged_notifications", "quarantined", "quarantines_fenced", "quarantines_expired")})
        check(d.get("quarantined") == 1 and d.get("quarantines_fenced") == 0 and
              d.get("quarantines_expired") == 0,
              "a KV_ABORT forged by prefill1 ended prefill0's quarantine: %s" % d)
        wait_for("kvrail status to show %s's dropped notifications" % dname,
                 lambda: node_status(c, dname).get("bad_notifications", 0) >=
                 d["forged_notifications"], timeout=10)

        killgroup(victim_p, signal.SIGCONT)
        wait_for("prefill0's own KV_ABORT to fence the quarantine",
                 lambda: c.stats(dname).get("quarantined") == 0, timeout=30)
        d = c.stats(dname)
        check(d.get("quarantines_fenced") == 1 and d.get("quarantines_expired") == 0,
              "the quarantine did not end by prefill0's own word: %s" % d)

        # outputs: local prefills, and one through prefill0
        rc, outs, lg = c.loadgen(checks, ["--no-ignore-eos", "--concurrency", "2"],
                                 name="after", timeout=120)
        check(rc == 0, "kvrail-loadgen exit %d:\n%s" % (rc, lg))
        check_outputs(outs, refs, what="after the forgeries")
        # the node rewrites its stats file periodically: wait for the one
        # that counts the long prompt (it fails naming the last one read)
        wait_for("prefill0's stats to count the long check prompt",
                 lambda: c.stats("prefill0").get("prefills_ok", 0) >= 1, timeout=10)
        stop_group(bait_h[0], grace=0)  # the bait's reservation: canceled, fenced by its lease
        bait_h = None
        d = c.stats(dname)
        print("forged notifications: %d dropped by %s; prefill0's quarantine held and ended by "
              "its own KV_ABORT; %d prompts equal kvrail run" % (
                  d.get("forged_notifications", 0), dname, len(refs)))
        c.check_alive()
    finally:
        if victim_p is not None and victim_p.poll() is None:
            killgroup(victim_p, signal.SIGCONT)
        for h in (bait_h, victim_h):
            if h:
                stop_group(h[0], grace=0)
        if rogue is not None:
            stop_group(rogue, grace=0)
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
