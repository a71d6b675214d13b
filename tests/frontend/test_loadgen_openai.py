"""test_loadgen_openai.py - kvrail-loadgen --openai sends the sampling
parameters it is given, not greedy only.

kvrail-loadgen is pointed at a small HTTP server in this process that
records every request body and answers as an OpenAI server does (GET
/v1/models; POST /v1/completions streamed: one token, a usage event, [DONE]).
What is checked is what loadgen put on the wire:
  1. with every sampling option given, each body carries exactly those
     values (temperature, top_p, top_k, min_p, repetition_penalty,
     presence_penalty, frequency_penalty) and its own seed (request i: i),
     and loadgen reports every request ok;
  2. without them, the defaults: greedy (temperature 0), top_p 1, top_k 0,
     min_p 0, repetition_penalty 1, no penalties;
  3. an out-of-range value is refused at start (exit 2, the option named),
     before any request.
loadgen's own run is reaped on every exit path (cluster_lib's process groups).
"""
import argparse
import http.server
import json
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cluster_lib as cl  # noqa: E402
from cluster_lib import check  # noqa: E402

BODIES = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_json(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        self.send_json({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        BODIES.append(body)
        events = [
            {"id": "c", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": "x", "finish_reason": None,
                          "logprobs": {"tokens": ["x"], "token_logprobs": [-0.5],
                                       "top_logprobs": None, "text_offset": [0]}}]},
            {"id": "c", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": "", "finish_reason": "length",
                          "logprobs": {"tokens": [], "token_logprobs": [],
                                       "top_logprobs": None, "text_offset": []}}]},
            {"id": "c", "object": "text_completion", "model": "m", "choices": [],
             "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1,
                       "total_tokens": len(body["prompt"]) + 1}},
        ]
        out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        out += b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def loadgen(args, base, extra, work, tag):
    sj = os.path.join(work, tag + ".json")
    r = cl.run([args.loadgen, "--openai", base, "--mode", "closed", "--concurrency", "1",
                "--requests", "4", "--prompt-len", "5", "--output-len", "1", "--summary-json",
                sj, "--quiet"] + extra, timeout=60)
    return r, sj


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loadgen", required=True)
    args = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = "http://127.0.0.1:%d" % srv.server_address[1]
    work = cl.workdir("kvr-lg-openai-")
    ok = False
    try:
        given = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                 "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.25}
        extra = []
        for k, v in given.items():
            extra += ["--" + k.replace("_", "-"), str(v)]
        r, sj = loadgen(args, base, extra, work, "sampled")
        check(r.returncode == 0, "loadgen --openai with sampling: %s %s" % (r.stdout, r.stderr))
        with open(sj) as f:
            s = json.load(f)
        check(s["ok"] == 4 and s["failed"] == 0, "loadgen summary: %r" % s)
        check(len(BODIES) == 4, "4 requests sent, the server saw %d" % len(BODIES))
        for b in BODIES:
            for k, v in given.items():
                check(k in b and abs(b[k] - v) < 1e-6, "%s: sent %r, given %r" % (k, b.get(k), v))
            check(b["stream"] is True and b["model"] == "m", "body: %r" % b)
        seeds = sorted(b["seed"] for b in BODIES)
        check(len(set(seeds)) == 4, "each request its own seed: %r" % seeds)
        print("ok --openai sends the sampling given: %s; seeds %s" % (
            ", ".join("%s %s" % kv for kv in given.items()), seeds))

        BODIES.clear()
        r, sj = loadgen(args, base, [], work, "greedy")
        check(r.returncode == 0, "loadgen --openai greedy: %s %s" % (r.stdout, r.stderr))
        want = {"temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0, "repetition_penalty": 1,
                "presence_penalty": 0, "frequency_penalty": 0}
        for b in BODIES:
            for k, v in want.items():
                check(b.get(k) == v, "default %s: sent %r, want %r" % (k, b.get(k), v))
        print("ok --openai without sampling options: greedy defaults")

        BODIES.clear()
        for bad in (["--top-p", "1.5"], ["--temperature", "x"], ["--top-k", "2.5"]):
            r, _ = loadgen(args, base, bad, work, "bad")
            check(r.returncode == 2 and bad[0] in r.stderr,
                  "%s refused at start: rc %d, %r" % (" ".join(bad), r.returncode, r.stderr))
        check(not BODIES, "a refused option sent %d requests" % len(BODIES))
        print("ok bad sampling values refused at start, nothing sent")
        ok = True
        print("test_loadgen_openai: all passed")
    except cl.Fail as e:
        print("FAIL: %s" % e, file=sys.stderr)
    finally:
        cl.reap_all()
        srv.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    cl.run_main(main)
