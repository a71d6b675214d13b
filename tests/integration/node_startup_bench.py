#!/usr/bin/env python3
"""node_startup_bench.py - start-up of a decode node with a 1 GiB KV pool:
two kvrail-decode binaries side by side (e.g. before and after a change),
runs alternated, one router for all of them.

For each run the decode node is started fresh (the router keeps running)
and timed from its spawn to:
  registered   its log line "registered with the router";
  first token  a one-request kvrail-loadgen, started at once after that,
               has finished (a 64-token prompt, 4 tokens out);
  faulted      the whole pool resident: the "all N blocks resident" line of
               a background pre-fault, or for a binary that faults before
               registering, its "KV pool: ..." line (the pool is resident
               when it is logged).
Log lines carry millisecond wall-clock stamps; the spawn time is taken
just before exec.  Runs are --gap seconds apart (default 10): on a VM with
free page reporting (this one's kernel: page_reporting_order=11) memory a
node freed goes back to the host after a few seconds, and a start right
after the previous node exits finds it still backed and faults it several
times faster than a fresh start would.  Prints a markdown table and the medians.  Not a test
(no assertion on time); run by hand:

  python3 tests/integration/node_startup_bench.py --build build-x \\
      --decode before=/path/a/kvrail-decode --decode after=/path/b/kvrail-decode --runs 3
"""
import argparse
import calendar
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import Cluster, check, make_model, run_main, spawn, stop_group, workdir  # noqa


def stamp(line):
    """Seconds since the epoch of a log line's '2026-12-01T17:03:30.378Z'."""
    ts = line.split(" ", 1)[0]
    t = calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S"))
    return t + int(ts[20:23]) / 1000.0


def find(path, needle):
    try:
        with open(path) as f:
            for line in f:
                if needle in line:
                    return line
    except OSError:
        pass
    return None


def wait_line(p, path, needle, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = find(path, needle)
        if line:
            return line
        check(p.poll() is None, "the decode node exited (%s); see %s" % (p.returncode, path))
        time.sleep(0.02)
    raise SystemExit("no '%s' in %s within %d s" % (needle, path, timeout))


class B:
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="build dir for router, mkmodel, loadgen")
    ap.add_argument("--decode", action="append", required=True, help="NAME=PATH (two or more)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pool", default="1GiB")
    ap.add_argument("--gap", type=float, default=10.0,
                    help="seconds between runs (freed memory returns to the host)")
    args = ap.parse_args()
    bins = B()
    bins.router = os.path.join(args.build, "router/kvrail-router")
    bins.mkmodel = os.path.join(args.build, "tools/mkmodel/kvrail-mkmodel")
    bins.loadgen = os.path.join(args.build, "tools/loadgen/kvrail-loadgen")
    decs = [d.split("=", 1) for d in args.decode]
    wd = workdir("kvr-startup-bench-")
    model = make_model(bins, wd)
    c = Cluster(bins, wd, model, n_prefill=0, n_decode=1)
    with open(c.config) as f:
        text = f.read()
    with open(c.config, "w") as f:
        f.write(text.replace("    pool_blocks: 2048\n", "    pool_bytes: %s\n" % args.pool))
    prompt = os.path.join(wd, "one.jsonl")
    with open(prompt, "w") as f:
        f.write('{"id": 0, "tokens": [%s], "max_tokens": 4}\n' %
                ", ".join(str(5 + i % 400) for i in range(64)))
    rows = []
    try:
        c._start("router", [bins.router, "--config", c.config, "--node", "router"])
        for r in range(args.runs):
            for name, path in decs:
                time.sleep(args.gap)  # not synchronization: lets the VM take the memory back
                log = os.path.join(wd, "decode-%s-%d.log" % (name, r))
                env = dict(os.environ, KVR_LOG_LEVEL="info")
                env.pop("KVR_NODE_PREFAULT_GATE", None)
                with open(log, "w") as lf:
                    t0 = time.time()
                    p = spawn([path, "--config", c.config, "--node", "decode0"], stdout=lf,
                              stderr=lf, env=env)
                try:
                    reg = stamp(wait_line(p, log, "registered with the router", 300)) - t0
                    lg = spawn([bins.loadgen, "--router", c.client_ep, "--prompts", prompt,
                                "--outputs", os.path.join(wd, "out.jsonl"), "--timeout-ms",
                                "120000"], stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
                    rc = lg.wait(timeout=130)
                    first = time.time() - t0
                    check(rc == 0, "loadgen exit %d (run %s %d)" % (rc, name, r))
                    line = find(log, "KV pool:")
                    if "on a thread" in line:  # faulted in the background: wait for the end
                        line = wait_line(p, log, "blocks resident", 300)
                    full = stamp(line) - t0
                finally:
                    p.send_signal(signal.SIGTERM)
                    stop_group(p, grace=10)
                rows.append((name, r, reg, first, full))
                print("| %s | %d | %.2f | %.2f | %.2f |" % (name, r + 1, reg, first, full),
                      flush=True)
    finally:
        c.stop()
    print("\n| binary | run | registered s | first request done s | pool fully faulted s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r, reg, first, full in rows:
        print("| %s | %d | %.2f | %.2f | %.2f |" % (name, r + 1, reg, first, full))
    print("\n| binary | median registered s | median first request s | median fully faulted s |")
    print("| --- | ---: | ---: | ---: |")
    for name, _ in decs:
        mine = [x for x in rows if x[0] == name]
        print("| %s | %.2f | %.2f | %.2f |" % (
            name, statistics.median(x[2] for x in mine), statistics.median(x[3] for x in mine),
            statistics.median(x[4] for x in mine)))
    return 0


if __name__ == "__main__":
    run_main(main)
