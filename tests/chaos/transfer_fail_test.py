"""transfer_fail_test.py - a KV transfer that fails after the prefill node's
first PrefillDone is retried by the router at once, on another decode node,
with the blame on the decode node (issue 12).

A real prefill node reports such a failure with a second PrefillDone
(status: the transfer's error; decode_fault: the cause is the decode node),
rather than leaving the decode node's lease to run out.  Making a real
transfer fail exactly after that first PrefillDone is a race with the
prefill node's own progress (on one host UCX writes through shared memory
and a SIGKILLed decode node is not even noticed), so the prefill node here
is kvr-rogue-peer --fail-after-done: a registered prefill node that answers
every PrefillTarget with exactly those two messages, deterministically.  The
two decode nodes are kvr-rogue-peer --reserve (they answer Reserve and
heartbeat; they print every message the router sends them).  The router and
everything it does are real.

Asserted, with a lease (120 s) far longer than the client's timeout (30 s),
so that a router that waited for the lease fails the test:
 - the request ends with an error that names the failed transfer and both
   decode nodes (first and last failure), not a timeout;
 - the first failure moved the request to the other decode node (a decode
   node is avoided once it failed it; the third attempt has both failed, so
   either): every decode node got a NodeCancel for its reservation and as
   many Reserves as attempts went to it (three: prefill_retries is 2);
 - the router's metrics blame the decode nodes 3 times in all, the prefill
   node never, and a decode node blamed twice in a row is cooled down.
"""
import os
import re
import subprocess
import time
import urllib.request

from cluster_lib import (check, Cluster, free_port, node_metrics, ROGUE, run, run_main, spawn,
                         stop_group, test_start, wait_for)


def lines(path):
    with open(path) as f:
        return f.read().splitlines()


def main():
    args, bins, wd, model = test_start("kvr-transfer-fail-", [ROGUE])
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=2, lease_ms=120000,
                extra_yaml="auth: none\n")
    mport = free_port()
    with open(c.config) as f:
        y = f.read()
    y = y.replace("  - name: router\n    role: router\n",
                  "  - name: router\n    role: router\n    metrics_port: %d\n" % mport)
    with open(c.config, "w") as f:
        f.write(y)
    c.prefills, c.decodes = [], []  # all three are kvr-rogue-peer
    rogues = {}
    try:
        c.start()
        for name, role, extra in (("decode0", "decode", ["--reserve"]),
                                  ("decode1", "decode", ["--reserve"]),
                                  ("prefill0", "prefill", ["--fail-after-done"])):
            out = os.path.join(wd, name + ".rogue")
            rogues[name] = (spawn([args.rogue, "--endpoint", c.node_ep, "--name", name, "--role",
                                   role, "--blocks", "4096", "--black-hole", "--listen-ms",
                                   "120000"] + extra, stdout=open(out, "w"),
                                  stderr=subprocess.STDOUT), out)
            wait_for("%s registered" % name,
                     lambda: any(ln.startswith("REPLY ") for ln in lines(out)), timeout=20)
            reply = [ln for ln in lines(out) if ln.startswith("REPLY ")][0]
            check(reply.startswith("REPLY 0 "), "%s not registered: %s" % (name, reply))
        t0 = time.monotonic()
        # past the local-prefill threshold (32 tokens): prefilled on prefill0
        r = run([bins.kvrail, "generate", "--router", c.client_ep, "--max-tokens", "4",
                 "--temperature", "0", "--timeout", "30000",
                 " ".join("word%d" % i for i in range(80))], timeout=60)
        took = time.monotonic() - t0
        check(r.returncode != 0, "the request succeeded with no decode node to take it: %s" %
              r.stdout)
        err = r.stderr
        fails = [ln.split()[1] for ln in lines(rogues["prefill0"][1])
                 if ln.startswith("FAILED-AFTER-DONE")]
        check(len(fails) == 3, "prefill0 failed %d attempts (want 3: prefill_retries 2): %s" %
              (len(fails), fails))
        # the first retry goes to the decode node that did not fail it; the
        # second has both failed (either, as last choices)
        check(fails[0] != fails[1], "the retry did not move to the other decode node: %s" % fails)
        check("failed after the prompt was computed" in err and
              "decode node %s" % fails[0] in err and "decode node %s" % fails[2] in err and
              "TIMEOUT" not in err,
              "the error does not name the first and last failed transfer: %s" % err)
        twice = max(("decode0", "decode1"), key=fails.count)
        for d in ("decode0", "decode1"):
            got = lines(rogues[d][1])
            n_res = got.count("RECEIVED RESERVE")
            check(n_res == fails.count(d), "%s got %d Reserves, %d attempts went to it" %
                  (d, n_res, fails.count(d)))
            check("RECEIVED NODE_CANCEL" in got, "%s's reservation was not released: %s" %
                  (d, got))
        ms = wait_for("the decode nodes blamed 3 times in the router's metrics",
                      lambda: (lambda m: m if sum(m.get(("kvrail_node_failures_blamed_total", d), 0)
                                                  for d in ("decode0", "decode1")) == 3 else None)
                      (node_metrics(mport)), timeout=10)
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=10).read()
        check(re.search(rb"^kvrail_router_decode_faults_total(\{[^}]*\})? 3$", body, re.M),
              "kvrail_router_decode_faults_total is not 3")
        check(ms.get(("kvrail_node_failures_blamed_total", "prefill0")) == 0,
              "prefill0 blamed: %s" % ms)
        check(ms.get(("kvrail_node_cooldowns_total", twice)) == 1,
              "%s failed twice in a row and was not cooled down: %s" % (twice, ms))
        print("transfer failed after PrefillDone: the request ended in %.2f s (lease 120 s) "
              "after 3 attempts on %s; decode nodes blamed 3 times, prefill0 0; %s cooled down; "
              "error: %s" % (took, " -> ".join(fails), twice, err.strip()[:240]))
    finally:
        for p, _ in rogues.values():
            stop_group(p, grace=0)
        c.stop()


if __name__ == "__main__":
    run_main(main)
