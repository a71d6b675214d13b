#!/usr/bin/env python3
"""render_test.py - `kvrail cluster render` and the cluster it renders.

Asserts: with --prefill 2 --decode 3 over three hosts the output has the
template's router node plus prefill0..1 and decode0..2, each a copy of the
template's node of that role (pool_blocks, threads, transport kept), placed
router -> host 0 and workers on hosts in turn; router.client / router.node
name the router's host with the template's ports and get 0.0.0.0 binds;
timeouts / limits / thresholds are kept as written; a relative model path
becomes absolute.  Without counts the template's own nodes are kept and a
`$K` host is the K-th host.  Bad input fails with a message naming it: a
`$K` past the list, an empty host list, a template that does not load,
--decode 0.  Then for real: a template rendered onto this machine's hostname
is started with `kvrail up`, and `kvrail generate` through it gives the same
tokens as `kvrail run`.

usage: render_test.py --kvrail BIN --mkmodel BIN
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Fail, check, free_port, reap_all, run, spawn, stop_group, workdir  # noqa: E402

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing (tools/install-deps.sh installs it)")
    sys.exit(77)

TEMPLATE = """\
cluster: t
model: model
block_size: 16
router:
  client: tcp://127.0.0.1:%(pc)d
  node: tcp://127.0.0.1:%(pn)d
timeouts: {heartbeat_ms: 200, heartbeat_timeout_ms: 1500, lease_ms: 7000}
thresholds: {local_prefill_tokens: 32}
limits: {max_queue: 77, prefill_retries: 3}
nodes:
  - {name: router, role: router}
  - {name: p, role: prefill, threads: 1, transport: {backend: ucx}, restart: always}
  - {name: d, role: decode, pool_blocks: 512, max_batch: 8, transport: ucx}
"""


def render(kvrail, *args):
    return run([kvrail, "cluster", "render", *args], timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    a = ap.parse_args()
    work = workdir("kvr-render-")
    ok = False
    try:
        pc, pn = free_port(), free_port()
        tmpl = os.path.join(work, "template.yaml")
        with open(tmpl, "w") as f:
            f.write(TEMPLATE % {"pc": pc, "pn": pn})

        out = os.path.join(work, "out", "c.yaml")
        os.mkdir(os.path.dirname(out))
        r = render(a.kvrail, "--template", tmpl, "--hosts", "h0,h1,h2", "--prefill", "2",
                   "--decode", "3", "-o", out)
        check(r.returncode == 0, "render failed: %s" % r.stderr)
        with open(out) as f:
            c = yaml.safe_load(f)
        names = [(n["name"], n["role"], n["host"]) for n in c["nodes"]]
        check(names == [("router", "router", "h0"), ("prefill0", "prefill", "h0"),
                        ("prefill1", "prefill", "h1"), ("decode0", "decode", "h2"),
                        ("decode1", "decode", "h0"), ("decode2", "decode", "h1")],
              "placement: %s" % names)
        for n in c["nodes"]:
            if n["role"] == "decode":
                check(n["pool_blocks"] == 512 and n["max_batch"] == 8 and n["transport"] == "ucx",
                      "decode node not a copy of the template's: %s" % n)
            if n["role"] == "prefill":
                check(n["transport"] == {"backend": "ucx"} and n["restart"] == "always",
                      "prefill node not a copy of the template's: %s" % n)
        check(c["router"] == {"client": "tcp://h0:%d" % pc, "client_bind": "tcp://0.0.0.0:%d" % pc,
                              "node": "tcp://h0:%d" % pn, "node_bind": "tcp://0.0.0.0:%d" % pn},
              "router endpoints: %s" % c["router"])
        check(c["timeouts"] == {"heartbeat_ms": 200, "heartbeat_timeout_ms": 1500, "lease_ms": 7000}
              and c["limits"] == {"max_queue": 77, "prefill_retries": 3}
              and c["thresholds"] == {"local_prefill_tokens": 32} and c["cluster"] == "t",
              "template keys not kept: %s" % c)
        check(c["model"] == os.path.join(os.path.realpath(work), "model")
              or c["model"] == os.path.join(work, "model"), "model: %s" % c["model"])
        print("counts: 1 router + 2 prefill + 3 decode placed over 3 hosts, endpoints rehosted")

        # no counts: the template's nodes, $K hosts
        t2 = os.path.join(work, "t2.yaml")
        with open(t2, "w") as f:
            f.write(TEMPLATE.replace("{name: d, role: decode,", "{name: d, role: decode, host: $1,")
                    % {"pc": pc, "pn": pn})
        r = render(a.kvrail, "--template", t2, "--hosts", "a\nb\n", "--model", "/m")
        check(r.returncode == 0, "render t2: %s" % r.stderr)
        c = yaml.safe_load(r.stdout)
        check([(n["name"], n["host"]) for n in c["nodes"]] == [("router", "a"), ("p", "a"),
                                                               ("d", "b")],
              "t2 placement: %s" % c["nodes"])
        check(c["model"] == "/m", "--model not used: %s" % c["model"])
        print("template nodes kept, $1 -> second host, --model")

        # bad input
        r = render(a.kvrail, "--template", t2, "--hosts", "a")
        check(r.returncode == 1 and "$1" in r.stderr, "$1 with one host: %d %s" % (r.returncode,
                                                                                   r.stderr))
        r = render(a.kvrail, "--template", tmpl, "--hosts", ",")
        check(r.returncode == 1 and "empty" in r.stderr, "empty hosts: %s" % r.stderr)
        r = render(a.kvrail, "--template", tmpl, "--hosts", "a", "--decode", "0")
        check(r.returncode == 2 and "decode" in r.stderr, "--decode 0: %s" % r.stderr)
        bad = os.path.join(work, "bad.yaml")
        with open(bad, "w") as f:
            f.write(TEMPLATE.replace("max_batch: 8", "max_batch: 8, colour: red") % {"pc": pc,
                                                                                    "pn": pn})
        r = render(a.kvrail, "--template", bad, "--hosts", "a")
        check(r.returncode == 1 and "colour" in r.stderr and "bad.yaml:" in r.stderr,
              "bad template: %s" % r.stderr)
        r = render(a.kvrail, "--template", tmpl, "--hosts", "a;rm", "-o", out)
        check(r.returncode == 1 and "a;rm" in r.stderr, "bad host: %s" % r.stderr)
        print("bad input: clear errors")

        # for real: render onto this host's name, run it with kvrail up
        m = run([a.mkmodel, "--out", os.path.join(work, "model")], timeout=60)
        check(m.returncode == 0, "mkmodel: %s" % m.stderr)
        host = socket.gethostname()
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            host = "localhost"
        live = os.path.join(work, "live.yaml")
        r = render(a.kvrail, "--template", tmpl, "--hosts", host, "--prefill", "1", "--decode",
                   "1", "-o", live)
        check(r.returncode == 0, "render live: %s" % r.stderr)
        up = spawn([a.kvrail, "up", "--log-dir", os.path.join(work, "logs"), live],
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = up.stdout.readline()  # "ready", or EOF when up fails
        check(line.strip() == "ready", "kvrail up on the rendered file: %r %s" % (
            line, up.stderr.read() if up.poll() is not None else ""))
        ep = "tcp://%s:%d" % (host, pc)
        prompt = "The quick brown fox jumps over the lazy dog. " * 8
        ref = run([a.kvrail, "run", "--model", os.path.join(work, "model"), "--prompt", prompt,
                   "--max-tokens", "8", "--json"], timeout=60)
        got = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "8", "--json", prompt],
                  timeout=60)
        check(ref.returncode == 0 and got.returncode == 0, "run/generate: %s %s" % (ref.stderr,
                                                                                   got.stderr))
        ids = lambda s: [o["token_id"] for o in map(json.loads, s.splitlines()) if "token_id" in o]  # noqa: E731,E501
        check(ids(ref.stdout) == ids(got.stdout) and ids(got.stdout),
              "generate %s != run %s" % (ids(got.stdout), ids(ref.stdout)))
        stop_group(up)
        check(up.returncode == 0, "kvrail up exit %s after SIGTERM" % up.returncode)
        print("rendered onto %s: kvrail up serves it, generate == run (%d tokens)" % (
            host, len(ids(got.stdout))))
        ok = True
    except Fail as e:
        print("FAIL:", e)
        logs = os.path.join(work, "logs")
        for n in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, n), errors="replace") as f:
                print("---", n, "\n" + "".join(f.readlines()[-10:]))
    finally:
        reap_all()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
