"""bench_metrics.py - what the Prometheus metrics cost the decode step.

Two identical 1 prefill + 1 decode clusters of the tiny model, one whose
nodes and router have a metrics_port (the per-token inter-token-latency
histogram on the decode node, the once-a-second mirror, a scrape every
second by this script) and one without; the same closed-loop load
(kvrail-loadgen, C streams, random prompts, ignore_eos) runs on each in
turn, R alternating rounds.  Prints a markdown table of output tokens/s and
TPOT p50 per mode (medians over the rounds) and their ratio, and the decode
node's own figures with metrics on: the mirror's copy time
(kvrail_metrics_update_seconds) and the mean inter-token gap.  Not a test:
run it by hand.

  python3 tests/integration/bench_metrics.py --router B/router/kvrail-router \\
    --prefill-bin B/prefill/kvrail-prefill --decode-bin B/decode/kvrail-decode \\
    --kvrail B/tools/kvrail/kvrail --mkmodel B/tools/mkmodel/kvrail-mkmodel \\
    --loadgen B/tools/loadgen/kvrail-loadgen [--concurrency 32 --requests 256 --rounds 4]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster_lib as cl  # noqa: E402
from metrics_test import add_ports  # noqa: E402


def scrape(port):
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()


def value(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    bins = cl.Bins(a)
    work = cl.workdir("kvr-bench-metrics-")
    stop = threading.Event()
    try:
        model = cl.make_model(bins, work)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        clusters = {}
        ports = {}
        for mode in ("on", "off"):
            d = os.path.join(work, mode)
            os.makedirs(d)
            c = cl.Cluster(bins, d, model, n_prefill=1, n_decode=1, pool_blocks=8192,
                           max_batch=a.concurrency)
            if mode == "on":
                ports = {n: cl.free_port() for n in ("router", "prefill0", "decode0")}
                add_ports(c.config, ports)
            c.start()
            clusters[mode] = c

        def scraper():  # Prometheus' part: every process scraped once a second
            while not stop.wait(1.0):
                for p in ports.values():
                    try:
                        scrape(p)
                    except OSError:
                        pass
        threading.Thread(target=scraper, daemon=True).start()
        rows = {"on": [], "off": []}
        for rd in range(a.rounds):
            for mode in (("on", "off") if rd % 2 == 0 else ("off", "on")):
                sj = os.path.join(work, "%s%d.json" % (mode, rd))
                r = cl.run([bins.loadgen, "--router", clusters[mode].client_ep, "--mode", "closed",
                            "--concurrency", str(a.concurrency), "--requests", str(a.requests),
                            "--prompt-len", str(a.prompt_len), "--output-len",
                            str(a.output_len), "--vocab", str(vocab), "--seed", str(100 + rd),
                            "--warmup", "4", "--summary-json", sj, "--quiet"], timeout=600)
                if r.returncode != 0:
                    raise cl.Fail("loadgen (%s): %s %s" % (mode, r.stdout, r.stderr))
                with open(sj) as f:
                    rows[mode].append(json.load(f))
        med = {m: {"tok_s": statistics.median(x["out_tok_per_s"] for x in rs),
                   "tpot": statistics.median(x["tpot_ms"]["p50"] for x in rs)}
               for m, rs in rows.items()}
        print("%d streams, %d requests per round, prompt %d, output %d tokens, median of %d "
              "alternating rounds" % (a.concurrency, a.requests, a.prompt_len, a.output_len,
                                      a.rounds))
        print("| metrics | output tok/s | TPOT p50 ms |")
        print("|---|---:|---:|")
        for m in ("off", "on"):
            print("| %s | %.0f | %.3f |" % (m, med[m]["tok_s"], med[m]["tpot"]))
        print("| on / off | %.3f | %.3f |" % (med["on"]["tok_s"] / med["off"]["tok_s"],
                                              med["on"]["tpot"] / med["off"]["tpot"]))
        t = scrape(ports["decode0"])
        n = value(t, "kvrail:inter_token_latency_seconds_count")
        s = value(t, "kvrail:inter_token_latency_seconds_sum")
        print("decode node with metrics: %d inter-token gaps observed, mean %.3f ms; one mirror "
              "copy (once a second) %.1f us" % (n, s / n * 1e3,
                                                value(t, "kvrail_metrics_update_seconds") * 1e6))
        print("raw: " + json.dumps(rows))
    finally:
        stop.set()
        cl.reap_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
