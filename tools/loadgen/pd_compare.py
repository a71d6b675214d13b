#!/usr/bin/env python3
"""pd_compare.py - disaggregated (1 prefill + 1 decode node) against
colocated (the decode node prefilling locally) on the one-machine cluster:
same model, same load, run by kvrail-loadgen, side by side in one run.

Colocated is the same cluster with the router's local-prefill threshold set
above any prompt length, so the decode node prefills every request itself.
The low-load TTFT of --prompt-len tokens is the headline figure (target:
disaggregated <= 1.10 x colocated: the layer-wise push hides the transfer).
The machine is shared and noisy: each configuration runs --reps times,
alternating, and the best (lowest p50) run of each is reported.  --paired
(the default) also keeps both clusters up side by side and sends the same
prompt to one, then the other, one request at a time, so that both see the
same background load; the median of the per-prompt TTFT ratios is the
figure least disturbed by other work on the machine.

  tools/loadgen/pd_compare.py --build build-nodes [--reps 3] [--requests 20]
      [--prompt-len 1024] [--output-len 16] [--model-args "--layers 4 ..."]
      [--open-rate R] [--out DIR]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import cluster_lib as cl  # noqa: E402


def bins_from_build(build):
    return cl.Bins.from_build(build)


def run_one(bins, wd, model, mode, args, rep):
    sub = os.path.join(wd, "%s-%d" % (mode, rep))
    os.makedirs(sub, exist_ok=True)
    thr = 32 if mode == "disagg" else 1 << 30
    c = cl.Cluster(bins, sub, model, n_prefill=1, n_decode=1, local_prefill_tokens=thr,
                   threads=args.threads)
    try:
        c.start()
        summ = os.path.join(sub, "summary.json")
        argv = [bins.loadgen, "--router", c.client_ep, "--requests", str(args.requests),
                "--warmup", "2", "--prompt-len", str(args.prompt_len), "--output-len",
                str(args.output_len), "--vocab", str(args.vocab), "--seed", str(rep + 1),
                "--summary-json", summ, "--csv", os.path.join(args.out, "%s-%d.csv" % (mode, rep)),
                "--label", "%s rep %d" % (mode, rep), "--slo-ttft-ms", str(args.slo_ttft_ms),
                "--slo-tpot-ms", str(args.slo_tpot_ms)]
        if args.open_rate:
            argv += ["--mode", "open", "--rate", str(args.open_rate)]
        else:
            argv += ["--mode", "closed", "--concurrency", "1"]
        if args.plot:
            argv += ["--plot", os.path.join(args.out, "%s-%d.png" % (mode, rep))]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        print(r.stdout, end="")
        if r.returncode != 0:
            raise cl.Fail("loadgen (%s) exit %d: %s" % (mode, r.returncode, r.stderr))
        with open(summ) as f:
            s = json.load(f)
        st = c.status() or {}
        s["router"] = st.get("router", {})
        return s
    finally:
        c.stop()


def paired(bins, wd, model, args):
    """Both clusters up; prompt k goes to colocated, then to disaggregated."""
    cls = {}
    os.environ["KVR_LOG_LEVEL"] = "debug"  # per-request compute times in the node logs
    try:
        for mode, thr in (("coloc", 1 << 30), ("disagg", 32)):
            sub = os.path.join(wd, "paired-" + mode)
            os.makedirs(sub, exist_ok=True)
            cls[mode] = cl.Cluster(bins, sub, model, n_prefill=1, n_decode=1,
                                   local_prefill_tokens=thr, threads=args.threads)
            cls[mode].start()
        ttft = {"coloc": [], "disagg": []}
        for k in range(-2, args.pairs):  # two warm-up pairs
            order = ("coloc", "disagg") if k % 2 == 0 else ("disagg", "coloc")
            for mode in order:
                summ = os.path.join(wd, "pair.json")
                r = subprocess.run([bins.loadgen, "--router", cls[mode].client_ep, "--requests", "1",
                                    "--prompt-len", str(args.prompt_len), "--output-len",
                                    str(args.output_len), "--vocab", str(args.vocab), "--seed",
                                    str(1000 + k), "--summary-json", summ, "--quiet", "--timeout-ms", "60000"],
                                   capture_output=True, text=True, timeout=120)
                time.sleep(cl.CLIENT_GAP_S)
                if r.returncode != 0:
                    raise cl.Fail("paired loadgen (%s) exit %d: %s" % (mode, r.returncode, r.stderr))
                with open(summ) as f:
                    s = json.load(f)
                if k >= 0:
                    ttft[mode].append(s["ttft_ms"]["p50"])
        # compute time of each prefill, from the node that ran it
        comp = {}
        for mode, node, pat in (("coloc", "decode0", r"local prefill of \d+ tokens \(\d+ cached\) in (\d+) us"),
                                ("disagg", "prefill0", r"compute (\d+) us")):
            with open(cls[mode].logs[node]) as f:
                vals = [int(m.group(1)) / 1000.0 for m in (re.search(pat, l) for l in f) if m]
            comp[mode] = vals[2:]  # after the warm-up pair
        return ttft, comp
    finally:
        os.environ.pop("KVR_LOG_LEVEL", None)
        for c in cls.values():
            c.stop()


def pct(v, q):
    v = sorted(v)
    k = q * (len(v) - 1)
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--prompt-len", default="1024", help="N | uniform:A:B | exp:MEAN")
    ap.add_argument("--output-len", default="16", help="N | uniform:A:B | exp:MEAN")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--open-rate", type=float, default=0)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000)
    ap.add_argument("--slo-tpot-ms", type=float, default=100)
    ap.add_argument("--model-args", default="--layers 4 --hidden 256 --heads 4 --kv-heads 2 "
                    "--intermediate 768 --vocab 1024 --max-pos 2048")
    ap.add_argument("--out", default="pd-compare")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--pairs", type=int, default=20, help="paired prompts (0: no paired run)")
    args = ap.parse_args()
    bins = bins_from_build(args.build)
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    wd = cl.workdir("kvr-pd-")
    model = cl.make_model(bins, wd, shlex.split(args.model_args))
    res = {"disagg": [], "coloc": []}
    for rep in range(args.reps):
        for mode in ("coloc", "disagg"):
            res[mode].append(run_one(bins, wd, model, mode, args, rep))
    out = {}
    if args.reps > 0:
        best = {m: min(v, key=lambda s: s["ttft_ms"]["p50"]) for m, v in res.items()}
        print("\nmodel: %s; prompt %s tokens, output %s, %s, %d requests, best of %d" % (
            args.model_args, args.prompt_len, args.output_len,
            "open loop %.2f req/s" % args.open_rate if args.open_rate else "closed loop, 1 in flight",
            args.requests, args.reps))
        print("| mode | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms | tok/s | KV bytes/req |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for m in ("coloc", "disagg"):
            s = best[m]
            print("| %s | %.2f | %.2f | %.2f | %.3f | %.3f | %.1f | %d |" % (
                "colocated" if m == "coloc" else "disaggregated 1P+1D", s["ttft_ms"]["p50"],
                s["ttft_ms"]["p90"], s["ttft_ms"]["p99"], s["tpot_ms"]["p50"], s["itl_ms"]["p99"],
                s["out_tok_per_s"], s["kv_bytes"] // max(1, s["ok"])))
        for m in ("coloc", "disagg"):
            rs = best[m].get("router", {})
            print("router overhead per request (%s): p50 %.1f us, p99 %.1f us" % (
                m, rs.get("overhead_p50_ns", 0) / 1e3, rs.get("overhead_p99_ns", 0) / 1e3))
        ratio = best["disagg"]["ttft_ms"]["p50"] / best["coloc"]["ttft_ms"]["p50"]
        print("TTFT p50 disaggregated / colocated = %.3f (target <= 1.10)" % ratio)
        print("all runs (TTFT p50 ms): colocated %s, disaggregated %s" % (
            [round(s["ttft_ms"]["p50"], 2) for s in res["coloc"]],
            [round(s["ttft_ms"]["p50"], 2) for s in res["disagg"]]))
        out = {"best": best, "all": res, "ratio": ratio}
    if args.pairs > 0:
        t, comp = paired(bins, wd, model, args)
        ratios = [d / c for c, d in zip(t["coloc"], t["disagg"])]
        print("\npaired: %d prompts of %s tokens, each sent to both clusters in turn (both up)" % (
            args.pairs, args.prompt_len))
        print("| mode | TTFT p50 ms | TTFT p90 ms | min ms |")
        print("|---|---:|---:|---:|")
        for m in ("coloc", "disagg"):
            print("| %s | %.2f | %.2f | %.2f |" % ("colocated" if m == "coloc" else "disaggregated 1P+1D",
                                                 pct(t[m], 0.5), pct(t[m], 0.9), min(t[m])))
        print("per-prompt TTFT ratio disaggregated / colocated: median %.3f, p10 %.3f, p90 %.3f "
              "(target <= 1.10)" % (pct(ratios, 0.5), pct(ratios, 0.1), pct(ratios, 0.9)))
        out["paired"] = {"ttft": t, "ratio_median": pct(ratios, 0.5), "compute": comp}
        if all(len(comp[m]) == len(t[m]) for m in t):
            ovh = {m: [a - b for a, b in zip(t[m], comp[m])] for m in t}
            print("prefill compute p50: colocated (decode node) %.2f ms, disaggregated (prefill "
                  "node) %.2f ms" % (pct(comp["coloc"], 0.5), pct(comp["disagg"], 0.5)))
            print("TTFT - compute (everything but the model), p50: colocated %.2f ms, "
                  "disaggregated %.2f ms" % (pct(ovh["coloc"], 0.5), pct(ovh["disagg"], 0.5)))
            print("disaggregated TTFT at colocated compute: (compute_coloc + overhead_disagg) / "
                  "(compute_coloc + overhead_coloc) = %.3f" % (
                      (pct(comp["coloc"], 0.5) + pct(ovh["disagg"], 0.5)) /
                      (pct(comp["coloc"], 0.5) + pct(ovh["coloc"], 0.5))))
            out["paired"]["overhead_ms"] = ovh
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    cl.run_main(main)
