"""metrics_test.py - Prometheus /metrics, /health and /ready on every
process of a real 1 prefill + 1 decode cluster (router, prefill, decode as
separate processes, metrics_port from the cluster file).

It runs a known load (remote and local prefills), then scrapes every
process over HTTP and checks: `promtool check metrics` parses every
endpoint's output; the counters moved by exactly what the load did
(requests, generated tokens, KV bytes pushed by the prefill node == KV
bytes received by the decode node == what the stats files say); the
router's TTFT and end-to-end histograms counted every request; /health is
200 and /ready 200 once registered.  Malformed HTTP (garbage, a POST with
a huge body, a half request left open) leaves every process serving.
The per-event series: the decode node's inter-token latency (one per token
after a request's first), the prefill node's KV bytes / seconds per
transfer (one per remote prefill), no transfer failure, no migration,
successes by finish reason.  Finally a real Prometheus server scrapes the
three processes and kvrail-frontend (one completion through it) on
loopback and the test finds those series in its HTTP API.
Needs promtool and prometheus (Debian `prometheus`; install-deps --test):
exits 77 without them.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402
from cluster_lib import check  # noqa: E402

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def http_get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode(), r.getheader("Content-Type") or ""
    finally:
        c.close()


def http_ok(port, path):
    try:
        return http_get(port, path, timeout=5)[0] == 200
    except OSError:
        return False


def parse(text):
    """{(name, frozenset(labels without node/role/model)): value}"""
    out = {}
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        m = LINE.match(ln)
        check(m, "unparsable metrics line: %r" % ln)
        labels = dict(LABEL.findall(m.group(3) or ""))
        for k in ("node", "role", "model"):
            labels.pop(k, None)
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(4))
    return out


def val(ms, name, **labels):
    return ms.get((name, frozenset(labels.items())))


def scrape(port):
    st, body, ctype = http_get(port, "/metrics")
    check(st == 200, "GET /metrics on port %d: %d %s" % (port, st, body[:200]))
    check(ctype.startswith("text/plain; version=0.0.4"), "Content-Type %r" % ctype)
    return body


def wait_for(what, fn, timeout=20):
    """Polls fn() -> (ok, detail) until ok; the figures are mirrored once a second."""
    deadline = time.monotonic() + timeout
    while True:
        ok, detail = fn()
        if ok:
            return detail
        if time.monotonic() > deadline:
            raise cl.Fail("%s: not after %d s: %s" % (what, timeout, detail))
        time.sleep(0.2)


def add_ports(config, ports):
    """Gives every node of the cluster file its metrics_port."""
    with open(config) as f:
        lines = f.read().split("\n")
    out = []
    for ln in lines:
        out.append(ln)
        m = re.match(r"^  - name: (\S+)$", ln)
        if m and m.group(1) in ports:
            out.append("    metrics_port: %d" % ports[m.group(1)])
    with open(config, "w") as f:
        f.write("\n".join(out))


def abuse(port):
    """Malformed HTTP at a metrics port; each connection must end."""
    for payload in (b"GARBAGE\x00\xff\r\n\r\n", b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n",
                    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n" +
                    b"x" * 65536, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(payload)
        except OSError:
            pass  # the server may close before reading it all
        try:
            s.recv(4096)
        except OSError:
            pass
        s.close()
    # a half request left open (slowloris): the server must keep serving others
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--frontend", help="kvrail-frontend: scraped with the others")
    args = ap.parse_args()
    for tool in ("promtool", "prometheus"):
        if not shutil.which(tool):
            print("SKIP: %s not installed (tools/install-deps.sh --test installs the Debian "
                  "package prometheus)" % tool)
            return cl.SKIP
    bins = cl.Bins(args)
    wd = cl.workdir("kvr-metrics-")
    model = cl.make_model(bins, wd)
    c = cl.Cluster(bins, wd, model, n_prefill=1, n_decode=1, local_prefill_tokens=8)
    ports = {n: cl.free_port() for n in ("router", "prefill0", "decode0")}
    add_ports(c.config, ports)
    prom = None
    ok = False
    try:
        c.start()
        for n, p in ports.items():
            st, body, _ = http_get(p, "/health")
            check(st == 200 and body == "ok\n", "%s /health: %d %r" % (n, st, body))
            wait_for("%s /ready" % n, lambda p=p: (http_get(p, "/ready")[0] == 200,
                                                   http_get(p, "/ready")))
            st, _, _ = http_get(p, "/nope")
            check(st == 404, "%s /nope: %d" % (n, st))
        print("ok /health 200, /ready 200 on router, prefill0, decode0; unknown path 404")

        # a known load: 6 prompts long enough for a remote prefill, 2 local
        prompts = [(list(range(5, 5 + 40 + 7 * i)), 6 + i) for i in range(6)]
        prompts += [(list(range(9, 13)), 5), (list(range(20, 25)), 4)]
        rc, outs, log = c.loadgen(prompts)
        check(rc == 0 and len(outs) == len(prompts), "load failed (%d): %s" % (rc, log[-2000:]))
        n_req = len(prompts)
        gen = sum(len(o.get("tokens", [])) for o in outs.values())
        check(gen == sum(mt for _, mt in prompts),
              "generated %d tokens, want %d" % (gen, sum(mt for _, mt in prompts)))
        c.wait_idle()

        def router_done():
            ms = parse(scrape(ports["router"]))
            ok = val(ms, "kvrail_router_requests_total", result="ok")
            return ok == n_req, ok
        wait_for("router requests_total{result=ok} == %d" % n_req, router_done)

        def nodes_settled():
            ps, ds = c.stats("prefill0"), c.stats("decode0")
            pm = parse(scrape(ports["prefill0"]))
            dm = parse(scrape(ports["decode0"]))
            pushed = val(pm, "kvrail_kv_bytes_pushed_total")
            got = val(dm, "kvrail_kv_bytes_received_total")
            toks = val(dm, "kvrail:generation_tokens_total")
            ok = (pushed == ps.get("bytes_pushed") and got == ds.get("kv_bytes_received") and
                  toks == ds.get("tokens_out") == gen and pushed == got and pushed > 0)
            return ok, dict(pushed=pushed, stats_pushed=ps.get("bytes_pushed"), received=got,
                            stats_received=ds.get("kv_bytes_received"), tokens=toks, gen=gen)
        d = wait_for("node counters == stats files == the load", nodes_settled)
        print("ok KV bytes pushed (prefill0) == received (decode0) == stats files: %d; "
              "generation tokens %d" % (d["pushed"], d["tokens"]))

        texts = {n: scrape(p) for n, p in ports.items()}
        rm, pm, dm = (parse(texts[n]) for n in ("router", "prefill0", "decode0"))
        check(val(rm, "kvrail_router_requests_received_total") == n_req, "received")
        for name in ("kvrail:time_to_first_token_seconds_count",
                     "kvrail:e2e_request_latency_seconds_count",
                     "kvrail:request_generation_tokens_count"):
            check(val(rm, name) == n_req, "router %s = %s, want %d" % (name, val(rm, name), n_req))
        check(val(rm, "kvrail:request_generation_tokens_sum") == gen, "generation tokens sum")
        check(val(rm, "kvrail:time_to_first_token_seconds_bucket", le="+Inf") == n_req, "+Inf")
        remote = val(rm, "kvrail_router_prefills_total", where="remote")
        local = val(rm, "kvrail_router_prefills_total", where="local")
        check(remote >= 6 and local >= 2 and remote + local == n_req,
              "router prefills remote %s local %s, want 6 / 2" % (remote, local))
        check(val(dm, "kvrail_decode_prefills_total", where="remote") == remote and
              val(dm, "kvrail_decode_prefills_total", where="local") == local,
              "decode node's prefill split differs from the router's")
        check(val(pm, "kvrail_prefill_requests_total", result="ok") == remote,
              "prefill0 prefills ok %s, want %s" % (val(pm, "kvrail_prefill_requests_total",
                                                        result="ok"), remote))
        check(val(dm, "kvrail_decode_requests_total", result="done") == n_req, "decode done")
        for peer in ("prefill0", "decode0"):
            check(val(rm, "kvrail_node_up", peer=peer,
                      peer_role=peer.rstrip("0")) == 1, "router sees %s up" % peer)
        check(0 <= val(dm, "kvrail:kv_cache_usage_perc") <= 1, "kv_cache_usage_perc")
        # per-event histograms: one inter-token gap per token after a request's first, one
        # KV transfer per remote prefill (bytes summed == the counter), no failure
        itl = val(dm, "kvrail:inter_token_latency_seconds_count")
        check(itl == gen - n_req, "decode ITL count %s, want %d (tokens - requests)" %
              (itl, gen - n_req))
        check(val(dm, "kvrail:inter_token_latency_seconds_bucket", le="+Inf") == itl, "ITL +Inf")
        check(val(pm, "kvrail_kv_transfer_bytes_count") == remote and
              val(pm, "kvrail_kv_transfer_seconds_count") == remote,
              "KV transfer histograms count %s / %s, want %s" % (
                  val(pm, "kvrail_kv_transfer_bytes_count"),
                  val(pm, "kvrail_kv_transfer_seconds_count"), remote))
        check(val(pm, "kvrail_kv_transfer_bytes_sum") == d["pushed"], "KV bytes histogram sum")
        check(val(pm, "kvrail_kv_transfer_seconds_sum") > 0, "KV seconds histogram sum")
        check(val(pm, "kvrail_kv_transfer_failures_total", status="none") == 0,
              "transfer failures series")
        check(val(rm, "kvrail_router_migrations_total") == 0, "migrations")
        succ = (val(rm, "kvrail:request_success_total", finished_reason="stop"),
                val(rm, "kvrail:request_success_total", finished_reason="length"))
        check(succ[0] + succ[1] == n_req and succ[1] >= 1,
              "kvrail:request_success_total stop/length %s, want %d in all" % (succ, n_req))
        print("ok kvrail:inter_token_latency_seconds count %d, KV transfer bytes/seconds "
              "histograms count %d (bytes sum == pushed), failures 0, migrations 0" %
              (itl, remote))
        cost = {n: val(m, "kvrail_metrics_update_seconds")
                 for n, m in (("router", rm), ("prefill0", pm), ("decode0", dm))}
        check(all(v is not None and v > 0 for v in cost.values()), "update cost %s" % cost)
        print("note: one copy into the registry (once a second) took: %s" %
              ", ".join("%s %.1f us" % (n, v * 1e6) for n, v in cost.items()))
        print("ok router: %d requests, TTFT/e2e histograms count %d, prefills remote %d local %d "
              "== decode node's" % (n_req, n_req, remote, local))

        for n, t in texts.items():
            r = cl.sp_run(["promtool", "check", "metrics"], timeout=30, input=t,
                          capture_output=True, text=True)
            msg = (r.stdout + r.stderr).strip()
            # promtool's only lint may be on the vLLM-style kvrail: names (colons)
            bad = [ln for ln in msg.splitlines()
                   if ln.strip() and "kvrail:" not in ln and "error while linting" not in ln]
            check(r.returncode in (0, 3) and not bad, "promtool check metrics on %s (%d): %s" %
                  (n, r.returncode, msg))
            check("error while linting" not in msg or r.returncode != 1, "promtool parse")
        print("ok promtool check metrics parses router, prefill0, decode0")

        # malformed HTTP: every process keeps serving, the node keeps working
        held = [abuse(p) for p in ports.values()]
        for n, p in ports.items():
            st, _, _ = http_get(p, "/health")
            check(st == 200, "%s /health after abuse: %d" % (n, st))
        for h in held:
            h.close()
        rc, outs2, log = c.loadgen([(list(range(7, 60)), 3)], name="after")
        check(rc == 0 and len(outs2) == 1, "a request after the abuse failed: %s" % log[-1000:])
        c.check_alive()
        print("ok malformed HTTP (garbage, HTTP/9.9, 100 MB POST, 70 kB URL, half request): "
              "every process serves /health, the cluster serves requests")

        # the frontend too: one completion through it
        targets = dict(ports)
        if args.frontend:
            fport = cl.free_port()
            flog = open(os.path.join(wd, "frontend.log"), "w")
            fe = cl.spawn([args.frontend, "--config", c.config, "--listen",
                           "127.0.0.1:%d" % fport], stdout=flog, stderr=subprocess.STDOUT)
            wait_for("frontend /ready", lambda: (fe.poll() is None and
                                                 http_ok(fport, "/ready"), fe.poll()))
            body = json.dumps({"model": os.path.basename(model), "prompt": list(range(9, 30)),
                               "max_tokens": 3}).encode()
            req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % fport, data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                check(resp.status == 200, "completion through the frontend: %d" % resp.status)
            targets["frontend"] = fport
        n_router = n_req + 1 + (1 if args.frontend else 0)

        # a real Prometheus server scrapes every process
        pport = cl.free_port()
        yml = os.path.join(wd, "prometheus.yml")
        with open(yml, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                    "  - job_name: kvrail\n    static_configs:\n      - targets: [%s]\n" %
                    ", ".join("'127.0.0.1:%d'" % p for p in targets.values()))
        plog = open(os.path.join(wd, "prometheus.log"), "w")
        prom = cl.spawn(["prometheus", "--config.file", yml, "--storage.tsdb.path",
                         os.path.join(wd, "tsdb"), "--web.listen-address", "127.0.0.1:%d" % pport],
                        stdout=plog, stderr=subprocess.STDOUT)

        def query(q):
            try:
                st, body, _ = http_get(pport, "/api/v1/query?query=" + urllib.parse.quote(q))
            except OSError as e:
                return None, str(e)
            if st != 200:
                return None, body[:300]
            return json.loads(body)["data"]["result"], body[:300]

        def prom_has():
            check(prom.poll() is None, "prometheus exited: see %s" % plog.name)
            res, body = query('kvrail_router_requests_total{result="ok"}')
            ttft, _ = query('kvrail:time_to_first_token_seconds_count{role="router"}')
            fe_ok, _ = query('kvrail_frontend_requests_total{endpoint="/v1/completions",'
                             'status="200"}')
            itl_p, _ = query("kvrail:inter_token_latency_seconds_count")
            xfer, _ = query("kvrail_kv_transfer_bytes_count")
            mig, _ = query("kvrail_router_migrations_total")
            up, _ = query("up")
            ok = (res and float(res[0]["value"][1]) == n_router and ttft and
                  float(ttft[0]["value"][1]) == n_router and up and len(up) == len(targets) and
                  (not args.frontend or (fe_ok and float(fe_ok[0]["value"][1]) == 1)) and
                  itl_p and float(itl_p[0]["value"][1]) >= itl and
                  xfer and float(xfer[0]["value"][1]) >= remote and mig and
                  all(u["value"][1] == "1" for u in up))
            return ok, (body, ttft, up)
        wait_for("Prometheus scraped kvrail series", prom_has, timeout=60)
        print("ok prometheus scraped %d targets (%s; up == 1): kvrail_router_requests_total"
              "{result=ok} == %d, kvrail:time_to_first_token_seconds_count == %d, the decode "
              "node's ITL, the prefill node's KV transfers%s" % (
                  len(targets), ", ".join(targets), n_router, n_router,
                  ", the frontend's completions" if args.frontend else ""))

        # the CLI: token-id prompts, --usage's final line, --n choices, --stop
        def gen(*a):
            r = cl.run([bins.kvrail, "generate", "--router", c.client_ep, "--timeout", "60000",
                        *a], timeout=90)
            check(r.returncode == 0, "kvrail generate %s: rc %d: %s" % (a, r.returncode, r.stderr))
            return r
        r = gen("--max-tokens", "5", "--ignore-eos", "--json", "--usage", "--prompt-tokens",
                "5,6,7,8,9,10")
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        check(lines[0] == {"prompt_tokens": [5, 6, 7, 8, 9, 10]}, "prompt line %s" % lines[0])
        check(len(lines) == 7 and all("token_id" in x for x in lines[1:6]), r.stdout)
        check(lines[-1]["finish_reason"] == "length" and lines[-1]["usage"]["prompt_tokens"] == 6
              and lines[-1]["usage"]["completion_tokens"] == 5, "usage line %s" % lines[-1])
        r = gen("--max-tokens", "4", "--ignore-eos", "--json", "--usage", "--n", "3",
                "--temperature", "1", "--seed", "11", "--prompt-tokens", "5,6,7")
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        toks = [x for x in lines if "token_id" in x]
        ends = [x for x in lines if "finish_reason" in x]
        check(sorted(x["index"] for x in toks) == [0] * 4 + [1] * 4 + [2] * 4, r.stdout)
        check(sorted(x["index"] for x in ends) == [0, 1, 2] and
              all(x["usage"]["completion_tokens"] == 4 for x in ends), r.stdout)
        full = gen("--max-tokens", "12", "--ignore-eos", "--json", "--prompt-tokens", "5,6,7,8,9")
        ids = [json.loads(x) for x in full.stdout.splitlines()[1:]]
        check("finish_reason" in ids[-1] and ids[-1]["usage"]["completion_tokens"] == 12,
              "--json ends with the finish/usage line by default: %s" % ids[-1])
        ids = ids[:-1]
        # a stop text: the first token text (after the first) not seen before it
        cands = [j for j in range(1, len(ids)) if ids[j]["text"].strip() and
                 ids[j]["text"] not in "".join(x["text"] for x in ids[:j])]
        check(cands, "no usable stop text in %s" % full.stdout)
        j = cands[0]
        stop = ids[j]["text"]
        r = gen("--max-tokens", "12", "--ignore-eos", "--json", "--usage", "--stop", stop,
                "--prompt-tokens", "5,6,7,8,9")
        last = json.loads(r.stdout.splitlines()[-1])
        check(last["finish_reason"] == "stop" and last["usage"]["completion_tokens"] <= j + 1,
              "--stop %r (token %d): %s" % (stop, j, last))
        # the stop text and what follows are not printed (OpenAI's rule), --json and text
        want = "".join(x["text"] for x in ids)
        want = want[:want.index(stop)]
        got = "".join(json.loads(x).get("text", "") for x in r.stdout.splitlines()[1:])
        check(got == want, "--stop %r --json printed %r, want %r" % (stop, got, want))
        t = gen("--max-tokens", "12", "--ignore-eos", "--stop", stop, "--prompt-tokens",
                "5,6,7,8,9")
        check(t.stdout == want + "\n", "--stop %r printed %r, want %r" % (stop, t.stdout, want))
        print("ok kvrail generate --stop %r: finish_reason stop after %d tokens" %
              (stop, last["usage"]["completion_tokens"]))
        print("ok kvrail generate: --prompt-tokens, --usage final line, --n 3 (4 tokens each)")
        ok = True
    finally:
        if prom:
            cl.stop_group(prom)
        c.stop()
        if ok and not args.keep:
            shutil.rmtree(wd, ignore_errors=True)
    print("PASS metrics")
    return 0


if __name__ == "__main__":
    cl.run_main(main)
