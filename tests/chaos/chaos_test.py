#!/usr/bin/env python3
"""chaos_test.py - a 2 prefill + 2 decode cluster with CURVE on every socket,
under a steady load of greedy requests with shared prefixes (prompts of
3 to 1,500 tokens, a dozen in flight, kvr-chaos-client through libkvrail-client), while nodes fail one at
a time, each role both ways:

  kill -9 prefill0, restart it;   kill -9 decode1, restart it;
  SIGSTOP prefill1 for longer than the heartbeat timeout, SIGCONT it;
  SIGSTOP decode0 the same way, SIGCONT it;
  SIGSTOP both decode nodes until requests fail at the node level (no live
  decode node within timeouts.queue_ms), SIGCONT them;
  kill -9 the router, restart it on the same endpoints.

Each fault waits until the load has made progress since the last one, and
until the node is back (alive in `kvrail status`) before the next.
Asserted:
- no request hangs: every stream ends by itself before the client's own
  deadline (which is longer than the router's request deadline);
- every request that completes has exactly `kvrail run`'s greedy tokens and
  logprobs (bit for bit); every
  other one failed with a status and a message saying why; with both
  decode nodes gone, requests end with the node-level error (no live
  decode node) - a failure that is not the router's lost connection;
- every fault is detected by the router (the node shown dead) and every
  node rejoins (alive again) and serves requests afterwards (its own
  counters rise after it is back); after the router's restart every node
  registers again and requests complete through it (the streams open at
  the kill end with the lost-connection error, counted as failed);
- once the load is gone, no blocks are stranded: every decode pool holds no
  request and no reserved block, free + evictable blocks are the whole pool
  (only the prefix cache remains), every prefill node is idle.
Printed for the closing note: requests completed / failed (by message) /
hung, outputs identical, and per fault the detection and rejoin times.
"""
import argparse
import calendar
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time

from cluster_lib import (Bins, ClientCluster, Fail, add_bin_args, check, killgroup, make_model,
                         diff_output, reference, run, run_main, spawn, stop_group, wait_for,
                         workdir)

HB_MS, HB_TIMEOUT_MS = 100, 1000
QUEUE_MS = 2500  # a request with no live decode node fails after this
NO_DECODE = "no live decode node"


# the router's log line for a node found gone: dead (heartbeat silence) or
# unresponsive (a Reserve unanswered for the heartbeat timeout)
LOST_RE = r"node %s \(\w+\) is (?:dead|unresponsive)"

def prompts_with_shared_prefixes(n, seed=21, vocab=512):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, vocab) for _ in range(L)] for L in (48, 160, 320, 1100)]
    out = []
    for i in range(n):
        pre = prefixes[i % len(prefixes)] if i % 5 else []
        suf = [rng.randrange(4, vocab) for _ in range(rng.randrange(3, 401))]  # up to 1,500 in all
        out.append((pre + suf, rng.randrange(4, 14)))
    return out


def node_alive(c, name):
    st = c.status(timeout_ms=1000) or {}
    for n in st.get("nodes", []):
        if n.get("name") == name:
            return n.get("alive")
    return None


def proc_of(c, name):
    live = [p for n, p in c.procs if n == name and p.poll() is None]
    return live[-1] if live else None


def restart(c, bins, name):
    c.procs = [(n, p) for n, p in c.procs if n != name or p.poll() is None]
    log = c.logs[name]
    os.replace(log, log + ".%d" % int(time.time() * 1000))
    binary = bins.prefill if name.startswith("prefill") else bins.decode
    c._start(name, [binary, "--config", c.config, "--node", name, "--stats-file",
                    c.stats_path(name)])


def router_event(c, pattern, after):
    """Wall-clock time (s since the epoch) of the first router log line
    matching pattern logged at or after `after`, or None."""
    rx = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z .*" + pattern)
    with open(c.logs["router"]) as f:
        for line in f:
            m = rx.match(line)
            if m:
                t = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + \
                    int(m.group(2)) / 1000.0
                if t >= after - 0.002:
                    return t
    return None


def served(c, name):
    s = c.stats(name)
    return s.get("prefills_ok", 0) if name.startswith("prefill") else s.get("done", 0)


def completed(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if '"status": 0,' in line)
    except OSError:
        return 0


def failed_with(path, text):
    try:
        with open(path) as f:
            return sum(1 for line in f if text in json.loads(line).get("message", ""))
    except (OSError, ValueError):
        return 0


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--client", required=True, help="kvr-chaos-client")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=12)
    args = ap.parse_args()
    bins = Bins(args)
    r = run([bins.kvrail, "keygen", "/nonexistent-dir-for-probe"], timeout=10)
    if "no CURVE" in (r.stderr or ""):
        print("SKIP: libzmq without CURVE: %s" % r.stderr.strip())
        return 77
    wd = workdir("kvr-chaos-")
    model = make_model(bins, wd)
    prompts = prompts_with_shared_prefixes(args.prompts)
    ref = reference(bins, model, prompts, jobs=2)
    c = ClientCluster(bins, wd, model, n_prefill=2, n_decode=2, pool_blocks=1024, lease_ms=3000,
                      local_prefill_tokens=8, extra_yaml="auth: curve\nkeys: keys\n")
    with open(c.config) as f:
        y = f.read()
    y = y.replace("heartbeat_ms: 200", "heartbeat_ms: %d" % HB_MS)
    y = y.replace("heartbeat_timeout_ms: 3000", "heartbeat_timeout_ms: %d\n  prefill_ms: 5000"
                  % HB_TIMEOUT_MS)
    y = y.replace("request_ms: 120000", "request_ms: 30000")
    y = y.replace("queue_ms: 5000", "queue_ms: %d" % QUEUE_MS)
    with open(c.config, "w") as f:
        f.write(y)
    r = run([bins.kvrail, "keygen", "--config", c.config, "--client", "chaos"], timeout=30)
    check(r.returncode == 0, "kvrail keygen failed: %s %s" % (r.stdout, r.stderr))
    keys = os.path.join(wd, "keys")
    os.environ["KVRAIL_ROUTER_KEY"] = os.path.join(keys, "router.pub")
    os.environ["KVRAIL_CLIENT_KEY"] = os.path.join(keys, "clients", "chaos.key")
    pf = os.path.join(wd, "chaos.prompts.jsonl")
    with open(pf, "w") as f:
        for i, (toks, mt) in enumerate(prompts):
            f.write(json.dumps({"id": i, "tokens": toks, "max_tokens": mt}) + "\n")
    of = os.path.join(wd, "chaos.outputs.jsonl")
    stop = os.path.join(wd, "chaos.stop")
    load = None
    faults = []
    ok_run = False
    try:
        c.start()
        t_load = time.monotonic()
        load = spawn([args.client, "--router", c.client_ep, "--prompts", pf, "--outputs", of,
                      "--concurrency", str(args.concurrency), "--timeout-ms", "45000",
                      "--min", "40", "--stop-file", stop],
                     stdout=open(os.path.join(wd, "chaos-client.log"), "w"),
                     stderr=subprocess.STDOUT)
        plan = [("prefill0", "kill"), ("decode1", "kill"), ("prefill1", "stop"),
                ("decode0", "stop")]
        for name, how in plan:
            base = completed(of)
            wait_for("the load to progress before faulting %s" % name,
                     lambda: completed(of) >= base + 12 or load.poll() is not None, timeout=60)
            check(load.poll() is None, "the load ended early:\n%s" % c.tail("router"))
            p = proc_of(c, name)
            t0 = time.time()
            killgroup(p, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            if how == "kill":
                p.wait(timeout=10)
            wait_for("the router to find %s dead" % name, lambda: node_alive(c, name) is False,
                     timeout=30, step=0.02)
            # the router's own clock: when it logged the node dead, and back
            # (registered again, or heartbeating again after SIGCONT; the
            # status polls only synchronize)
            # dead by heartbeat silence, or unresponsive by a Reserve left
            # unanswered: both are the heartbeat timeout, whichever comes first
            t_dead = router_event(c, LOST_RE % name, t0)
            check(t_dead is not None, "the router did not log %s dead or unresponsive" % name)
            t_detect = t_dead - t0
            # a bound only against a hang: the timeout itself is the router's
            check(t_detect < 5 * HB_TIMEOUT_MS / 1000,
                  "%s found dead only after %.1f s" % (name, t_detect))
            t1 = time.time()
            if how == "kill":
                restart(c, bins, name)
            else:
                killgroup(p, signal.SIGCONT)
            before = served(c, name)
            wait_for("%s to rejoin" % name, lambda: node_alive(c, name) is True, timeout=30,
                     step=0.02)
            t_reg = router_event(c, r"node %s (registered|is back)" % name, t1)
            check(t_reg is not None, "the router did not log %s back" % name)
            t_rejoin = t_reg - t1
            faults.append({"node": name, "fault": "kill -9" if how == "kill" else "SIGSTOP",
                           "detect_s": t_detect, "rejoin_s": t_rejoin, "served_before": before})
            print("%s %s: the router found it dead after %.2f s (heartbeat timeout %.1f s), "
                  "back %.2f s after %s" % (
                      how, name, t_detect, HB_TIMEOUT_MS / 1000, t_rejoin,
                      "the restart" if how == "kill" else "SIGCONT"))
        # both decode nodes gone at once, longer than a request may queue:
        # requests must fail at the node level with a clear error (never
        # hang), then both come back
        base = completed(of)
        wait_for("the load to progress before stopping both decode nodes",
                 lambda: completed(of) >= base + 12 or load.poll() is not None, timeout=60)
        check(load.poll() is None, "the load ended early:\n%s" % c.tail("router"))
        nd0 = failed_with(of, NO_DECODE)
        t0 = time.time()
        dps = [proc_of(c, n) for n in c.decodes]
        for p in dps:
            killgroup(p, signal.SIGSTOP)
        for n in c.decodes:
            wait_for("the router to find %s dead" % n, lambda: node_alive(c, n) is False,
                     timeout=30, step=0.02)
        t_detect = max(router_event(c, LOST_RE % n, t0) or t0 + 99
                       for n in c.decodes) - t0
        # state, not time: until requests have ended with the node-level error
        wait_for("requests to fail with '%s'" % NO_DECODE,
                 lambda: failed_with(of, NO_DECODE) > nd0, timeout=30, step=0.05)
        n_nodec = failed_with(of, NO_DECODE) - nd0
        t1 = time.time()
        for p in dps:
            killgroup(p, signal.SIGCONT)
        before = {n: served(c, n) for n in c.decodes}
        for n in c.decodes:
            wait_for("%s to rejoin" % n, lambda: node_alive(c, n) is True, timeout=30, step=0.02)
        t_back = max(router_event(c, r"node %s (registered|is back)" % n, t1) or t1 + 99
                     for n in c.decodes) - t1
        faults.append({"node": "decode0+decode1", "fault": "SIGSTOP both", "detect_s": t_detect,
                       "rejoin_s": t_back, "served_before": 0})
        for n in c.decodes:
            faults.append({"node": n, "fault": "(serves again)", "detect_s": float("nan"),
                           "rejoin_s": float("nan"), "served_before": before[n], "hidden": True})
        print("SIGSTOP both decode nodes: found dead after %.2f s; %d requests failed with '%s' "
              "(queue_ms %d); both back %.2f s after SIGCONT" % (
                  t_detect, n_nodec, NO_DECODE, QUEUE_MS, t_back))
        # the router itself: kill -9 under load and restart it on the same
        # endpoints; open streams end with the lost-connection error, the
        # nodes register again, the client's connection comes back
        base = completed(of)
        wait_for("the load to progress before killing the router",
                 lambda: completed(of) >= base + 12 or load.poll() is not None, timeout=60)
        rt0 = (c.status() or {}).get("router", {})
        check(rt0.get("dead_nodes", 0) >= 6,
              "the router counted %s dead nodes for 6 node faults" % rt0.get("dead_nodes"))
        print("first router: dead_nodes %s, retries %s, auth_refused %s" % (
            rt0.get("dead_nodes"), rt0.get("retries"), rt0.get("auth_refused")))
        rp = proc_of(c, "router")
        killgroup(rp, signal.SIGKILL)
        rp.wait(timeout=10)
        t1 = time.time()
        c.procs = [(n, p) for n, p in c.procs if n != "router" or p.poll() is None]
        os.replace(c.logs["router"], c.logs["router"] + ".killed")
        c._start("router", [bins.router, "--config", c.config, "--node", "router"])
        want = set(c.prefills + c.decodes)
        wait_for("every node to register with the restarted router",
                 lambda: want <= {n["name"] for n in (c.status(timeout_ms=1000) or {}).get(
                     "nodes", []) if n.get("alive")}, timeout=40, step=0.05)
        t_all = time.time() - t1
        base = completed(of)
        wait_for("requests to complete through the restarted router",
                 lambda: completed(of) >= base + 12 or load.poll() is not None, timeout=60)
        check(load.poll() is None, "the load ended at the router restart")
        faults.append({"node": "router", "fault": "kill -9", "detect_s": float("nan"),
                       "rejoin_s": t_all, "served_before": 0})
        print("kill router: restarted; all 4 nodes registered again %.2f s after the restart"
              % t_all)
        # every node serves again after coming back (the load goes on)
        for f in faults:
            if f["node"] in ("router", "decode0+decode1"):
                continue
            n = f["node"]
            wait_for("%s to serve requests after rejoining" % n,
                     lambda: served(c, n) > (0 if f["fault"] == "kill -9" else f["served_before"]),
                     timeout=40)
        with open(stop, "w"):
            pass
        load.wait(timeout=90)
        t_total = time.monotonic() - t_load
        check(load.returncode == 0, "kvr-chaos-client exit %s" % load.returncode)
        results = [json.loads(line) for line in open(of)]
        hung = [o for o in results if o["hung"]]
        ok = [o for o in results if o["status"] == 0]
        bad = [o for o in ok if diff_output(o, ref[o["id"]])]
        failed = [o for o in results if o["status"] != 0 and not o["hung"]]
        unclear = [o for o in failed if not o["message"]]
        reasons = {}
        for o in failed:
            key = "%s: %s" % (o["status_name"], o["message"][:90])
            reasons[key] = reasons.get(key, 0) + 1
        print("requests %d: completed %d (identical to kvrail run: %d), failed with a clear "
              "error %d, hung %d, in %.1f s" % (len(results), len(ok), len(ok) - len(bad),
                                                len(failed), len(hung), t_total))
        for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print("  %4d  %s" % (v, k))
        check(not hung, "%d requests hung (no end of stream within 45 s), e.g. %s" % (
            len(hung), hung[:2]))
        check(not bad, "%d completed requests differ from kvrail run, e.g. id %s: %s" % (
            len(bad), bad[0]["id"], diff_output(bad[0], ref[bad[0]["id"]])) if bad else "")
        check(not unclear, "failed without a message: %s" % unclear[:2])
        nodec = [o for o in failed if NO_DECODE in o["message"]]
        check(nodec, "no request failed with the node-level error '%s': %s" % (NO_DECODE,
                                                                              reasons))
        check(len(ok) >= len(results) // 2, "most requests failed: %s" % reasons)

        # no stranded blocks: only the prefix cache is left in the pools
        ds = c.wait_idle(timeout=30)
        for n, d in ds.items():
            check(d["free_blocks"] + d["evictable_blocks"] == d["total_blocks"] and
                  d["reserved_blocks"] == 0 and d["requests"] == 0,
                  "%s holds blocks after the load: %s" % (n, {k: d.get(k) for k in (
                      "free_blocks", "evictable_blocks", "cached_blocks", "reserved_blocks",
                      "requests", "quarantined")}))
            print("%s: %d blocks, %d cached (evictable), 0 reserved; quarantines fenced %s, "
                  "expired %s" % (n, d["total_blocks"], d["evictable_blocks"],
                                  d.get("quarantines_fenced"), d.get("quarantines_expired")))
        st = c.status() or {}
        rt = st.get("router", {})
        print("restarted router: dead_nodes %s, retries %s, auth_refused %s" % (
            rt.get("dead_nodes"), rt.get("retries"), rt.get("auth_refused")))
        print("| fault | node | detected dead after (s) | rejoined after (s) |")
        print("|---|---|---:|---:|")
        for f in faults:
            if f.get("hidden"):
                continue
            print("| %s | %s | %s | %.2f |" % (
                f["fault"], f["node"], "-" if f["node"] == "router" else "%.2f" % f["detect_s"],
                f["rejoin_s"]))
        c.check_alive()
        ok_run = True
    finally:
        if load is not None and load.poll() is None:
            stop_group(load, grace=0)
        for n, p in c.procs:
            if p.poll() is None:
                killgroup(p, signal.SIGCONT)
        c.stop()
    if ok_run and not args.keep:
        shutil.rmtree(wd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run_main(main)
