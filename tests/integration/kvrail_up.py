#!/usr/bin/env python3
"""kvrail_up.py - `kvrail up`, `kvrail generate` and `kvrail status` on a real
one-machine cluster (router + 1 prefill + 1 decode, UCX) started from a
cluster file.

Checks: `up` starts the three nodes and prints "ready" once they registered;
`generate --json` prints exactly what `kvrail run --json` prints for the same
prompt (a short prompt prefilled locally on the decode node, a long one
disaggregated); `status --json` shows both nodes alive, the disaggregated
prefill and the KV bytes moved prefill -> decode with a rate; bad input to
`generate` exits 1 with the router's message; SIGTERM stops every node and
exits 0; a node killed with SIGKILL is reported, the others are stopped and
`up` exits 1.

usage: kvrail_up.py --kvrail BIN --mkmodel BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg, work=None):
    print("FAIL:", msg)
    if work:
        logs = os.path.join(work, "logs")
        for f in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            print("---", f)
            with open(os.path.join(logs, f)) as fh:
                print("".join(fh.readlines()[-15:]))
    sys.exit(1)


def start_up(kvrail, cfg, work):
    err = open(os.path.join(work, "up.err"), "w")
    p = subprocess.Popen([kvrail, "up", "--log-dir", os.path.join(work, "logs"), cfg],
                         stdout=subprocess.PIPE, stderr=err)
    deadline = time.time() + 60
    os.set_blocking(p.stdout.fileno(), False)
    buf = b""
    while time.time() < deadline:
        if p.poll() is not None:
            fail("kvrail up exited with %d before ready" % p.returncode, work)
        try:
            chunk = os.read(p.stdout.fileno(), 4096)
        except BlockingIOError:
            chunk = b""
        buf += chunk
        if b"ready" in buf:
            return p
        time.sleep(0.1)
    p.kill()
    fail("kvrail up not ready within 60 s", work)


def pids_of(work):
    with open(os.path.join(work, "up.err")) as f:
        return {m.group(1): int(m.group(2))
                for m in re.finditer(r"started (\S+) \(\w+, pid (\d+)\)", f.read())}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def run(cmd, timeout=60):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvr-up-")
    model = os.path.join(work, "model")
    r = run([a.mkmodel, "--out", model])
    if r.returncode:
        fail("mkmodel: " + r.stderr)
    pc, pn = free_port(), free_port()
    ep = "tcp://127.0.0.1:%d" % pc
    cfg = os.path.join(work, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write("model: model\nblock_size: 16\n"
                "router: {client: '%s', node: 'tcp://127.0.0.1:%d'}\n"
                "timeouts: {heartbeat_ms: 200, heartbeat_timeout_ms: 1500}\n"
                "thresholds: {local_prefill_tokens: 32}\n"
                "nodes:\n"
                "  - {name: router, role: router, host: localhost}\n"
                "  - {name: prefill0, role: prefill, host: 127.0.0.1, transport: ucx}\n"
                "  - {name: decode0, role: decode, pool_blocks: 512, transport: ucx}\n"
                % (ep, pn))

    up = start_up(a.kvrail, cfg, work)
    pids = pids_of(work)
    if set(pids) != {"router", "prefill0", "decode0"}:
        fail("up started %s" % pids, work)
    print("up: ready, pids", pids)

    prompts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 14]
    for i, prompt in enumerate(prompts):
        ref = run([a.kvrail, "run", "--model", model, "--prompt", prompt, "--max-tokens", "12",
                   "--json"])
        got = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "12", "--json", prompt])
        if ref.returncode or got.returncode:
            fail("run rc %d (%s), generate rc %d (%s)" % (ref.returncode, ref.stderr,
                                                          got.returncode, got.stderr), work)
        if ref.stdout != got.stdout:
            fail("prompt %d: generate differs from run:\n%s\n---\n%s" % (i, ref.stdout, got.stdout),
                 work)
        n = len(json.loads(got.stdout.splitlines()[0])["prompt_tokens"])
        print("generate == run for a %d-token prompt (%d lines)" % (n, len(got.stdout.splitlines())))
    txt = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "6", "Hello"])
    if txt.returncode or not txt.stdout.strip():
        fail("text generate: rc %d, '%s'" % (txt.returncode, txt.stdout), work)

    bad = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "0", "hi"])
    if bad.returncode != 1 or "max_tokens is 0" not in bad.stderr:
        fail("max-tokens 0: rc %d, stderr %s" % (bad.returncode, bad.stderr), work)
    bad = run([a.kvrail, "generate", "--router", ep, "--temperature", "-3", "hi"])
    if bad.returncode != 1 or "temperature" not in bad.stderr:
        fail("temperature -3: rc %d, stderr %s" % (bad.returncode, bad.stderr), work)
    print("bad input: clear errors (%s)" % bad.stderr.strip())

    time.sleep(0.5)  # one more heartbeat with the byte counters
    st = run([a.kvrail, "status", "--router", ep, "--json"])
    if st.returncode:
        fail("status: " + st.stderr, work)
    s = json.loads(st.stdout)
    nodes = {n["name"]: n for n in s["nodes"]}
    if not (nodes["prefill0"]["alive"] and nodes["decode0"]["alive"]):
        fail("nodes not alive: %s" % nodes, work)
    rs = s["router"]
    if rs["disagg_prefills"] < 1 or rs["local_prefills"] < 1:
        fail("prefill counts: %s" % rs, work)
    if rs["kv_bytes_moved"] <= 0 or rs["kv_gbps"] <= 0:
        fail("no KV bytes / rate in status: %s" % rs, work)
    if rs["overhead_samples"] < 3 or rs["overhead_p99_ns"] <= 0:
        fail("no overhead samples: %s" % rs, work)
    if rs["bad_requests"] < 2:
        fail("bad requests not counted: %s" % rs, work)
    print("status: %d disaggregated + %d local prefills, %d KV bytes at %.3f GB/s, "
          "router overhead p99 %.1f us" % (rs["disagg_prefills"], rs["local_prefills"],
                                           rs["kv_bytes_moved"], rs["kv_gbps"],
                                           rs["overhead_p99_ns"] / 1e3))
    txt = run([a.kvrail, "status", "--router", ep])
    if "decode0" not in txt.stdout or "GB/s" not in txt.stdout:
        fail("status text: " + txt.stdout, work)

    # SIGTERM: everything stops, exit 0
    up.send_signal(signal.SIGTERM)
    try:
        rc = up.wait(timeout=15)
    except subprocess.TimeoutExpired:
        fail("kvrail up did not stop within 15 s of SIGTERM", work)
    if rc != 0 or any(alive(p) for p in pids.values()):
        fail("after SIGTERM: rc %d, alive %s" % (rc, [n for n, p in pids.items() if alive(p)]),
             work)
    print("SIGTERM: all nodes stopped, exit 0")

    # a node dies: reported, the rest stopped, exit 1
    up = start_up(a.kvrail, cfg, work)
    pids = pids_of(work)
    os.kill(pids["decode0"], signal.SIGKILL)
    try:
        rc = up.wait(timeout=15)
    except subprocess.TimeoutExpired:
        up.kill()
        fail("kvrail up did not notice a dead node within 15 s", work)
    with open(os.path.join(work, "up.err")) as f:
        err = f.read()
    if rc != 1 or "decode0" not in err or "signal 9" not in err:
        fail("dead node: rc %d, stderr:\n%s" % (rc, err), work)
    if any(alive(p) for p in pids.values()):
        fail("nodes left running: %s" % [n for n, p in pids.items() if alive(p)], work)
    print("SIGKILL of decode0: reported, others stopped, exit 1")
    shutil.rmtree(work, ignore_errors=True)
    print("kvrail_up: ok")


if __name__ == "__main__":
    main()
