"""bench_curve.py - what CURVE costs the control plane: the same 1P+1D
cluster with `auth: none` and `auth: curve`, side by side in one run, the
same greedy requests (kvrail generate --stats, one at a time), and per mode
the router's overhead per request and per token (its own status
percentiles) and TTFT / total as the router measures them (they include
every control message over the node endpoint, each encrypted with CURVE).
Prints a markdown table with curve/none ratios.

  PYTHONPATH=tests/integration python3 tests/chaos/bench_curve.py --router ... \\
      --prefill-bin ... --decode-bin ... --kvrail ... --mkmodel ... --loadgen ... [-n 40]
"""
import argparse
import os
import re
import statistics

from cluster_lib import Bins, ClientCluster, add_bin_args, check, make_model, run, workdir

STATS = re.compile(r"TTFT ([\d.]+) ms, total ([\d.]+) ms, router overhead ([\d.]+) us")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def one_mode(bins, model, mode, n):
    wd = workdir("kvr-bench-curve-")
    extra = "auth: none\n" if mode == "none" else "auth: curve\nkeys: keys\n"
    c = ClientCluster(bins, wd, model, extra_yaml=extra)
    env_keep = {k: os.environ.get(k) for k in ("KVRAIL_ROUTER_KEY", "KVRAIL_CLIENT_KEY")}
    try:
        if mode == "curve":
            r = run([bins.kvrail, "keygen", "--config", c.config, "--client", "bench"], timeout=30)
            check(r.returncode == 0, r.stderr)
            os.environ["KVRAIL_ROUTER_KEY"] = os.path.join(wd, "keys", "router.pub")
            os.environ["KVRAIL_CLIENT_KEY"] = os.path.join(wd, "keys", "clients", "bench.key")
        c.start()
        ttft, total, ovh = [], [], []
        for i in range(n):
            r = run([bins.kvrail, "generate", "--router", c.client_ep, "--max-tokens", "16",
                     "--temperature", "0", "--stats", "--timeout", "60000",
                     "request %d of the curve bench" % i], timeout=90)
            m = STATS.search(r.stderr)
            check(r.returncode == 0 and m, "generate failed: %s" % r.stderr)
            ttft.append(float(m.group(1)))
            total.append(float(m.group(2)))
            ovh.append(float(m.group(3)))
        return {"ttft": ttft, "total": total, "ovh": ovh}
    finally:
        c.stop()
        for k, v in env_keep.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("-n", type=int, default=40)
    args = ap.parse_args()
    bins = Bins(args)
    model = make_model(bins, workdir("kvr-bench-curve-model-"))
    res = {m: one_mode(bins, model, m, args.n) for m in ("none", "curve")}
    print("| per request (%d, 16 tokens, 1P+1D) | none p50 | curve p50 | ratio | none p99 | "
          "curve p99 | ratio |" % args.n)
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, label in (("ovh", "router overhead (us)"), ("ttft", "TTFT (ms)"),
                       ("total", "total (ms)")):
        a50, b50 = statistics.median(res["none"][key]), statistics.median(res["curve"][key])
        a99, b99 = pct(res["none"][key], 0.99), pct(res["curve"][key], 0.99)
        print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |" %
              (label, a50, b50, b50 / a50 if a50 else 0, a99, b99, b99 / a99 if a99 else 0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
