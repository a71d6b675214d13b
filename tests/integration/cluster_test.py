#!/usr/bin/env python3
"""cluster_test.py - end-to-end tests of a kvrail cluster with real processes.

  --case e2e      N prefill + M decode nodes: 40 prompts of 1..700 tokens,
                  several sharing long prefixes, greedy, 8 in flight; every
                  output token-for-token equal to `kvrail run`.
  --case prefix   1P + 2D: a request sharing a 512-token prefix with a
                  finished one goes to the decode node holding it, and only
                  the uncached blocks move (asserted from both nodes' stats);
                  the router's directory matches what the decode nodes hold.
  --case cancel   cancel mid-stream and client disconnect: both halves stop,
                  every reserved block returns (pool accounting at baseline).
  --case failover 1P + 2D: kill -9 a decode node mid-stream: its requests
                  move to the other decode node (prompt + streamed tokens)
                  and complete with the output of `kvrail run`; the prefill
                  node and the other decode node keep serving.
  --case exhaust  more concurrent requests than the pool holds: they wait and
                  complete, or get an overload status after the queue
                  timeout; none hangs.
"""
import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import (Bins, Cluster, Fail, add_bin_args, check, make_model, make_prompts,  # noqa
                         reference, run_main, sp_run, workdir, check_outputs)

KVR_ERR_CANCELED = -11
KVR_ERR_OVERLOAD = -12


def baseline_ok(c, ds):
    for n, s in ds.items():
        check(s["reserved_blocks"] == 0, "%s: %d blocks still reserved" % (n, s["reserved_blocks"]))
        check(s["free_blocks"] + s["evictable_blocks"] == s["total_blocks"],
              "%s: free %d + evictable %d != total %d" % (n, s["free_blocks"], s["evictable_blocks"],
                                                         s["total_blocks"]))
        check(s["batch"] == 0 and s["requests"] == 0, "%s: requests still held: %s" % (n, s))


def case_e2e(args, bins, wd):
    model = make_model(bins, wd)
    prompts = make_prompts(40)
    t0 = time.time()
    ref = reference(bins, model, prompts)
    print("reference: %d prompts in %.1f s" % (len(prompts), time.time() - t0))
    # Both router endpoints as tcp://localhost:PORT: the router binds a host
    # name, not just an IP (issue 11 item 6; zmq_bind alone says "No such device").
    c = Cluster(bins, wd, model, n_prefill=args.prefill, n_decode=args.decode,
                hosts={"router": "localhost"})
    check("localhost" in c.client_ep and "localhost" in c.node_ep, "endpoints: %s %s"
          % (c.client_ep, c.node_ep))
    try:
        c.start()
        t0 = time.time()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "8", "--no-ignore-eos"])
        print(log)
        print("cluster: %d prompts in %.1f s" % (len(prompts), time.time() - t0))
        check(rc == 0, "kvrail-loadgen exit %d" % rc)
        check_outputs(outs, ref)
        disagg = [o for o in outs.values() if not o["local_prefill"]]
        check(disagg, "no request went through a prefill node")
        check(sum(o["kv_bytes"] for o in disagg) > 0, "the router counted no KV bytes moved")
        used_d = {o["decode_node"] for o in outs.values()}
        used_p = {o["prefill_node"] for o in disagg}
        print("decode nodes used: %s, prefill nodes used: %s" % (sorted(used_d), sorted(used_p)))
        check(len(used_d) == args.decode, "not every decode node was used: %s" % used_d)
        check(len(used_p) == args.prefill, "not every prefill node was used: %s" % used_p)
        ds = c.wait_idle()
        baseline_ok(c, ds)
        c.check_alive()
        pushed = sum(c.stats(n)["bytes_pushed"] for n in c.prefills)
        received = sum(c.stats(n)["kv_bytes_received"] for n in c.decodes)
        check(pushed == received, "prefill pushed %d bytes, decode received %d" % (pushed, received))
        print("KV moved prefill -> decode: %d bytes" % pushed)
    finally:
        c.stop()
    return 0


def case_prefix(args, bins, wd):
    model = make_model(bins, wd)
    rng = random.Random(11)
    prefix = [rng.randrange(4, 512) for _ in range(512)]
    a = prefix + [rng.randrange(4, 512) for _ in range(100)]
    b = prefix + [rng.randrange(4, 512) for _ in range(80)]
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=2)
    try:
        c.start()
        rc, outs, log = c.loadgen([(a, 4)], ["--no-ignore-eos"], name="a")
        check(rc == 0 and outs[0]["status"] == 0, "request A failed: %s" % log)
        da = outs[0]["decode_node"]
        check(not outs[0]["local_prefill"], "request A was prefilled locally")
        ds = c.wait_idle()
        # A's prefix blocks reach the router's directory (block events): by state
        deadline = time.time() + 10
        while {n["name"]: n for n in c.status()["nodes"]}[da]["cached_blocks"] < 512 // 16:
            check(time.time() < deadline, "router never learned A's cached prefix on %s" % da)
            time.sleep(0.05)
        before_ok = c.stats(c.prefills[0])["prefills_ok"]
        before_p = c.stats(c.prefills[0])["bytes_pushed"]
        before_d = {n: c.stats(n)["kv_bytes_received"] for n in c.decodes}
        before_done = c.stats(da)["done"]
        rc, outs, log = c.loadgen([(b, 4)], ["--no-ignore-eos"], name="b")
        check(rc == 0 and outs[0]["status"] == 0, "request B failed: %s" % log)
        ob = outs[0]
        print("A on %s; B on %s, cached %d tokens, moved %d bytes" % (da, ob["decode_node"],
                                                                     ob["cached_tokens"], ob["kv_bytes"]))
        check(ob["decode_node"] == da, "B went to %s, the prefix is on %s" % (ob["decode_node"], da))
        check(ob["cached_tokens"] == 512, "B reused %d cached tokens, want 512" % ob["cached_tokens"])
        ds = c.wait_idle()
        # the stats files are rewritten periodically: wait (by state) for the
        # prefill node's file that counts B, not for time
        deadline = time.time() + 10
        while c.stats(c.prefills[0]).get("prefills_ok", 0) <= before_ok or \
                c.stats(da).get("done", 0) <= before_done:
            check(time.time() < deadline, "node stats never counted request B")
            time.sleep(0.05)
        ds = c.wait_idle()
        bb, layers = ds[da]["block_bytes"], ds[da]["layers"]
        nblocks_b = (len(b) + 15) // 16
        want = (nblocks_b - 512 // 16) * bb * layers
        moved_p = c.stats(c.prefills[0])["bytes_pushed"] - before_p
        moved_d = ds[da]["kv_bytes_received"] - before_d[da]
        print("uncached blocks %d: want %d bytes; prefill pushed %d, decode received %d" % (
            nblocks_b - 32, want, moved_p, moved_d))
        check(moved_p == want, "prefill pushed %d bytes for B, want %d (only uncached blocks)" % (moved_p, want))
        check(moved_d == want, "decode received %d bytes for B, want %d" % (moved_d, want))
        # the router's directory matches the decode nodes
        deadline = time.time() + 5
        while True:
            st = c.status()
            ds = {n: c.stats(n) for n in c.decodes}
            rn = {n["name"]: n for n in st["nodes"]}
            mism = [(n, rn[n]["cached_blocks"], ds[n]["cached_blocks"]) for n in c.decodes
                    if rn[n]["cached_blocks"] != ds[n]["cached_blocks"]]
            total = sum(ds[n]["cached_blocks"] for n in c.decodes)
            if not mism and st["router"]["directory_blocks"] == total:
                break
            if time.time() > deadline:
                raise Fail("router directory %s (total %d) != decode nodes %s" % (
                    mism, st["router"]["directory_blocks"], total))
            time.sleep(0.3)
        check(ds[da]["cached_blocks"] >= 612 // 16, "%s caches %d blocks" % (da, ds[da]["cached_blocks"]))
        print("directory: %d blocks, matches the decode nodes" % total)
        c.check_alive()
    finally:
        c.stop()
    return 0


def case_cancel(args, bins, wd):
    model = make_model(bins, wd)
    rng = random.Random(5)
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1)
    try:
        c.start()
        base = c.wait_idle()
        total = base[c.decodes[0]]["total_blocks"]
        prompts = [([rng.randrange(4, 512) for _ in range(rng.randrange(40, 300))], 2000) for _ in range(4)]
        t0 = time.time()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "4", "--cancel-after", "3"], name="cancel")
        print(log)
        check(all(o["status"] == KVR_ERR_CANCELED or 3 <= len(o["tokens"]) < 2000 for o in outs.values()),
              "a canceled request ran on: %s" % [(o["status"], len(o["tokens"])) for o in outs.values()])
        check(time.time() - t0 < 60, "cancel took %.1f s" % (time.time() - t0))
        ds = c.wait_idle(timeout=10)
        baseline_ok(c, ds)
        s = ds[c.decodes[0]]
        check(s["canceled"] >= 4, "decode node saw %d cancels, want 4" % s["canceled"])
        print("after cancel: free %d + evictable %d of %d, reserved %d" % (
            s["free_blocks"], s["evictable_blocks"], total, s["reserved_blocks"]))
        # client disconnect mid-stream
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "4", "--disconnect-after", "3"], name="disc")
        print(log)
        check("disconnected" in log, "loadgen did not disconnect: %s" % log)
        ds = c.wait_idle(timeout=15)
        baseline_ok(c, ds)
        s = ds[c.decodes[0]]
        check(s["canceled"] > 4, "decode node saw no cancel after the disconnect")
        check(s["done"] == 0, "%d requests ran to their end instead of stopping" % s["done"])
        check(s["tokens_out"] < 4 * 2000, "the decode node generated %d tokens" % s["tokens_out"])
        st = c.status()
        print("router: canceled %d" % st["router"]["canceled"])
        check(st["router"]["active"] == 0, "router still has %d active requests" % st["router"]["active"])
        c.check_alive()
    finally:
        c.stop()
    return 0


def case_exhaust(args, bins, wd):
    model = make_model(bins, wd)
    rng = random.Random(9)
    # pool of 48 blocks; every request needs 16 (200 prompt + 56 output tokens)
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, pool_blocks=48, queue_ms=20000)
    try:
        c.start()
        prompts = [([rng.randrange(4, 512) for _ in range(200)], 56) for _ in range(12)]
        t0 = time.time()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "12"], name="wait")
        print(log)
        dt = time.time() - t0
        check(len(outs) == 12, "only %d requests ended" % len(outs))
        st = [o["status"] for o in outs.values()]
        check(all(s == 0 for s in st), "with a long queue timeout every request completes: %s" %
              [(o["status"], o["message"]) for o in outs.values()])
        check(all(len(o["tokens"]) == 56 for o in outs.values()), "short outputs")
        baseline_ok(c, c.wait_idle())
        print("12 requests through a pool of 3: %.1f s" % dt)
        c.stop()
        # short queue timeout, long outputs: 100 + 3000 tokens = 194 blocks of a
        # 200-block pool, one request at a time; the late ones get an overload status
        c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, pool_blocks=200, queue_ms=300)
        with open(c.config) as f:  # whole-request reservations (limits.reservation)
            text = f.read()
        with open(c.config, "w") as f:
            f.write(text.replace("limits:\n", "limits:\n  reservation: whole\n", 1))
        c.start()
        prompts = [([rng.randrange(4, 512) for _ in range(100)], 3000) for _ in range(6)]
        t0 = time.time()
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "6"], name="overload", timeout=120)
        print(log)
        check(len(outs) == 6 and all(o["status"] in (0, KVR_ERR_OVERLOAD) for o in outs.values()),
              "each request completes or is overloaded: %s" % [(o["status"], o["message"]) for o in outs.values()])
        n_over = sum(o["status"] == KVR_ERR_OVERLOAD for o in outs.values())
        n_ok = sum(o["status"] == 0 for o in outs.values())
        msgs = {o["message"] for o in outs.values() if o["status"] == KVR_ERR_OVERLOAD}
        print("ok %d, overloaded %d (%s) in %.1f s" % (n_ok, n_over, msgs, time.time() - t0))
        check(n_ok >= 1, "nothing completed")
        check(n_over >= 1, "nothing was overloaded with a 300 ms queue timeout")
        check(all(m for m in msgs), "an overload status without a message")
        baseline_ok(c, c.wait_idle())
        c.check_alive()
    finally:
        c.stop()
    return 0


def case_failover(args, bins, wd):
    # long enough outputs on a slightly larger model that the victim is still
    # decoding when the kill lands (with the tiny model and 400 tokens the whole
    # load could finish within the stats file's 50 ms refresh)
    model = make_model(bins, wd, ["--layers", "4", "--hidden", "128", "--intermediate", "384"])
    rng = random.Random(13)
    prompts = [([rng.randrange(4, 512) for _ in range(rng.randrange(100, 400))], 1200)
               for _ in range(8)]
    # sampled, with frequency / presence penalties: a migrated request goes on
    # as one process would (the new dispatch says which tokens were output)
    samp = ["--temperature", "0.8", "--frequency-penalty", "0.5", "--presence-penalty", "0.3"]
    ref = reference(bins, model, prompts, ignore_eos=True, sampling=samp)
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=2)
    try:
        c.start()
        h = c.loadgen_start(prompts, ["--concurrency", "8"] + samp, name="failover")
        deadline = time.time() + 30
        victim = None
        while time.time() < deadline and not victim:
            for n in c.decodes:
                s = c.stats(n)
                if s.get("batch", 0) >= 1 and s.get("tokens_out", 0) >= 20:
                    victim = n
                    break
            time.sleep(0.02)
        check(victim, "no decode node got busy")
        held = c.stats(victim)["batch"]
        c.kill(victim)
        print("killed %s with %d sequences running" % (victim, held))
        rc, outs, log = c.loadgen_wait(h)
        print(log)
        check(len(outs) == 8, "only %d requests ended" % len(outs))
        check_outputs(outs, ref, range(8), "after the decode node died (migration)")
        other = [n for n in c.decodes if n != victim][0]
        with open(c.logs["router"]) as f:
            migrated = sum("migrating with" in line for line in f)
        print("%d requests migrated from %s to %s" % (migrated, victim, other))
        check(migrated >= 1, "no request was migrated off the dead decode node")
        for name, p in c.procs:
            if name != victim:
                check(p.poll() is None, "%s died too:\n%s" % (name, c.tail(name)))
        # the prefill node still serves (a request to the surviving decode node)
        rc, outs, log = c.loadgen([([rng.randrange(4, 512) for _ in range(200)], 8)], name="after")
        check(rc == 0 and outs[0]["status"] == 0, "no service after the failure: %s" % log)
        ds = {other: c.stats(other)}
        deadline = time.time() + 10
        while c.stats(other).get("requests") and time.time() < deadline:
            time.sleep(0.2)
        s = c.stats(other)
        check(s["reserved_blocks"] == 0 and s["requests"] == 0, "%s holds blocks: %s" % (other, s))
        deadline = time.time() + 5
        while c.stats(c.prefills[0]).get("active") and time.time() < deadline:
            time.sleep(0.2)
        check(c.stats(c.prefills[0]).get("active") == 0,
              "the prefill node holds requests: %s" % c.stats(c.prefills[0]))
    finally:
        c.stop()
    return 0


def case_badargs(args, bins, wd):
    """Bad command lines and cluster files: a clear message, exit 2 or 1, no crash."""
    model = make_model(bins, wd)
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1)
    with open(c.config) as f:
        text = f.read()
    bad_yaml = os.path.join(wd, "bad.yaml")
    with open(bad_yaml, "w") as f:
        f.write(text.replace("pool_blocks: 2048", "pool_blocks: -4"))
    nomodel = os.path.join(wd, "nomodel.yaml")
    with open(nomodel, "w") as f:
        f.write(text.replace("model: %s" % model, "model: %s/missing" % wd))
    # a device this build cannot drive is a start-up error, never a silent CPU run
    cuda_yaml = os.path.join(wd, "cuda.yaml")
    with open(cuda_yaml, "w") as f:
        f.write(re.sub(r"(\n(\s*)- name: decode0\n)", r"\1\2  device: cuda:0\n", text, count=1))
    check("device: cuda:0" in open(cuda_yaml).read(), "cuda.yaml: no device line written")
    cases = [
        # the reason (no CUDA in the build / no GPU / not wired) is checked by tests/gpu/device_refusal
        (bins.decode, ["--config", cuda_yaml, "--node", "decode0"], "asks for device cuda:0"),
        (bins.decode, [], "--config FILE and --node NAME are required"),
        (bins.prefill, ["--config", c.config], "--config FILE and --node NAME are required"),
        (bins.decode, ["--config", c.config, "--node", "nosuch"], "no node named 'nosuch'"),
        (bins.decode, ["--config", c.config, "--node", "prefill0"], "has role prefill"),
        (bins.prefill, ["--config", c.config, "--node", "decode0"], "has role decode"),
        (bins.decode, ["--config", os.path.join(wd, "absent.yaml"), "--node", "decode0"], "absent.yaml"),
        (bins.decode, ["--config", bad_yaml, "--node", "decode0"], "pool_blocks"),
        (bins.prefill, ["--config", nomodel, "--node", "prefill0"], "missing"),
        (bins.decode, ["--config", c.config, "--node", "decode0", "--log-level", "loud"], "unknown level 'loud'"),
        (bins.loadgen, [], "--router ENDPOINT, --config FILE or --openai URL is required"),
        (bins.loadgen, ["--router", "tcp://127.0.0.1:1", "--prompt-len", "uniform:9:3"], "bad length distribution"),
        (bins.loadgen, ["--router", "tcp://127.0.0.1:1", "--mode", "sideways"], "--mode must be open or closed"),
    ]
    for exe, argv, want in cases:
        r = sp_run([exe] + argv, capture_output=True, text=True, timeout=20)
        out = r.stdout + r.stderr
        print("%s %s -> exit %d: %s" % (os.path.basename(exe), " ".join(argv[-2:]), r.returncode,
                                          out.strip().splitlines()[-1] if out.strip() else ""))
        check(r.returncode in (1, 2), "%s %s: exit %d (want 1 or 2): %s" % (exe, argv, r.returncode, out))
        check(want in out, "%s %s: no '%s' in: %s" % (exe, argv, want, out))
    return 0


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--case", required=True, choices=["e2e", "prefix", "cancel", "exhaust", "failover", "badargs"])
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=1)
    args = ap.parse_args()
    bins = Bins(args)
    for b in (bins.router, bins.prefill, bins.decode, bins.kvrail, bins.mkmodel, bins.loadgen):
        if not os.path.exists(b):
            print("SKIP: %s not built" % b)
            return 77
    wd = workdir("kvr-%s-" % args.case)
    ok = False
    try:
        rc = {"e2e": case_e2e, "prefix": case_prefix, "cancel": case_cancel,
              "exhaust": case_exhaust, "failover": case_failover,
              "badargs": case_badargs}[args.case](args, bins, wd)
        ok = rc == 0
        return rc
    finally:
        if ok and not args.keep:
            shutil.rmtree(wd, ignore_errors=True)
        else:
            print("work directory kept: %s" % wd)
            for f in sorted(os.listdir(wd)):
                if f.endswith(".log"):
                    with open(os.path.join(wd, f)) as fh:
                        print("--- %s (last 25 lines) ---\n%s" % (f, "".join(fh.readlines()[-25:])))


if __name__ == "__main__":
    run_main(main)
