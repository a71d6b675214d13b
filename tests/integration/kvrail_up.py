#!/usr/bin/env python3
"""kvrail_up.py - `kvrail up`, `kvrail generate` and `kvrail status` on a real
one-machine cluster (router + 1 prefill + 1 decode, UCX) started from a
cluster file.

--case basic: `up` starts the three nodes and prints "ready" once they
registered; `generate --json` gives the same tokens as `kvrail run --json` for
the same prompt (a short prompt prefilled locally on the decode node, a long
one disaggregated; token ids, texts and logprobs
exactly); `status --json` shows both nodes alive, the disaggregated prefill
and the KV bytes moved prefill -> decode with a rate; bad input to `generate`
exits 1 with the router's message; SIGTERM stops every node and exits 0.

--case restart: decode0 has `restart: always`, prefill0 `restart: never`.
kill -9 of decode0 is reported and decode0 is started again (a new pid) and
registers again while the router and prefill0 keep their pids, and a
disaggregated request then matches `kvrail run`; kill -9 of the router
(default policy, on-failure) restarts it, both nodes (same pids) register
with the new router and a disaggregated request matches; kill -9 of prefill0 is
reported, prefill0 is left down, `up` keeps running and the cluster still
serves a short (decode-local) prompt; SIGTERM then exits 0 with nothing left.

--case orphans: kill -9 of `kvrail up` itself: every node it started exits
(PR_SET_PDEATHSIG) and the router's ports can be bound again.

Every wait polls for a state with a deadline; no sleep is a synchronization.
Every process is started through cluster_lib.spawn (own process group, dies
with this test) and reaped on every exit path.

usage: kvrail_up.py --kvrail BIN --mkmodel BIN [--case basic|restart|orphans]
"""
import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import Fail, free_port, reap_all, spawn, stop_group, wait_for, workdir  # noqa: E402
from cluster_lib import run as run_group  # noqa: E402

# Logprobs compare exactly: every engine path (full or chunked prefill, a
# cached prefix, batched prefill, decode in any batch) is bit-identical
# (tests/unit/test_engine_invariant.c), so the cluster's logprobs equal
# `kvrail run`'s to the last printed digit.  A difference is a bug, not noise.


class Up:
    """One `kvrail up` process and its logs."""

    def __init__(self, kvrail, cfg, work):
        self.work = work
        self.err_path = os.path.join(work, "up.err")
        self.err_off = os.path.getsize(self.err_path) if os.path.exists(self.err_path) else 0
        err = open(self.err_path, "a")
        self.p = spawn([kvrail, "up", "--log-dir", os.path.join(work, "logs"), cfg],
                       stdout=subprocess.PIPE, stderr=err)
        err.close()
        deadline = time.monotonic() + 60
        buf = b""
        while b"ready" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail("kvrail up not ready within 60 s")
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 4096)
                if not chunk:
                    raise Fail("kvrail up exited with %s before ready" % self.p.wait(timeout=10))
                buf += chunk

    def err(self):
        with open(self.err_path) as f:
            f.seek(self.err_off)
            return f.read()

    def pids(self):
        """The latest pid `up` reported for each node."""
        return {m.group(1): int(m.group(2))
                for m in re.finditer(r"started (\S+) \(\w+, pid (\d+)\)", self.err())}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run(cmd, timeout=60):
    return run_group(cmd, timeout=timeout)


def parse_json_lines(out):
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def same_generation(ref_out, got_out):
    """'' when `generate --json` equals `run --json` (ids, texts and
    logprobs exactly), else what differs."""
    ref, got = parse_json_lines(ref_out), parse_json_lines(got_out)
    if len(ref) != len(got):
        return "%d lines vs %d" % (len(ref), len(got))
    # the last line: finish reason and usage (cached_tokens is the cluster's own)
    ru, gu = ref.pop(), got.pop()
    if (ru["finish_reason"] != gu["finish_reason"] or
            ru["usage"]["prompt_tokens"] != gu["usage"]["prompt_tokens"] or
            ru["usage"]["completion_tokens"] != gu["usage"]["completion_tokens"]):
        return "finish/usage line: %s vs %s" % (ru, gu)
    if ref[0] != got[0]:
        return "prompt line differs: %s vs %s" % (ref[0], got[0])
    for i, (a, b) in enumerate(zip(ref[1:], got[1:])):
        if set(a) != set(b) or a["token_id"] != b["token_id"] or a["text"] != b["text"]:
            return "token %d: %s vs %s" % (i, a, b)
        if a["logprob"] != b["logprob"]:
            return "token %d logprob %.6f vs %.6f (the paths must be bit-identical)" % (
                i, a["logprob"], b["logprob"])
    return ""


def check_generate(a, model, ep, prompt, max_tokens=12, run_args=(), gen_args=()):
    """`kvrail generate --json` through the cluster equals `kvrail run --json`
    (run_args added to run, e.g. --kv-dtype; gen_args to generate, e.g.
    --stats); returns the prompt's token count and generate's result."""
    ref = run([a.kvrail, "run", "--model", model, "--prompt", prompt, "--max-tokens",
               str(max_tokens), "--json", *run_args])
    got = run([a.kvrail, "generate", "--router", ep, "--max-tokens", str(max_tokens), "--json",
               *gen_args, prompt])
    if ref.returncode or got.returncode:
        raise Fail("run rc %d (%s), generate rc %d (%s)" % (ref.returncode, ref.stderr,
                                                           got.returncode, got.stderr))
    diff = same_generation(ref.stdout, got.stdout)
    if diff:
        raise Fail("generate %s differs from run %s (%s):\n%s\n---\n%s"
                   % (" ".join(gen_args), " ".join(run_args), diff, ref.stdout, got.stdout))
    return len(json.loads(got.stdout.splitlines()[0])["prompt_tokens"]), got


def node_alive(a, ep, name):
    st = run([a.kvrail, "status", "--router", ep, "--json"], timeout=30)
    if st.returncode:
        return False
    return any(n["name"] == name and n["alive"] for n in json.loads(st.stdout)["nodes"])


def port_free(port):
    """True when nothing listens on 127.0.0.1:port (TIME_WAIT does not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


SHORT = "Hello world"
LONG = "The quick brown fox jumps over the lazy dog. " * 14


def case_basic(a, model, cfg, ep, work):
    up = Up(a.kvrail, cfg, work)
    pids = up.pids()
    if set(pids) != {"router", "prefill0", "decode0"}:
        raise Fail("up started %s" % pids)
    print("up: ready, pids", pids)
    for prompt in (SHORT, LONG):
        n, _ = check_generate(a, model, ep, prompt)
        print("generate == run for a %d-token prompt" % n)
    txt = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "6", "Hello"])
    if txt.returncode or not txt.stdout.strip():
        raise Fail("text generate: rc %d, '%s'" % (txt.returncode, txt.stdout))

    bad = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "0", "hi"])
    if bad.returncode != 1 or "max_tokens is 0" not in bad.stderr:
        raise Fail("max-tokens 0: rc %d, stderr %s" % (bad.returncode, bad.stderr))
    bad = run([a.kvrail, "generate", "--router", ep, "--temperature", "-3", "hi"])
    if bad.returncode != 1 or "temperature" not in bad.stderr:
        raise Fail("temperature -3: rc %d, stderr %s" % (bad.returncode, bad.stderr))
    print("bad input: clear errors (%s)" % bad.stderr.strip())

    def status_with_bytes():  # the KV bytes and transfer time arrive with heartbeats
        st = run([a.kvrail, "status", "--router", ep, "--json"])
        if st.returncode:
            raise Fail("status: " + st.stderr)
        s = json.loads(st.stdout)
        r = s["router"]
        return s if r["kv_bytes_moved"] > 0 and r["kv_transfer_ns"] > 0 else None

    s = wait_for("KV bytes and transfer time in status", status_with_bytes, timeout=10, step=0.1)
    nodes = {n["name"]: n for n in s["nodes"]}
    if not (nodes["prefill0"]["alive"] and nodes["decode0"]["alive"]):
        raise Fail("nodes not alive: %s" % nodes)
    rs = s["router"]
    if rs["disagg_prefills"] < 1 or rs["local_prefills"] < 1:
        raise Fail("prefill counts: %s" % rs)
    if rs["kv_bytes_moved"] <= 0 or rs["kv_gbps"] <= 0:
        raise Fail("no KV bytes / rate in status: %s" % rs)
    if rs["overhead_samples"] < 3 or rs["overhead_p99_ns"] <= 0:
        raise Fail("no overhead samples: %s" % rs)
    if rs["bad_requests"] < 2:
        raise Fail("bad requests not counted: %s" % rs)
    print("status: %d disaggregated + %d local prefills, %d KV bytes at %.3f GB/s, "
          "router overhead p99 %.1f us" % (rs["disagg_prefills"], rs["local_prefills"],
                                           rs["kv_bytes_moved"], rs["kv_gbps"],
                                           rs["overhead_p99_ns"] / 1e3))
    txt = run([a.kvrail, "status", "--router", ep])
    if "decode0" not in txt.stdout or "GB/s" not in txt.stdout:
        raise Fail("status text: " + txt.stdout)
    # with the cluster file, status names the nodes that never registered
    # and where they are expected (none here; then one placed on another host)
    st = run([a.kvrail, "status", "--config", cfg, "--json"])
    if st.returncode or json.loads(st.stdout).get("unregistered") != []:
        raise Fail("status --config: want no unregistered node: %s %s" % (st.stdout, st.stderr))
    cfg9 = os.path.join(work, "cluster-plus-remote.yaml")
    with open(cfg) as fi, open(cfg9, "w") as fo:
        fo.write(fi.read() + "  - {name: decode9, role: decode, host: gpu-node-9}\n")
    st = run([a.kvrail, "status", "--config", cfg9, "--json"])
    want = [{"name": "decode9", "role": "decode", "host": "gpu-node-9"}]
    if st.returncode or json.loads(st.stdout).get("unregistered") != want:
        raise Fail("status --config: want %s unregistered: %s %s" % (want, st.stdout, st.stderr))
    txt = run([a.kvrail, "status", "--config", cfg9])
    if "never registered" not in txt.stdout or "expected on gpu-node-9" not in txt.stdout:
        raise Fail("status text names no unregistered node: " + txt.stdout)
    print("status --config: decode9 never registered, expected on gpu-node-9")
    sigterm_stops(up, pids)


def sigterm_stops(up, pids):
    up.p.send_signal(signal.SIGTERM)
    try:
        rc = up.p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise Fail("kvrail up did not stop within 15 s of SIGTERM")
    if rc != 0 or any(alive(p) for p in pids.values()):
        raise Fail("after SIGTERM: rc %d, alive %s" % (rc, [n for n, p in pids.items() if alive(p)]))
    print("SIGTERM: all nodes stopped, exit 0")


def case_restart(a, model, cfg, ep, work):
    up = Up(a.kvrail, cfg, work)
    p0 = up.pids()
    print("up: ready, pids", p0)
    os.kill(p0["decode0"], signal.SIGKILL)
    p1 = wait_for("decode0 restarted with a new pid",
                  lambda: (lambda p: p if p["decode0"] != p0["decode0"] else None)(up.pids()))
    err = up.err()
    if "decode0" not in err or "signal 9" not in err or "restarting decode0" not in err:
        raise Fail("the dead decode0 was not reported:\n" + err)
    wait_for("decode0 registered again", lambda: node_alive(a, ep, "decode0"), timeout=30)
    if up.p.poll() is not None:
        raise Fail("kvrail up exited (%s) after a node died" % up.p.returncode)
    for n in ("router", "prefill0"):
        if p1[n] != p0[n] or not alive(p0[n]):
            raise Fail("%s was restarted or stopped (pid %d -> %d)" % (n, p0[n], p1[n]))
    n, _ = check_generate(a, model, ep, LONG)
    print("kill -9 decode0: reported, restarted (pid %d -> %d), router and prefill0 kept; "
          "a %d-token disaggregated request matches run" % (p0["decode0"], p1["decode0"], n))

    # the router (default policy on-failure): restarted; the nodes register again
    os.kill(p1["router"], signal.SIGKILL)
    pr = wait_for("the router restarted with a new pid",
                  lambda: (lambda p: p if p["router"] != p1["router"] else None)(up.pids()))
    wait_for("prefill0 and decode0 registered with the new router",
             lambda: node_alive(a, ep, "prefill0") and node_alive(a, ep, "decode0"), timeout=30)
    if pr["prefill0"] != p1["prefill0"] or pr["decode0"] != p1["decode0"]:
        raise Fail("nodes were restarted with the router: %s -> %s" % (p1, pr))
    check_generate(a, model, ep, LONG)
    print("kill -9 router (restart: on-failure by default): restarted (pid %d -> %d), the nodes "
          "registered again and serve" % (p1["router"], pr["router"]))
    p1 = pr

    os.kill(p1["prefill0"], signal.SIGKILL)
    wait_for("prefill0 reported as left down", lambda: "leaving prefill0 down" in up.err())
    if up.p.poll() is not None:
        raise Fail("kvrail up exited (%s) after prefill0 died" % up.p.returncode)
    if up.pids()["prefill0"] != p1["prefill0"]:
        raise Fail("prefill0 (restart: never) was restarted:\n" + up.err())
    check_generate(a, model, ep, SHORT)
    p2 = up.pids()
    if not (alive(p2["router"]) and alive(p2["decode0"])):
        raise Fail("router/decode0 not running after prefill0 died")
    print("kill -9 prefill0 (restart: never): left down, up and the rest keep serving")
    sigterm_stops(up, {k: v for k, v in p2.items() if k != "prefill0"})


def case_orphans(a, model, cfg, ep, work, ports):
    up = Up(a.kvrail, cfg, work)
    pids = up.pids()
    if set(pids) != {"router", "prefill0", "decode0"}:
        raise Fail("up started %s" % pids)
    os.kill(up.p.pid, signal.SIGKILL)  # only `up`, not its process group
    up.p.wait(timeout=10)
    wait_for("every node of a SIGKILLed `up` to exit",
             lambda: not any(alive(p) for p in pids.values()), timeout=15)
    wait_for("the router's ports to be free", lambda: all(port_free(p) for p in ports),
             timeout=15)
    print("kill -9 of kvrail up: router, prefill0, decode0 gone, ports %s free" % (ports,))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--case", default="basic", choices=["basic", "restart", "orphans"])
    a = ap.parse_args()
    work = workdir("kvr-up-")
    ok = False
    try:
        model = os.path.join(work, "model")
        r = run([a.mkmodel, "--out", model])
        if r.returncode:
            raise Fail("mkmodel: " + r.stderr)
        pc, pn = free_port(), free_port()
        ep = "tcp://127.0.0.1:%d" % pc
        policy = {"basic": ("", ""), "orphans": ("", ""),
                  "restart": (", restart: never", ", restart: always")}[a.case]
        cfg = os.path.join(work, "cluster.yaml")
        with open(cfg, "w") as f:
            f.write("model: model\nblock_size: 16\n"
                    "router: {client: '%s', node: 'tcp://127.0.0.1:%d'}\n"
                    "timeouts: {heartbeat_ms: 200, heartbeat_timeout_ms: 1500}\n"
                    "thresholds: {local_prefill_tokens: 32}\n"
                    "nodes:\n"
                    "  - {name: router, role: router, host: localhost}\n"
                    "  - {name: prefill0, role: prefill, host: 127.0.0.1, transport: ucx%s}\n"
                    "  - {name: decode0, role: decode, pool_blocks: 512, transport: ucx%s}\n"
                    % (ep, pn, policy[0], policy[1]))
        if a.case == "basic":
            case_basic(a, model, cfg, ep, work)
        elif a.case == "restart":
            case_restart(a, model, cfg, ep, work)
        else:
            case_orphans(a, model, cfg, ep, work, (pc, pn))
        ok = True
        print("kvrail_up %s: ok" % a.case)
    except Fail as e:
        print("FAIL:", e)
        for name in ["up.err"] + sorted(os.listdir(os.path.join(work, "logs"))
                                        if os.path.isdir(os.path.join(work, "logs")) else []):
            path = os.path.join(work, name if name == "up.err" else os.path.join("logs", name))
            print("---", name)
            with open(path, errors="replace") as fh:
                print("".join(fh.readlines()[-15:]))
    finally:
        reap_all()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
