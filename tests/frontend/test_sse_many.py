"""test_sse_many.py - 1,000 concurrent SSE streams through kvrail-frontend on
the tiny model, without an error, with the frontend's memory bounded.

A real 1 prefill + 1 decode cluster and a frontend with --max-connections
1100; kvrail-loadgen --openai opens 1,000 keep-alive connections and sends
1,000 streamed completions at once (closed loop, concurrency 1,000: every
request is written before any answer is read), 16 tokens each.  Checks:
  - every request ends ok with its 16 tokens (loadgen's summary), none
    refused (503), the frontend's 200 counter grew by 1,000;
  - the frontend held many connections at once (its high-water gauge);
  - memory is bounded: after each of two bursts (connections gone) the
    frontend's RSS is under RSS_AFTER_MAX, and its peak (VmHWM) under
    RSS_PEAK_MAX (the event-loop frontend: 18-35 MiB after a burst, peak
    84-123 MiB; the thread-per-connection one it replaced kept 75-112 MiB
    after, peak 187-227, in thread stacks and malloc arenas);
  - it still answers /health and a completion afterwards.
Every process is reaped on every exit path (cluster_lib's process groups).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cluster_lib as cl  # noqa: E402
from cluster_lib import check  # noqa: E402

N = 1000
OUT = 16
RSS_AFTER_MAX = 96 << 20  # bytes, RSS after a burst, its connections closed
RSS_PEAK_MAX = 384 << 20  # bytes, VmHWM during the burst


def proc_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise cl.Fail("no %s in /proc/%d/status" % (key, pid))


def metric(base, prefix, *parts):
    """the sum of the series named prefix... whose line holds every part"""
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(prefix + "{") and all(p in line for p in parts):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    check(found, "no %s in the frontend's /metrics" % prefix)
    return total


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--frontend", required=True)
    ap.add_argument("--router-link", choices=["direct", "zmq"], default="direct")
    args = ap.parse_args()
    bins = cl.Bins(args)
    work = cl.workdir("kvr-fe-many-")
    ok = False
    try:
        model = cl.make_model(bins, work)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        # 1,000 streams at once keep a 2-core machine's cores busy for
        # seconds; a long heartbeat timeout keeps this a test of the frontend
        c = cl.Cluster(bins, work, model, n_prefill=1, n_decode=1, pool_blocks=8192,
                       max_batch=256, queue_ms=120000, heartbeat_timeout_ms=30000)
        c.start()
        port = cl.free_port()
        base = "http://127.0.0.1:%d" % port
        flog = open(os.path.join(work, "frontend.log"), "w")
        fe = cl.spawn([args.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port,
                       "--max-connections", "1100", "--idle-timeout-s", "60",
                       "--router-link", args.router_link],
                      stdout=flog, stderr=subprocess.STDOUT)
        def ready():
            check(fe.poll() is None, "the frontend exited: %s" % open(flog.name).read()[-2000:])
            try:
                return urllib.request.urlopen(base + "/ready", timeout=5).status == 200
            except OSError:
                return False
        cl.wait_for("frontend /ready", ready, timeout=30)
        lg = [bins.loadgen, "--openai", base, "--mode", "closed", "--prompt-len", "8",
              "--output-len", str(OUT), "--vocab", str(vocab), "--timeout-ms", "120000"]
        # warm: threads, router clients and buffers of a few connections exist
        r = cl.run(lg + ["--concurrency", "8", "--requests", "32", "--quiet"], timeout=120)
        check(r.returncode == 0, "warm-up load failed (%d): %s %s" % (r.returncode, r.stdout,
                                                                       r.stderr))
        rss0 = proc_kb(fe.pid, "VmRSS") * 1024
        ok200 = metric(base, "kvrail_frontend_requests_total", 'endpoint="/v1/completions"',
                       'status="200"')
        def burst(k):
            """N streams at once; returns (loadgen summary, wall s, RSS after, peak)"""
            ok200 = metric(base, "kvrail_frontend_requests_total", 'endpoint="/v1/completions"',
                           'status="200"')
            sj = os.path.join(work, "many%d.json" % k)
            t0 = time.time()
            r = cl.run(lg + ["--concurrency", str(N), "--requests", str(N), "--seed", str(7 + k),
                             "--summary-json", sj, "--quiet"], timeout=300)
            wall = time.time() - t0
            check(fe.poll() is None, "the frontend exited during the burst:\n%s" %
                  open(flog.name).read()[-3000:])
            with open(sj) as f:
                s = json.load(f)
            check(r.returncode == 0 and s["ok"] == N and s["failed"] == 0 and
                  s["overloaded"] == 0, "burst %d, %d streams: %s\n%s %s\n%s" % (
                      k, N, json.dumps(s)[:600], r.stdout, r.stderr[-2000:],
                      open(flog.name).read()[-2000:]))
            check(s["ttft_ms"]["n"] == N, "every stream produced a token: %s" % s["ttft_ms"])
            # every stream's 16 tokens: 15 gaps each
            check(s["itl_ms"]["n"] == N * (OUT - 1),
                  "%d inter-token gaps, want %d" % (s["itl_ms"]["n"], N * (OUT - 1)))
            ok200b = metric(base, "kvrail_frontend_requests_total", 'endpoint="/v1/completions"',
                            'status="200"')
            check(ok200b - ok200 == N, "frontend counted %d requests, want %d" % (ok200b - ok200,
                                                                                  N))
            check(metric(base, "kvrail_frontend_connections_rejected_total") == 0, "no 503")
            # the connections are closed (loadgen exited)
            cl.wait_for("frontend connections closed",
                        lambda: metric(base, "kvrail_frontend_connections") <= 1, timeout=30)
            return s, wall, proc_kb(fe.pid, "VmRSS") * 1024, proc_kb(fe.pid, "VmHWM") * 1024

        s, wall, rss1, _ = burst(1)
        peak = metric(base, "kvrail_frontend_connections_max")
        s2, wall2, rss2, hwm = burst(2)
        for k, rss in ((1, rss1), (2, rss2)):
            check(rss <= RSS_AFTER_MAX, "frontend RSS %.1f MiB after burst %d (%.1f before), "
                  "bound %d MiB" % (rss / 2**20, k, rss0 / 2**20, RSS_AFTER_MAX >> 20))
        check(hwm <= RSS_PEAK_MAX, "frontend peak RSS %.1f MiB, bound %d MiB" % (
            hwm / 2**20, RSS_PEAK_MAX >> 20))
        r = cl.run(lg + ["--concurrency", "1", "--requests", "2", "--quiet"], timeout=60)
        check(r.returncode == 0, "a request after the burst failed: %s %s" % (r.stdout, r.stderr))
        c.check_alive()
        print("ok 2 x %d concurrent SSE streams (%d tokens each) in %.1f / %.1f s: all ok, "
              "none refused; frontend peak %d connections at once; RSS %.1f MiB before, %.1f "
              "after the first burst, %.1f after the second, peak %.1f MiB; TTFT p50 %.0f ms "
              "p99 %.0f ms" % (N, OUT, wall, wall2, peak, rss0 / 2**20, rss1 / 2**20,
                                rss2 / 2**20, hwm / 2**20, s["ttft_ms"]["p50"],
                                s["ttft_ms"]["p99"]))
        ok = True
    except cl.Fail as e:
        print("FAIL: %s" % e, file=sys.stderr)
    finally:
        cl.reap_all()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory kept: %s" % work, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
