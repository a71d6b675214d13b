"""bench_curve.py - what CURVE costs the control plane: two identical 1P+1D
clusters, one with `auth: none` and one with `auth: curve`, running side by
side, given the same greedy requests in alternating rounds (so both see the
same machine load), each round one kvr-chaos-client connection (CURVE keys
from the environment for the curve cluster).  Per request, as the router
measures it: its own overhead (the wall time the router spends on the
request's messages: client frame, Reserve, Prefill, Reserved -> target,
PrefillDone, every Token -> chunk; each of them encrypted and decrypted by
CURVE in the curve cluster), the same in router CPU time, TTFT and total.
Prints a markdown table of p50 / p99 per mode with curve/none ratios.

  PYTHONPATH=tests/integration python3 tests/chaos/bench_curve.py --router ... \\
      --prefill-bin ... --decode-bin ... --kvrail ... --mkmodel ... --loadgen ... \\
      --client build/tests/chaos/kvr-chaos-client [--rounds 6] [--per-round 40]
      [--concurrency 1]
"""
import argparse
import json
import os
import random
import shutil

from cluster_lib import (Bins, ClientCluster, add_bin_args, check, make_model, run, workdir)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--client", required=True, help="kvr-chaos-client")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir("kvr-bench-curve-")
    model = make_model(bins, wd)
    rng = random.Random(5)
    pf = os.path.join(wd, "prompts.jsonl")
    with open(pf, "w") as f:
        for i in range(20):
            toks = [rng.randrange(4, 512) for _ in range(rng.randrange(64, 300))]
            f.write(json.dumps({"id": i, "tokens": toks, "max_tokens": 16}) + "\n")
    clusters, envs = {}, {}
    try:
        for mode in ("none", "curve"):
            d = os.path.join(wd, mode)
            os.makedirs(d)
            extra = "auth: none\n" if mode == "none" else "auth: curve\nkeys: keys\n"
            c = ClientCluster(bins, d, model, local_prefill_tokens=0, extra_yaml=extra)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("KVRAIL_ROUTER_KEY", "KVRAIL_CLIENT_KEY")}
            if mode == "curve":
                r = run([bins.kvrail, "keygen", "--config", c.config, "--client", "bench"],
                        timeout=30)
                check(r.returncode == 0, r.stderr)
                env["KVRAIL_ROUTER_KEY"] = os.path.join(d, "keys", "router.pub")
                env["KVRAIL_CLIENT_KEY"] = os.path.join(d, "keys", "clients", "bench.key")
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            try:
                c.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            clusters[mode], envs[mode] = c, env
        res = {m: {"ovh": [], "cpu": [], "ttft": [], "total": []} for m in clusters}
        for rd in range(args.rounds):
            for mode in (("none", "curve") if rd % 2 == 0 else ("curve", "none")):
                c = clusters[mode]
                of = os.path.join(wd, "%s-%d.jsonl" % (mode, rd))
                r = run([args.client, "--router", c.client_ep, "--prompts", pf, "--outputs", of,
                         "--concurrency", str(args.concurrency), "--max", str(args.per_round),
                         "--timeout-ms", "60000"], timeout=300, env=envs[mode])
                check(r.returncode == 0, "kvr-chaos-client (%s): %s %s" % (mode, r.stdout,
                                                                           r.stderr))
                for line in open(of):
                    o = json.loads(line)
                    check(o["status"] == 0, "%s: a request failed: %s" % (mode, o["message"]))
                    res[mode]["ovh"].append(o["router_overhead_ns"] / 1e3)
                    res[mode]["cpu"].append(o["router_overhead_cpu_ns"] / 1e3)
                    res[mode]["ttft"].append(o["ttft_us"] / 1e3)
                    res[mode]["total"].append(o["total_us"] / 1e3)
        n = len(res["none"]["ovh"])
        print("| per request (%d each, 16 tokens, 1P+1D, %d in flight, rounds alternated) | "
              "none p50 | curve p50 | ratio | none p99 | curve p99 | ratio |" %
              (n, args.concurrency))
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for key, label in (("ovh", "router overhead, wall (us)"),
                           ("cpu", "router overhead, CPU (us)"), ("ttft", "TTFT (ms)"),
                           ("total", "total (ms)")):
            a, b = res["none"][key], res["curve"][key]
            a50, b50, a99, b99 = pct(a, 0.5), pct(b, 0.5), pct(a, 0.99), pct(b, 0.99)
            print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" %
                  (label, a50, b50, b50 / a50 if a50 else 0, a99, b99, b99 / a99 if a99 else 0))
    finally:
        for c in clusters.values():
            c.stop()
    shutil.rmtree(wd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
