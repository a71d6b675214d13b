"""test_frontend.py - kvrail-frontend against a real 1 prefill + 1 decode
cluster on a generated tiny model, driven by the official OpenAI Node SDK
(sdk_check.mjs) and by raw sockets.

  1. the SDK: models, greedy completions equal to `kvrail run` token for
     token (text, per-token texts and logprobs), sampling with every
     parameter (seed, temperature, top_p, min_p, presence / frequency
     penalties, logit_bias) and top-N logprobs equal to `kvrail run` with
     the same flags (and `kvrail generate --json` through the cluster equal
     to `kvrail run --json` byte for byte, top_logprobs and the finish/usage
     line included), streaming, stop strings,
     max_tokens -> length, usage, prompt lists, n with a seed, error shapes;
     chat with a template written into the model (equal to `kvrail run` on
     the rendered prompt), or 501 in a build without chat templates;
  2. HTTP abuse through raw sockets: garbage bytes, a bad HTTP version,
     truncated and invalid JSON, wrong content type, an oversized body, a
     huge Content-Length: each a clear error, and the frontend still serves;
  3. a client that disconnects mid-stream, or half-closes right after its
     request: the router reports the request canceled and both nodes go
     back to idle;
  4. past --max-connections a connection gets 503 with Retry-After;
  5. /health, /ready, /metrics (the counters the traffic above must have);
  6. the router killed mid-stream: the stream ends with an error event and
     [DONE]; restarted, the frontend (one router client) serves the same
     greedy text again;
  7. a frontend whose router does not answer: 503 with the reason;
  8. a frontend with --busy-poll-us streams the same text with intact SSE
     and chunked framing; a value out of range is refused.
Every process is reaped on every exit path (cluster_lib's process groups).
Exits 77 only when npm cannot fetch the SDK or node is missing.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cluster_lib as cl  # noqa: E402
from cluster_lib import check  # noqa: E402

MAX_CONN = 8
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                 "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                 "\n\n{% endif %}")


def ensure_sdk():
    if not shutil.which("node") or not shutil.which("npm"):
        print("SKIP: node/npm not installed (tools/install-deps.sh --test installs nodejs npm)")
        sys.exit(cl.SKIP)
    if os.path.exists(os.path.join(HERE, "node_modules", "openai", "package.json")):
        return
    r = cl.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], timeout=240, cwd=HERE)
    if r.returncode != 0:
        p = cl.run(["npm", "ping"], timeout=30)
        if p.returncode != 0:
            print("SKIP: the npm registry cannot be reached (npm ping failed); the test needs the "
                  "openai SDK")
            sys.exit(cl.SKIP)
        raise cl.Fail("npm ci failed although the registry answers:\n" + r.stdout + r.stderr)


def http(base, path, body=None, method=None, timeout=30, headers=None):
    """(status, headers, body bytes) of one request."""
    req = urllib.request.Request(base + path, data=body, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def raw(port, data, timeout=10):
    """Sends bytes on a fresh connection, returns what comes back until the
    server closes or timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server answered early (413) and closed while we sent
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out and b"content-length" in out.lower():
                head, _, rest = out.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        if len(rest) >= int(line.split(b":")[1]):
                            return out
        return out
    finally:
        s.close()


def status_line(resp):
    return resp.split(b"\r\n", 1)[0].decode(errors="replace")


def kvrail_run(bins, model, prompt, max_tokens, extra=()):
    r = cl.run([bins.kvrail, "run", "--model", model, "--prompt-tokens",
                ",".join(map(str, prompt)), "--max-tokens", str(max_tokens), "--json", *extra],
               timeout=60)
    check(r.returncode == 0, "kvrail run failed: %s" % r.stderr)
    toks = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    toks = [t for t in toks if "token_id" in t]
    return toks


# every sampling parameter at once; logit_bias bans one token and pushes another
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "min_p": 0.02, "presence_penalty": 0.6,
            "frequency_penalty": 0.9, "seed": 4242, "top_logprobs": 3}


def sampling_flags(bias):
    return ["--temperature", str(SAMPLING["temperature"]), "--top-p", str(SAMPLING["top_p"]),
            "--min-p", str(SAMPLING["min_p"]), "--presence-penalty",
            str(SAMPLING["presence_penalty"]), "--frequency-penalty",
            str(SAMPLING["frequency_penalty"]), "--seed", str(SAMPLING["seed"]),
            "--logprobs", str(SAMPLING["top_logprobs"]),
            "--logit-bias", ",".join("%d:%g" % (k, v) for k, v in sorted(bias.items()))]


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--frontend", required=True)
    ap.add_argument("--router-link", choices=["direct", "zmq"], default="direct",
                    help="the frontend's router link (its --router-link)")
    ap.add_argument("--chat", choices=["yes", "no"], default="yes",
                    help="whether this build has chat templates (tokenizer/kvr_chat.h)")
    args = ap.parse_args()
    bins = cl.Bins(args)
    ensure_sdk()
    work = cl.workdir("kvr-fe-")
    ok = False
    try:
        model = cl.make_model(bins, work)
        with open(os.path.join(model, "config.json")) as f:
            ctx = json.load(f).get("max_position_embeddings", 0)
        # a Llama-3-like chat template for the tiny model
        tcf = os.path.join(model, "tokenizer_config.json")
        with open(tcf) as f:
            tc = json.load(f)
        tc["chat_template"] = CHAT_TEMPLATE
        with open(tcf, "w") as f:
            json.dump(tc, f)
        # greedy by default: generation_config.json's temperature is the frontend's default
        gcf = os.path.join(model, "generation_config.json")
        with open(gcf) as f:
            gc = json.load(f)
        gc["temperature"] = 0.0
        with open(gcf, "w") as f:
            json.dump(gc, f)
        c = cl.Cluster(bins, work, model, n_prefill=1, n_decode=1, local_prefill_tokens=4)
        c.start()
        port = cl.free_port()
        base = "http://127.0.0.1:%d" % port
        flog = open(os.path.join(work, "frontend.log"), "w")
        fe = cl.spawn([args.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port,
                       "--max-connections", str(MAX_CONN), "--max-body", "65536",
                       "--idle-timeout-s", "20", "--router-link", args.router_link],
                      stdout=flog, stderr=subprocess.STDOUT)

        def fe_alive():
            check(fe.poll() is None, "kvrail-frontend exited (%s):\n%s" % (
                fe.returncode, open(flog.name).read()[-3000:]))

        deadline = time.time() + 20
        while True:
            fe_alive()
            try:
                st, _, body = http(base, "/ready", timeout=5)
                if st == 200:
                    break
            except OSError:
                pass
            check(time.time() < deadline, "frontend not ready within 20 s")
            time.sleep(0.1)
        check(json.loads(body)["decode_nodes_alive"] == 1, "ready body: %r" % body)
        check("router link: %s" % args.router_link in open(flog.name).read(),
              "the frontend does not log its router link '%s'" % args.router_link)
        st, _, body = http(base, "/health")
        check(st == 200 and json.loads(body)["status"] == "ok", "/health: %s %r" % (st, body))

        # ---- the SDK against references from kvrail run ----
        prompt = [(i * 37 + 11) % 200 + 3 for i in range(24)]
        prompt2 = [(i * 53 + 7) % 200 + 3 for i in range(9)]
        max_tokens = 12
        ref = kvrail_run(bins, model, prompt, max_tokens)
        ref2 = kvrail_run(bins, model, prompt2, max_tokens)
        # sampling with every parameter: ban the greedy first token, push a rare one
        bias = {ref[0]["token_id"]: -100.0, 150: 4.5}
        samp_ref = kvrail_run(bins, model, prompt, 16, sampling_flags(bias) + ["--ignore-eos"])
        check(samp_ref[0]["token_id"] != ref[0]["token_id"], "logit_bias -100: banned token came")
        check(all(len(t["top_logprobs"]) == SAMPLING["top_logprobs"] for t in samp_ref),
              "kvrail run --logprobs 3: three alternatives per token: %r" % samp_ref[:2])
        # `kvrail generate --json` through the cluster == `kvrail run --json`, byte for byte
        for extra in (sampling_flags(bias), ["--logprobs", "2"]):
            rr = cl.run([bins.kvrail, "run", "--model", model, "--prompt-tokens",
                         ",".join(map(str, prompt)), "--max-tokens", "16", "--json",
                         "--ignore-eos", *extra], timeout=60)
            gg = cl.run([bins.kvrail, "generate", "--router", c.client_ep, "--prompt-tokens",
                         ",".join(map(str, prompt)), "--max-tokens", "16", "--json",
                         "--ignore-eos", *extra], timeout=60)
            check(rr.returncode == 0 and gg.returncode == 0,
                  "run/generate rc %d %d: %s %s" % (rr.returncode, gg.returncode, rr.stderr,
                                                    gg.stderr))
            rl, gl = rr.stdout.splitlines(), gg.stdout.splitlines()
            check(len(rl) == len(gl) == 18 and rl[:-1] == gl[:-1],
                  "generate --json != run --json (%s):\n%s\n---\n%s" % (
                      " ".join(extra), rr.stdout, gg.stdout))
            ru, gu = json.loads(rl[-1]), json.loads(gl[-1])
            check(ru["finish_reason"] == gu["finish_reason"] == "length" and
                  ru["usage"]["prompt_tokens"] == gu["usage"]["prompt_tokens"] == len(prompt) and
                  ru["usage"]["completion_tokens"] == gu["usage"]["completion_tokens"] == 16,
                  "usage lines: %s vs %s" % (rl[-1], gl[-1]))
        print("ok kvrail generate --json == kvrail run --json byte for byte (every sampling "
              "parameter, --logprobs 3; greedy --logprobs 2), usage lines agree")
        texts = [t["text"] for t in ref]
        full = "".join(texts)
        # a stop string: the text of a later token that is not empty
        k = next((i for i in range(len(texts) // 2, len(texts)) if texts[i].strip()), None)
        check(k is not None, "reference has no non-empty token text: %r" % texts)
        stop = texts[k]
        # a stop string across two tokens: the last character of one and the first of the
        # next (streaming must hold back the first part until it knows)
        j = next((i for i in range(1, len(texts) - 1) if texts[i] and texts[i + 1]), None)
        check(j is not None, "reference has no two adjacent non-empty tokens: %r" % texts)
        split_stop = texts[j][-1] + texts[j + 1][0]
        spec = {"base_url": base + "/v1", "model": os.path.basename(model), "context_len": ctx,
                "prompt": prompt, "prompt2": prompt2, "max_tokens": max_tokens,
                "ref": {"texts": texts, "logprobs": [t["logprob"] for t in ref],
                        "finish": "length" if len(ref) == max_tokens else "stop"},
                "ref2_text": "".join(t["text"] for t in ref2),
                "stop": stop, "stop_expect": full[:full.index(stop)],
                "split_stop": split_stop, "split_stop_expect": full[:full.index(split_stop)],
                "sampling": dict(SAMPLING, logit_bias={str(k): v for k, v in bias.items()}),
                "sampling_ref": {"texts": [t["text"] for t in samp_ref],
                                 "logprobs": [t["logprob"] for t in samp_ref],
                                 "top": [[x["logprob"] for x in t["top_logprobs"]]
                                         for t in samp_ref]}}
        messages = [{"role": "system", "content": "You are terse. "},
                    {"role": "user", "content": "Name a colour."}]
        rendered = tc["bos_token"] + "".join(
            "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (m["role"], m["content"].strip())
            for m in messages) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
        # kvrail run adds the bos token itself (add_bos_token), the template has it as text
        r = cl.run([bins.kvrail, "run", "--model", model, "--prompt", rendered[len(tc["bos_token"]):],
                    "--max-tokens", "10", "--json"], timeout=60)
        check(r.returncode == 0, "kvrail run (chat reference) failed: %s" % r.stderr)
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        spec["have_chat"] = args.chat == "yes"
        spec["chat"] = {"messages": messages, "max_tokens": 10,
                        "prompt_tokens": len(lines[0]["prompt_tokens"]),
                        "texts": [x["text"] for x in lines if "token_id" in x]}
        sf = os.path.join(work, "spec.json")
        with open(sf, "w") as f:
            json.dump(spec, f)
        r = cl.run(["node", os.path.join(HERE, "sdk_check.mjs"), sf], timeout=120, cwd=HERE)
        print(r.stdout, end="")
        check(r.returncode == 0, "sdk_check failed:\n%s\n%s" % (r.stderr, open(flog.name).read()[-3000:]))

        # ---- SSE framing byte for byte on the wire ----
        body = json.dumps({"model": spec["model"], "prompt": prompt, "max_tokens": 3,
                           "temperature": 0, "stream": True}).encode()
        resp = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        head, _, chunked = resp.partition(b"\r\n\r\n")
        check(status_line(resp).endswith("200 OK") and b"text/event-stream" in head,
              "SSE head: %r" % head)
        data = b""
        while chunked:  # de-chunk
            n, _, rest = chunked.partition(b"\r\n")
            n = int(n, 16)
            if n == 0:
                break
            data += rest[:n]
            chunked = rest[n + 2:]
        events = data.split(b"\n\n")
        check(events[-1] == b"" and events[-2] == b"data: [DONE]", "SSE ends with data: [DONE]: %r" % data)
        for e in events[:-2]:
            check(e.startswith(b"data: {") and json.loads(e[6:])["object"] == "text_completion",
                  "SSE event framing: %r" % e)
        print("ok SSE framing: %d events, then data: [DONE]" % (len(events) - 2))

        # ---- HTTP abuse: clear errors, the frontend keeps serving ----
        js = b"Content-Type: application/json\r\n"
        cases = [
            (b"\x00\xff\x13garbage\r\n\r\n", "400 or closed"),
            (b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", "505"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js + b"Content-Length: 9\r\n\r\n{\"model\":", "400"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js + b"Content-Length: 4\r\n\r\n[1,]", "400"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js + b"Content-Length: 10\r\n\r\n{\"a\":\"\xff\xfe\"}", "400"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
             b"Content-Length: 2\r\n\r\n{}", "415"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js +
             b"Content-Length: 99999999999\r\n\r\n{", "413"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js + b"Transfer-Encoding: chunked\r\n\r\n" +
             (b"10000\r\n" + b"[" * 65536 + b"\r\n") * 2 + b"0\r\n\r\n", "413"),
            (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + js + b"Content-Length: 3000\r\n\r\n" +
             b"[" * 3000, "400"),
            (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", "405"),
            (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", "404"),
            (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 100000 + b"\r\n\r\n", "431"),
        ]
        for i, (data, want) in enumerate(cases):
            resp = raw(port, data, timeout=3 if want == "400 or closed" else 10)
            sl = status_line(resp)
            if want == "400 or closed" and not resp:
                sl = want  # libmicrohttpd drops a connection whose request line is not HTTP
            check(want.split()[0] in sl, "abuse case %d %r...: want %s, got %r\n%s" % (
                i, data[:60], want, resp[:300], open(flog.name).read()[-2000:]))
            if want in ("400", "413", "415", "404", "405") and b"{" in resp and b"HTTP/1.1 4" in resp \
                    and b"application/json" in resp:
                err = json.loads(resp.partition(b"\r\n\r\n")[2])["error"]
                check(err["message"] and err["type"], "error shape: %r" % err)
            fe_alive()
        st, _, _ = http(base, "/health")
        check(st == 200, "/health after abuse: %s" % st)
        print("ok HTTP abuse: %d malformed requests answered, frontend serving" % len(cases))

        # ---- a client that leaves mid-stream cancels both halves ----
        def long_stream(timeout):
            """A raw socket streaming a completion as long as the context allows,
            with its first two events read."""
            body = json.dumps({"model": spec["model"], "prompt": prompt,
                               "max_tokens": ctx - len(prompt) - 1, "temperature": 0,
                               "stream": True, "ignore_eos": True}).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            got = b""
            while got.count(b"data: ") < 2:
                b = s.recv(4096)
                check(b, "the stream closed before its second event: %r" % got)
                got += b
            return s, got

        before = c.status()["router"]["canceled"]
        s, _ = long_stream(10)
        s.close()
        deadline = time.time() + 15
        while c.status()["router"]["canceled"] <= before:
            check(time.time() < deadline, "the router never saw the request canceled")
            time.sleep(0.1)
        c.wait_idle(timeout=15)
        print("ok disconnect mid-stream: router canceled, nodes idle")

        # ---- a client that half-closes right after its request: taken as gone ----
        # (the hang-up may reach the loop before the request is parsed or after its run
        # started; either way the run is canceled at the router, not left to finish)
        body = json.dumps({"model": spec["model"], "prompt": prompt,
                           "max_tokens": ctx - len(prompt) - 1, "temperature": 0,
                           "stream": True, "ignore_eos": True}).encode()
        before = c.status()["router"]["canceled"]
        s = socket.create_connection(("127.0.0.1", port), timeout=15)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            b = s.recv(65536)  # the socket's 15 s timeout fails the test on a hang
            if not b:
                break
            got += b
        s.close()
        check(b"data: [DONE]" not in got, "a half-closed client's request ran to its end: %r"
              % got[-300:])
        deadline = time.time() + 15
        while c.status()["router"]["canceled"] <= before:
            check(time.time() < deadline, "the router never saw the half-closed request canceled")
            time.sleep(0.1)
        c.wait_idle(timeout=15)
        print("ok half-close after the request: canceled at the router, nodes idle")

        # ---- 503 past the connection bound ----
        held = []
        for _ in range(MAX_CONN):
            sk = socket.create_connection(("127.0.0.1", port), timeout=10)
            sk.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            r1 = b""
            while b"\r\n\r\n" not in r1 or not r1.endswith(b"}"):
                r1 += sk.recv(4096)
            check(b"200 OK" in r1, "held connection: %r" % r1)
            held.append(sk)
        resp = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        check("503" in status_line(resp) and b"Retry-After: 1" in resp, "past the bound: %r" % resp)
        err = json.loads(resp.partition(b"\r\n\r\n")[2])["error"]
        check("--max-connections" in err["message"], "503 message: %r" % err)
        for sk in held:
            sk.close()
        deadline = time.time() + 10
        while True:
            st, _, _ = http(base, "/health")
            if st == 200:
                break
            check(time.time() < deadline, "still 503 after the held connections closed")
            time.sleep(0.1)
        print("ok connection bound: 503 + Retry-After past %d, served again after" % MAX_CONN)

        # ---- metrics ----
        st, hd, body = http(base, "/metrics")
        text = body.decode()
        check(st == 200 and hd.get("Content-Type", "").startswith("text/plain"), "/metrics %s" % st)

        def metric(prefix):
            for line in text.splitlines():
                if line.startswith(prefix):
                    return float(line.rsplit(" ", 1)[1])
            raise cl.Fail("no metric %s in:\n%s" % (prefix, text))

        m = 'model="%s"' % spec["model"]
        check(metric('kvrail_frontend_requests_total{role="frontend",%s,endpoint="/v1/completions",'
                     'status="200"}' % m) >= 10, "completions 200 counter")
        check(metric('kvrail_frontend_requests_total{role="frontend",%s,endpoint="/v1/completions",'
                     'status="400"}' % m) >= 5, "completions 400 counter")
        check(metric('kvrail:time_to_first_token_seconds_count{role="frontend",%s}' % m) >= 10,
              "TTFT histogram count")
        check(metric('kvrail:generation_tokens_total{role="frontend",%s}' % m) >= 100,
              "generation tokens")
        check(metric('kvrail_frontend_connections_rejected_total{role="frontend",%s}' % m) >= 1,
              "rejected connections")
        print("ok /metrics: request counters, TTFT histogram, tokens, rejections")
        if shutil.which("promtool"):
            r = cl.run(["promtool", "check", "metrics"], timeout=30, input=text)
            # the vLLM-compatible names (kvrail:...) are the only lint promtool may raise
            problems = [x for x in (r.stdout + r.stderr).splitlines()
                        if x.strip() and not (x.startswith("kvrail:") and
                                              x.endswith("metric names should not contain ':'"))]
            check(r.returncode in (0, 3) and not problems,
                  "promtool check metrics (%d): %s" % (r.returncode, r.stdout + r.stderr))
            print("ok promtool check metrics: parses; lint only on the kvrail: (vLLM-style) names")
        else:
            print("note: promtool not installed (tools/install-deps.sh --test installs prometheus); "
                  "/metrics not checked with it")
        # ---- the router killed mid-stream and restarted: the stream ends with an
        # error event (not a hang), and the frontend's one router client serves
        # again once the router is back, with the same answer ----
        def greedy_text():
            st, _, body = http(base, "/v1/completions", json.dumps(
                {"model": spec["model"], "prompt": prompt, "max_tokens": 8, "temperature": 0}).encode(),
                headers={"Content-Type": "application/json"}, timeout=60)
            check(st == 200, "greedy completion: %s %r" % (st, body))
            return json.loads(body)["choices"][0]["text"]
        before_text = greedy_text()
        s, got = long_stream(20)
        c.kill("router", signal.SIGKILL)
        while b"data: [DONE]" not in got:
            b = s.recv(65536)  # the socket's 20 s timeout fails the test on a hang
            check(b, "the stream closed without an end after the router was killed")
            got += b
        s.close()
        check(b'"error"' in got and b"lost" in got, "no error event after the router was killed: %r"
              % got[-400:])
        c.procs = [(n, p) for n, p in c.procs if n != "router"]
        c._start("router", [bins.router, "--config", c.config, "--node", "router"])
        deadline = time.time() + 30
        while True:
            st, _, rb = http(base, "/ready", timeout=5)
            if st == 200:
                break
            check(time.time() < deadline, "not ready 30 s after the router restart: %r" % rb)
            time.sleep(0.2)
        after_text = greedy_text()
        check(after_text == before_text, "after the router restart: %r, before %r" %
              (after_text, before_text))
        print("ok router killed mid-stream: error event + [DONE]; restarted: served again, same text")

        # ---- a frontend whose router does not answer: 503 with the reason, not a hang ----
        port2 = cl.free_port()
        fe2 = cl.spawn([args.frontend, "--router", "tcp://127.0.0.1:%d" % cl.free_port(),
                        "--model-name", "m", "--listen", "127.0.0.1:%d" % port2],
                       stdout=flog, stderr=subprocess.STDOUT)
        base2 = "http://127.0.0.1:%d" % port2
        deadline = time.time() + 20
        while True:
            check(fe2.poll() is None, "the second frontend exited")
            try:
                if http(base2, "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            check(time.time() < deadline, "second frontend not up within 20 s")
            time.sleep(0.1)
        st, hd, body = http(base2, "/ready")
        check(st == 503 and "does not answer" in json.loads(body)["reason"], "/ready without router: %s %r" % (st, body))
        st, hd, body = http(base2, "/v1/completions", json.dumps({"model": "m", "prompt": [1, 2]}).encode(),
                            headers={"Content-Type": "application/json"})
        check(st == 503 and hd.get("Retry-After") and "does not answer" in json.loads(body)["error"]["message"],
              "completion without router: %s %r" % (st, body))
        print("ok no router: /ready and completions 503 with the reason")

        # ---- --busy-poll-us: the same answers, byte for byte; out of range refused ----
        def sse_texts(p):
            body = json.dumps({"model": spec["model"], "prompt": prompt, "max_tokens": 8,
                               "temperature": 0, "stream": True}).encode()
            resp = raw(p, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                       + body)
            head, _, chunked = resp.partition(b"\r\n\r\n")
            check(status_line(resp).endswith("200 OK"), "SSE head: %r" % head)
            data = b""
            while chunked:
                n, _, rest = chunked.partition(b"\r\n")
                n = int(n, 16)
                if n == 0:
                    check(rest == b"\r\n", "the closing chunk: %r" % rest)
                    break
                data += rest[:n]
                chunked = rest[n + 2:]
            events = data.split(b"\n\n")
            check(events[-1] == b"" and events[-2] == b"data: [DONE]", "SSE end: %r" % data)
            return [json.loads(e[6:])["choices"][0]["text"] for e in events[:-2]]
        port3 = cl.free_port()
        fe3 = cl.spawn([args.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port3,
                        "--busy-poll-us", "200", "--router-link", args.router_link],
                       stdout=flog, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            check(fe3.poll() is None, "the --busy-poll-us frontend exited")
            try:
                if http("http://127.0.0.1:%d" % port3, "/ready", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            check(time.time() < deadline, "the --busy-poll-us frontend not ready within 20 s")
            time.sleep(0.1)
        want = "".join(sse_texts(port))
        for _ in range(3):
            got = "".join(sse_texts(port3))
            check(got == want, "--busy-poll-us 200 streamed %r, the default frontend %r" % (got, want))
        r = cl.run([args.frontend, "--router", "tcp://127.0.0.1:1", "--model-name", "m",
                    "--busy-poll-us", "1001"], timeout=30)
        check(r.returncode == 2 and "busy-poll-us" in r.stderr,
              "--busy-poll-us 1001: exit %s, %r" % (r.returncode, r.stderr))
        print("ok --busy-poll-us 200: the same streamed text as the default, framing intact; "
              "1001 refused")
        fe_alive()
        c.check_alive()
        ok = True
        print("test_frontend: all passed")
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
