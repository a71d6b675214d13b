"""bench_frontend.py - the frontend's overhead: the same closed-loop load
(C concurrent streams, random token-id prompts of P tokens, M output tokens,
greedy, ignore_eos) through kvrail-frontend's HTTP (kvrail-loadgen --openai:
streamed /v1/completions on keep-alive connections) and straight into the
router (kvrail-loadgen, protobuf) - one client program, one measurement
code, the transport apart - on one real
1 prefill + 1 decode cluster, alternating R rounds; prints a markdown table
of TTFT / e2e percentiles and output tokens/s, and HTTP / protobuf ratios
(medians over the rounds).  Not a test: run it by hand.

  python3 tests/frontend/bench_frontend.py --router B/router/kvrail-router \\
    --prefill-bin B/prefill/kvrail-prefill --decode-bin B/decode/kvrail-decode \\
    --kvrail B/tools/kvrail/kvrail --mkmodel B/tools/mkmodel/kvrail-mkmodel \\
    --loadgen B/tools/loadgen/kvrail-loadgen --frontend B/frontend/kvrail-frontend \\
    [--concurrency 8 --requests 200 --prompt-len 64 --output-len 32 --rounds 3]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cluster_lib as cl  # noqa: E402


def cpu_s(pid):
    """utime + stime of a process, in seconds"""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ctx_switches(pid):
    """voluntary + involuntary context switches of every thread of a process:
    a voluntary one is a thread that blocked (and so was woken again)"""
    vol = invol = 0
    for t in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/status" % (pid, t)) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
    return vol, invol


def child_ctx_switches():
    """context switches of the reaped children so far (kvrail-loadgen's runs),
    and their CPU time (user + system, s)"""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_nvcsw, r.ru_nivcsw, r.ru_utime + r.ru_stime


FINE = ("added_ttft", "to_router", "to_client")


def fine_hists(base):
    """{name: (count, sum_s, {le: cumulative})} of kvrail_frontend_NAME_seconds"""
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    out = {}
    for name in FINE:
        m = "kvrail_frontend_%s_seconds" % name
        count, total, buckets = 0, 0.0, {}
        for line in text.splitlines():
            if line.startswith(m + "_bucket"):
                le = line.split(',le="')[1].split('"')[0]
                buckets[le] = int(line.rsplit(" ", 1)[1])
            elif line.startswith(m + "_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith(m + "_count"):
                count = int(line.rsplit(" ", 1)[1])
        out[name] = (count, total, buckets)
    return out


def quantile_bound(b0, b1, q):
    """the upper bound of the bucket holding quantile q of the difference b1 - b0"""
    if "+Inf" not in b1:
        return "n/a"  # a frontend without this histogram
    les = sorted((k for k in b1 if k != "+Inf"), key=float) + ["+Inf"]
    n = b1["+Inf"] - b0.get("+Inf", 0)
    for le in les:
        if b1[le] - b0.get(le, 0) >= q * n:
            return le
    return "+Inf"


def cpu_list(text):
    """{cpus} of a list like 0,2-3"""
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_str(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def sched_str():
    """this process's scheduling policy (its children's, unless they change it)"""
    pol = os.sched_getscheduler(0)
    names = {os.SCHED_OTHER: "SCHED_OTHER (CFS)", os.SCHED_FIFO: "SCHED_FIFO",
             os.SCHED_RR: "SCHED_RR"}
    prio = os.sched_getparam(0).sched_priority
    return names.get(pol, str(pol)) + (" priority %d" % prio if prio else "")


def strace_counts(path):
    """{syscall: calls} from an strace -c summary"""
    out = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 5 and p[0][0].isdigit() and p[-1] != "total":
                out[p[-1]] = int(p[3])
    return out


def print_syscalls(d, rounds, requests, out_len):
    """system calls per request of the frontend and of each loadgen path"""
    tables = {"kvrail-frontend": strace_counts(os.path.join(d, "frontend.txt"))}
    if os.path.exists(os.path.join(d, "frontend-b.txt")):
        tables["kvrail-frontend B"] = strace_counts(os.path.join(d, "frontend-b.txt"))
    for k in ("protobuf", "http"):
        tot = {}
        for rnd in range(rounds):
            for n, v in strace_counts(os.path.join(d, "loadgen-%s-%d.txt" % (k, rnd))).items():
                tot[n] = tot.get(n, 0) + v
        tables["kvrail-loadgen (%s)" % k] = tot
    names = sorted({n for t in tables.values() for n in t},
                   key=lambda n: -max(t.get(n, 0) for t in tables.values()))
    n = rounds * requests
    print("system calls per request (%d requests of %d tokens; strace -f -c)" % (n, out_len))
    print("| call | " + " | ".join(tables) + " |")
    print("|---|" + "---:|" * len(tables))
    for name in names:
        if max(t.get(name, 0) for t in tables.values()) >= n / 10:
            print("| %s | " % name + " | ".join("%.1f" % (t.get(name, 0) / n)
                                               for t in tables.values()) + " |")
    print("| all | " + " | ".join("%.1f" % (sum(t.values()) / n) for t in tables.values()) + " |")


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--frontend", required=True)
    ap.add_argument("--frontend-b", metavar="BIN",
                    help="a second kvrail-frontend binary (another build), run beside the first "
                         "in every round: an A/B of two frontends under the same load")
    ap.add_argument("--frontend-args", default="",
                    help="extra arguments of the first frontend (e.g. '--router-link zmq')")
    ap.add_argument("--frontend-b-args", default="",
                    help="extra arguments of the second frontend (--frontend-b, or the same "
                         "binary when only these are given)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mkmodel-args", default="", help="extra kvrail-mkmodel arguments")
    ap.add_argument("--placement", choices=("shared", "split"), default="shared",
                    help="shared (default): every process on every CPU, as the scheduler "
                         "places them; split: the cluster (router, prefill, decode) on "
                         "--cluster-cpus and the client side (every kvrail-loadgen and the "
                         "frontends) on --client-cpus, the same in both arms - a frontend on "
                         "its own host or cores beside its clients, as deployments run it")
    ap.add_argument("--cluster-cpus", default="",
                    help="CPUs of the cluster with --placement split (e.g. 0 or 0-3; default "
                         "the first half of this process's CPUs)")
    ap.add_argument("--client-cpus", default="",
                    help="CPUs of the client side with --placement split (default the rest)")
    ap.add_argument("--client-fifo", type=int, metavar="PRIO",
                    help="run the client side (every kvrail-loadgen and the frontends) SCHED_FIFO "
                         "at PRIO, the same in both arms; with the cluster under chrt -f at a "
                         "lower priority, a woken client preempts the nodes' compute at once "
                         "instead of waiting for it to block")
    ap.add_argument("--perf-record", metavar="FILE",
                    help="record the frontend's profile (perf record -g) over the rounds")
    ap.add_argument("--strace", metavar="DIR",
                    help="count system calls (strace -f -c) of the frontend (and of "
                         "--frontend-b's) and of both kvrail-loadgen runs into DIR, and print them per request (slows "
                         "every process down: the timings of such a run do not count)")
    a = ap.parse_args()
    if a.frontend_b_args and not a.frontend_b:
        a.frontend_b = a.frontend
    all_cpus = sorted(os.sched_getaffinity(0))
    cluster_cpus = client_cpus = set(all_cpus)
    if a.placement == "split":
        half = max(1, len(all_cpus) // 2)
        cluster_cpus = cpu_list(a.cluster_cpus) if a.cluster_cpus else set(all_cpus[:half])
        client_cpus = cpu_list(a.client_cpus) if a.client_cpus else set(all_cpus[half:])
        if not client_cpus or cluster_cpus & client_cpus:
            sys.exit("--placement split needs two disjoint sets of CPUs (cluster %s, client %s; "
                     "this process may use %s): give --cluster-cpus and --client-cpus"
                     % (sorted(cluster_cpus), sorted(client_cpus), all_cpus))
    load0 = os.getloadavg()
    bins = cl.Bins(a)
    work = tempfile.mkdtemp(prefix="kvr-fe-bench-")
    try:
        model = cl.make_model(bins, work, a.mkmodel_args.split())
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        c = cl.Cluster(bins, work, model, n_prefill=1, n_decode=1, pool_blocks=8192)
        # children inherit this process's CPUs: the cluster starts on its own,
        # the frontends and every kvrail-loadgen run after the switch on theirs
        os.sched_setaffinity(0, cluster_cpus)
        c.start()
        os.sched_setaffinity(0, client_cpus)
        cluster_sched = sched_str()
        if a.client_fifo:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(a.client_fifo))
        port = cl.free_port()
        base = "http://127.0.0.1:%d" % port
        fe = cl.spawn([a.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port]
                      + a.frontend_args.split(),
                 stdout=open(os.path.join(work, "frontend.log"), "w"), stderr=subprocess.STDOUT)
        bases = {"http": base}
        if a.frontend_b:
            port_b = cl.free_port()
            bases["http-b"] = "http://127.0.0.1:%d" % port_b
            fe_b = cl.spawn([a.frontend_b, "--config", c.config, "--listen",
                             "127.0.0.1:%d" % port_b] + a.frontend_b_args.split(),
                     stdout=open(os.path.join(work, "frontend-b.log"), "w"),
                     stderr=subprocess.STDOUT)
        for b in bases.values():
            for _ in range(200):
                try:
                    if urllib.request.urlopen(b + "/ready", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
        perf = None
        if a.perf_record:
            perf = cl.spawn(["perf", "record", "-g", "-o", a.perf_record, "-p", str(fe.pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)  # perf attaches
        straces = []
        if a.strace:
            os.makedirs(a.strace, exist_ok=True)
            for name, p in [("frontend", fe)] + ([("frontend-b", fe_b)] if a.frontend_b else []):
                straces.append(cl.spawn(["strace", "-f", "-c", "-o",
                                         os.path.join(a.strace, name + ".txt"), "-p", str(p.pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1)  # strace attaches

        def traced(cmd, name):
            if not a.strace:
                return cmd
            return ["strace", "-f", "-c", "-o", os.path.join(a.strace, name + ".txt")] + cmd

        rows = {k: [] for k in ["protobuf"] + list(bases)}

        def run_b(rnd, seed):
            # prompts of its own: with A's, the second of the two would hit the prefix cache
            sj = os.path.join(work, "httpb%d.json" % rnd)
            c0 = cpu_s(fe_b.pid)
            r = cl.run([bins.loadgen, "--openai", bases["http-b"], "--mode", "closed",
                        "--concurrency", str(a.concurrency), "--requests", str(a.requests),
                        "--prompt-len", str(a.prompt_len), "--output-len", str(a.output_len),
                        "--vocab", str(vocab), "--seed", str(seed + 100001), "--warmup", "8",
                        "--summary-json", sj, "--quiet"], timeout=600)
            if r.returncode != 0:
                raise cl.Fail("loadgen --openai (B): %s %s" % (r.stdout, r.stderr))
            with open(sj) as f:
                rows["http-b"].append(json.load(f))
            rows["http-b"][-1]["frontend_cpu_s"] = cpu_s(fe_b.pid) - c0
        for rnd in range(a.rounds):
            seed = 1000 + rnd * 2
            sj = os.path.join(work, "lg%d.json" % rnd)
            k0 = child_ctx_switches()
            r = cl.run(traced([bins.loadgen, "--router", c.client_ep, "--mode", "closed",
                               "--concurrency", str(a.concurrency), "--requests", str(a.requests),
                               "--prompt-len", str(a.prompt_len), "--output-len",
                               str(a.output_len), "--vocab", str(vocab), "--seed", str(seed),
                               "--warmup", "8", "--summary-json", sj, "--quiet"],
                              "loadgen-protobuf-%d" % rnd), timeout=600)
            if r.returncode != 0:
                raise cl.Fail("loadgen: %s %s" % (r.stdout, r.stderr))
            with open(sj) as f:
                rows["protobuf"].append(json.load(f))
            k1 = child_ctx_switches()
            rows["protobuf"][-1]["client_cs"] = [k1[0] - k0[0], k1[1] - k0[1]]
            rows["protobuf"][-1]["client_cpu_s"] = k1[2] - k0[2]
            if a.frontend_b and rnd % 2 == 1:  # B before A in odd rounds, after in even
                run_b(rnd, seed)
            c0 = cpu_s(fe.pid)
            a0 = fine_hists(base)
            f0, k0 = ctx_switches(fe.pid), child_ctx_switches()
            sj = os.path.join(work, "http%d.json" % rnd)
            r = cl.run(traced([bins.loadgen, "--openai", base, "--mode", "closed",
                               "--concurrency", str(a.concurrency), "--requests", str(a.requests),
                               "--prompt-len", str(a.prompt_len), "--output-len",
                               str(a.output_len), "--vocab", str(vocab), "--seed", str(seed + 1),
                               "--warmup", "8", "--summary-json", sj, "--quiet"],
                              "loadgen-http-%d" % rnd), timeout=600)
            if r.returncode != 0:
                raise cl.Fail("loadgen --openai: %s %s" % (r.stdout, r.stderr))
            with open(sj) as f:
                rows["http"].append(json.load(f))
            rows["http"][-1]["frontend_cpu_s"] = cpu_s(fe.pid) - c0
            f1, k1 = ctx_switches(fe.pid), child_ctx_switches()
            rows["http"][-1]["client_cs"] = [k1[0] - k0[0], k1[1] - k0[1]]
            rows["http"][-1]["client_cpu_s"] = k1[2] - k0[2]
            rows["http"][-1]["frontend_cs"] = [f1[0] - f0[0], f1[1] - f0[1]]
            a1 = fine_hists(base)
            for name in FINE:
                h0, h1 = a0[name], a1[name]
                rows["http"][-1][name + "_us"] = {
                    "mean": (h1[1] - h0[1]) / max(1, h1[0] - h0[0]) * 1e6,
                    "p50_le": quantile_bound(h0[2], h1[2], 0.5),
                    "p99_le": quantile_bound(h0[2], h1[2], 0.99)}
            if a.frontend_b and rnd % 2 == 0:
                run_b(rnd, seed)
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=60)
        for st in straces:
            st.send_signal(2)
            st.wait(timeout=60)
        if straces:
            print_syscalls(a.strace, a.rounds, a.requests + 8, a.output_len)
        med = {}
        for k, rs in rows.items():
            med[k] = {
                "ttft_p50": statistics.median(x["ttft_ms"]["p50"] for x in rs),
                "ttft_p99": statistics.median(x["ttft_ms"]["p99"] for x in rs),
                "e2e_p50": statistics.median(x["e2e_ms"]["p50"] for x in rs),
                "e2e_p99": statistics.median(x["e2e_ms"]["p99"] for x in rs),
                "tok_s": statistics.median(x["out_tok_per_s"] for x in rs),
            }
        print("%d concurrent streams, %d requests per run, prompt %d, output %d tokens, "
              "median of %d alternating rounds" % (a.concurrency, a.requests, a.prompt_len,
                                                   a.output_len, a.rounds))
        print("placement: %s; scheduling: %s" % (
            "shared (every process on CPUs %s)" % cpu_str(all_cpus) if a.placement == "shared"
            else "split (router, prefill, decode on CPUs %s; kvrail-loadgen and the frontends "
                 "on CPUs %s)" % (cpu_str(cluster_cpus), cpu_str(client_cpus)),
            "cluster %s, client side %s" % (cluster_sched, sched_str())))
        print("| path | TTFT p50 ms | TTFT p99 ms | e2e p50 ms | e2e p99 ms | output tok/s |")
        print("|---|---:|---:|---:|---:|---:|")
        names = {"protobuf": "kvrail-loadgen (protobuf)", "http": "kvrail-frontend (HTTP+SSE)",
                 "http-b": "kvrail-frontend B (HTTP+SSE)"}
        for k in rows:
            m = med[k]
            print("| %s | %.2f | %.2f | %.2f | %.2f | %.0f |" % (
                names[k], m["ttft_p50"], m["ttft_p99"], m["e2e_p50"], m["e2e_p99"], m["tok_s"]))
        p = med["protobuf"]
        for k in bases:
            h, tag = med[k], "HTTP" if k == "http" else "HTTP B"
            print("| %s / protobuf | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                tag, h["ttft_p50"] / p["ttft_p50"], h["ttft_p99"] / p["ttft_p99"],
                h["e2e_p50"] / p["e2e_p50"], h["e2e_p99"] / p["e2e_p99"],
                h["tok_s"] / p["tok_s"]))
            print("| %s - protobuf (ms) | %+.2f | %+.2f | %+.2f | %+.2f | |" % (
                tag, h["ttft_p50"] - p["ttft_p50"], h["ttft_p99"] - p["ttft_p99"],
                h["e2e_p50"] - p["e2e_p50"], h["e2e_p99"] - p["e2e_p99"]))
        for k in bases:
            fcpu = statistics.median(x["frontend_cpu_s"] / (a.requests + 8) for x in rows[k])
            print("kvrail-frontend%s CPU time: %.0f us per request (%d output tokens), warm-up "
                  "included" % (" B" if k == "http-b" else "", fcpu * 1e6, a.output_len))
        n = a.requests + 8
        print("kvrail-loadgen CPU time per request, medians: protobuf %.0f us, HTTP %.0f us" % tuple(
            statistics.median(x["client_cpu_s"] for x in rows[k]) / n * 1e6
            for k in ("protobuf", "http")))
        print("context switches per request, voluntary (a thread blocked and was woken) + "
              "involuntary, medians: kvrail-loadgen (protobuf) %.1f + %.1f; kvrail-loadgen "
              "(HTTP) %.1f + %.1f; kvrail-frontend %.1f + %.1f" % tuple(
                  statistics.median(x[key][i] for x in rows[k]) / n
                  for k, key in (("protobuf", "client_cs"), ("http", "client_cs"),
                                 ("http", "frontend_cs")) for i in (0, 1)))
        for name, what in (("added_ttft", "its TTFT minus the router's"),
                           ("to_router", "request body complete -> sent to the router"),
                           ("to_client", "token frame taken -> its SSE event handed to the socket")):
            print("kvrail-frontend %s (%s, from /metrics): mean %s us; p50 <= %s s, p99 <= %s s "
                  "per round" % (name, what,
                                 ", ".join("%.0f" % x[name + "_us"]["mean"] for x in rows["http"]),
                                 ", ".join(x[name + "_us"]["p50_le"] for x in rows["http"]),
                                 ", ".join(x[name + "_us"]["p99_le"] for x in rows["http"])))
        la = os.getloadavg()
        print("load average at the start: %.2f %.2f %.2f; at the end: %.2f %.2f %.2f"
              % (load0 + la))
        print("raw rounds: " + json.dumps(rows))
    finally:
        cl.reap_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
