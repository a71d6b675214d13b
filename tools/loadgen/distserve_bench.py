#!/usr/bin/env python3
"""distserve_bench.py - "DistServe in miniature" (issue 14, Performance):
goodput of three ways to spend the same two cores on an open-loop load of
long prompts (default 2,000 tokens in, 128 out) on a model whose prefill
takes about a second:

  disagg  1 prefill + 1 decode node, each pinned to one core (taskset -c 0 /
          -c 1), the router unpinned; every prompt goes to the prefill node.
  coloc1  one decode node, no prefill node, on both cores (threads 2,
          unpinned): local prefill in chunks of --chunk tokens, each chunk in
          one step with a decode step of the running batch.
  coloc2  two such decode nodes, each pinned to one core (threads 1), behind
          the router.

For each request rate, kvrail-loadgen runs --requests Poisson arrivals
(--mode open --rate R).  Goodput here is SLO attainment x offered rate: the
share of the requests that met both the TTFT and the TPOT SLO, times R
(loadgen's own good/wall figure also counts the drain of the last request,
which in a run of 12-20 requests is a large, rate-dependent bias).  The
machine is shared and its load drifts, so the runs are interleaved in rounds
(for each round, for each rate, each configuration in turn, a fresh cluster
each run) and each figure is the median over the rounds.

Every process goes through cluster_lib's spawn (own process group, dies with
this script, reaped on every exit path).  Writes OUT/results.json, OUT/table.md
and, with --plot FILE.png, a gnuplot plot of goodput against rate.

  tools/loadgen/distserve_bench.py --build build --rates 0.4,0.6,0.8,1.0 \
      --rounds 3 --requests 12 --slo-ttft-ms 4000 --slo-tpot-ms 25 \
      --out /tmp/ds-out --plot docs/distserve.png
"""
import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import cluster_lib as cl  # noqa: E402

CONFIGS = ("disagg", "coloc1", "coloc2")
TITLE = {"disagg": "1P+1D, one core each",
         "coloc1": "1 colocated node, 2 cores",
         "coloc2": "2 colocated nodes, one core each"}


def bins_from_build(build):
    return cl.Bins.from_build(build)


class PinnedCluster(cl.Cluster):
    """A Cluster whose nodes run under `taskset -c CPU` (pin: name -> cpu
    list); the router and unlisted nodes run unpinned."""

    def __init__(self, *a, pin=None, chunk=0, **kw):
        super().__init__(*a, **kw)
        self.pin = pin or {}
        if chunk:
            with open(self.config) as f:
                y = f.read()
            with open(self.config, "w") as f:
                f.write(y.replace("limits:\n", "limits:\n  prefill_chunk_tokens: %d\n" % chunk, 1))

    def _start(self, name, argv):
        if name in self.pin:
            argv = ["taskset", "-c", self.pin[name]] + argv
        return super()._start(name, argv)


def make_cluster(bins, sub, model, cfg, args):
    pool = args.pool_blocks
    if cfg == "disagg":
        return PinnedCluster(bins, sub, model, n_prefill=1, n_decode=1, local_prefill_tokens=32,
                             threads=1, pool_blocks=pool, max_batch=args.max_batch,
                             pin={"prefill0": "0", "decode0": "1"})
    if cfg == "coloc1":
        return PinnedCluster(bins, sub, model, n_prefill=0, n_decode=1,
                             local_prefill_tokens=1 << 30, threads=2, pool_blocks=pool,
                             max_batch=args.max_batch, chunk=args.chunk)
    return PinnedCluster(bins, sub, model, n_prefill=0, n_decode=2, local_prefill_tokens=1 << 30,
                         threads=1, pool_blocks=pool, max_batch=args.max_batch, chunk=args.chunk,
                         pin={"decode0": "0", "decode1": "1"})


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    k = q * (len(v) - 1)
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def run_one(bins, wd, model, cfg, rate, rnd, args):
    sub = os.path.join(wd, "%s-r%g-%d" % (cfg, rate, rnd))
    os.makedirs(sub, exist_ok=True)
    c = make_cluster(bins, sub, model, cfg, args)
    try:
        c.start(timeout=60)
        c.wait_idle(timeout=60)  # pools faulted in: not part of the measurement
        csvf = os.path.join(sub, "requests.csv")
        argv = [bins.loadgen, "--router", c.client_ep, "--mode", "open", "--rate", str(rate),
                "--requests", str(args.requests), "--prompt-len", args.prompt_len,
                "--output-len", args.output_len, "--vocab", str(args.vocab),
                "--seed", str(100 + rnd), "--slo-ttft-ms", str(args.slo_ttft_ms),
                "--slo-tpot-ms", str(args.slo_tpot_ms), "--timeout-ms", "300000",
                "--csv", csvf, "--summary-json", os.path.join(sub, "summary.json"),
                "--label", "%s %g req/s round %d" % (cfg, rate, rnd), "--quiet"]
        r = cl.run(argv, timeout=400)
        if r.returncode != 0:
            raise cl.Fail("loadgen (%s, %g req/s) exit %d: %s" % (cfg, rate, r.returncode, r.stderr))
        c.check_alive()
        rows = list(csv.DictReader(open(csvf)))
        ok = [x for x in rows if int(x["status"]) == 0 and int(x["output_tokens"]) > 0]
        if cfg == "disagg":
            cl.check(all(x["local_prefill"] == "0" for x in ok), "disagg: a prompt was prefilled locally")
        else:
            cl.check(all(x["local_prefill"] == "1" for x in ok), "%s: a prompt was not prefilled locally" % cfg)
        ttft = [float(x["ttft_ms"]) for x in ok]
        tpot = [float(x["tpot_ms"]) for x in ok]
        good = sum(1 for a, b in zip(ttft, tpot) if a <= args.slo_ttft_ms and b <= args.slo_tpot_ms)
        res = {"n": len(rows), "ok": len(ok), "good": good, "attain": good / max(1, len(rows)),
               "goodput": rate * good / max(1, len(rows)),
               "ttft_p50": pct(ttft, 0.5), "ttft_p90": pct(ttft, 0.9),
               "tpot_p50": pct(tpot, 0.5), "tpot_p90": pct(tpot, 0.9), "ttft": ttft, "tpot": tpot}
        print("round %d  %-6s %5.2f req/s: %2d/%2d met SLOs, goodput %.3f, TTFT p50 %7.0f p90 %7.0f ms,"
              " TPOT p50 %6.1f p90 %6.1f ms" % (rnd, cfg, rate, good, len(rows), res["goodput"],
                                                 res["ttft_p50"], res["ttft_p90"], res["tpot_p50"],
                                                 res["tpot_p90"]), flush=True)
        return res
    finally:
        c.stop()


def plot(path, rates, med, out):
    dat = os.path.join(out, "goodput.dat")
    with open(dat, "w") as f:
        f.write("# rate " + " ".join(CONFIGS) + "\n")
        for r in rates:
            f.write("%g %s\n" % (r, " ".join("%.4f" % med[c][r]["goodput"] for c in CONFIGS)))
    gp = ["set terminal pngcairo size 800,500" if have_term("pngcairo") else "set terminal png size 800,500",
          "set output '%s'" % path, "set key top left", "set grid",
          "set xlabel 'offered load (requests/s)'", "set ylabel 'goodput (requests/s meeting both SLOs)'",
          "set title 'DistServe in miniature: 2 cores, %s'" % out_title,
          "set xrange [0:%g]" % (max(rates) * 1.1), "set yrange [0:%g]" % (max(rates) * 1.1),
          "plot " + ", ".join("'%s' using 1:%d with linespoints lw 2 title '%s'" % (dat, i + 2, TITLE[c])
                              for i, c in enumerate(CONFIGS)) + ", x with lines dt 2 lc 'gray' title 'offered'"]
    r = cl.run(["gnuplot"], timeout=60, input="\n".join(gp) + "\n")
    if r.returncode != 0:
        raise cl.Fail("gnuplot failed: %s" % r.stderr)


def have_term(t):
    r = cl.run(["gnuplot", "-e", "set terminal"], timeout=30)
    return t in (r.stdout + r.stderr)


out_title = ""


def main():
    global out_title
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rates", default="0.4,0.6,0.8,1.0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--prompt-len", default="2000")
    ap.add_argument("--output-len", default="128")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256, help="limits.prefill_chunk_tokens (colocated)")
    ap.add_argument("--pool-blocks", type=int, default=2048)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--slo-ttft-ms", type=float, default=4000)
    ap.add_argument("--slo-tpot-ms", type=float, default=25)
    ap.add_argument("--model-args", default="--layers 4 --hidden 512 --heads 8 --kv-heads 2 "
                    "--intermediate 1024 --vocab 1024 --max-pos 4096")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="distserve-out")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    bins = bins_from_build(args.build)
    rates = [float(x) for x in args.rates.split(",")]
    cfgs = args.configs.split(",")
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    wd = cl.workdir("kvr-distserve-")
    model = cl.make_model(bins, wd, shlex.split(args.model_args))
    # the prefill time of one prompt on one core, for the record
    r = cl.run(["taskset", "-c", "0", bins.kvrail, "run", "--model", model, "--prompt-tokens",
                ",".join(str(4 + (i * 7919) % (args.vocab - 4)) for i in range(int(args.prompt_len))),
                "--max-tokens", "16", "--ignore-eos", "--stats", "--threads", "1"], timeout=120)
    solo = (r.stderr.strip().splitlines() or [""])[-1]
    print("one core, no cluster: %s" % solo, flush=True)
    res = {c: {r_: [] for r_ in rates} for c in cfgs}
    for rnd in range(args.rounds):
        for rate in rates:
            for k in range(len(cfgs)):  # rotate the order within a rate from round to round
                cfg = cfgs[(k + rnd) % len(cfgs)]
                res[cfg][rate].append(run_one(bins, wd, model, cfg, rate, rnd, args))
    keys = ("goodput", "attain", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
    med = {c: {r_: {k: statistics.median(x[k] for x in res[c][r_]) for k in keys} for r_ in rates}
           for c in cfgs}
    lines = ["model: `%s`; prompt %s tokens, output %s; SLOs: TTFT <= %g ms, TPOT <= %g ms; "
             "colocated prefill chunk %d tokens; %d requests per run, median of %d rounds" % (
                 args.model_args, args.prompt_len, args.output_len, args.slo_ttft_ms,
                 args.slo_tpot_ms, args.chunk, args.requests, args.rounds),
             "one core, no cluster: %s" % solo, "",
             "| configuration | rate req/s | goodput req/s | SLO met | TTFT p50 ms | TTFT p90 ms "
             "| TPOT p50 ms | TPOT p90 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cfgs:
        for r_ in rates:
            m = med[c][r_]
            lines.append("| %s | %g | %.3f | %.0f%% | %.0f | %.0f | %.1f | %.1f |" % (
                TITLE[c], r_, m["goodput"], 100 * m["attain"], m["ttft_p50"], m["ttft_p90"],
                m["tpot_p50"], m["tpot_p90"]))
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "solo": solo, "runs": {c: {str(r_): v for r_, v in d.items()}
                                                              for c, d in res.items()}}, f, indent=1)
    if args.plot and cfgs == list(CONFIGS):
        out_title = "%s-token prompts, %s out, TTFT <= %gs, TPOT <= %g ms" % (
            args.prompt_len, args.output_len, args.slo_ttft_ms / 1000, args.slo_tpot_ms)
        plot(os.path.abspath(args.plot), rates, med, args.out)
        print("plot: %s" % args.plot)
    return 0


if __name__ == "__main__":
    cl.run_main(main)
