#!/usr/bin/env python3
"""kv_dtype_test.py - the cluster file's kv_dtype on a real 1P+1D cluster
(`kvrail up`, UCX), against `kvrail run --kv-dtype` in one process.

For kv_dtype f32 and then bf16, a fresh cluster:
  - `kvrail generate --json` prints byte for byte what `kvrail run --json
    --kv-dtype D` prints, for a short prompt (prefilled on the decode node)
    and a long one (prefilled on the prefill node, its KV moved to decode);
  - bf16's output is not f32's (the rounded KV is what attention reads);
  - the router counted one local and one disaggregated prefill; the long
    request's own usage (`generate --stats`) names the KV bytes it moved,
    the same count as the router's status (the prefill node's heartbeat):
    bf16 moves exactly half of f32;
  - the status names each node's KV dtype and kernels class.  The usage must have them however the
    decode node's tokens and the prefill node's PrefillDone interleave (the
    decode node carries KV_READY's count on its first Token).
Then, with the bf16 cluster up, a decode node started from a cluster file
that says kv_dtype f16 is refused at registration with a message naming
both dtypes, and is not alive in the router's status.

The cluster file's numerics (on a CPU with avx512_bf16, else that part is
skipped): a cluster with `numerics: bf16dot` on a bf16 model prints what
`kvrail run --numerics bf16dot` prints, byte for byte, short and long
prompt, and not what f32 numerics print; a decode node of that cluster whose
kernels lack AVX512-BF16 (KVR_CPU_MATMUL=v3) exits at start-up naming
avx512_bf16 (never a silent fall-back).

usage: kv_dtype_test.py --kvrail BIN --mkmodel BIN --decode BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import Fail, free_port, reap_all, spawn, stop_group, wait_for, workdir  # noqa: E402
from cluster_lib import run  # noqa: E402
from kvrail_up import LONG, SHORT, Up, check_generate  # noqa: E402


# decode1: the node of another kv_dtype, placed on another host so that
# `kvrail up` does not start it (the router knows its name from the file)
DECODE1 = "  - {name: decode1, role: decode, pool_blocks: 64, transport: ucx%s}\n"


def cluster_file(work, dtype, ep, node_port, decode1_host=", host: gpu-node-9", model="model",
                 numerics="f32"):
    cfg = os.path.join(work, "cluster-%s-%s%s.yaml" % (dtype, numerics,
                                                     "" if decode1_host else "-decode1"))
    with open(cfg, "w") as f:
        f.write("model: " + model + "\nnumerics: " + numerics + "\n")
        f.write("block_size: 16\nkv_dtype: %s\n"
                "router: {client: '%s', node: 'tcp://127.0.0.1:%d'}\n"
                "timeouts: {heartbeat_ms: 200, heartbeat_timeout_ms: 1500}\n"
                "thresholds: {local_prefill_tokens: 32}\n"
                "nodes:\n"
                "  - {name: router, role: router, host: localhost}\n"
                "  - {name: prefill0, role: prefill, transport: ucx}\n"
                "  - {name: decode0, role: decode, pool_blocks: 256, transport: ucx}\n%s"
                % (dtype, ep, node_port, DECODE1 % decode1_host))
    return cfg


def generate_matches_run(a, model, ep, dtype, prompt):
    """generate --json == run --json --kv-dtype; returns (the output, prompt
    tokens, the KV bytes the request's usage names)."""
    n, got = check_generate(a, model, ep, prompt, run_args=("--kv-dtype", dtype),
                            gen_args=("--stats",))
    m = re.search(r"KV moved (\d+) bytes", got.stderr)
    if not m:
        raise Fail("generate --stats printed no 'KV moved N bytes': " + got.stderr)
    return got.stdout, n, int(m.group(1))


def one_cluster(a, model, work, dtype, outs):
    ep, node_port = "tcp://127.0.0.1:%d" % free_port(), free_port()
    cfg = cluster_file(work, dtype, ep, node_port)
    up = Up(a.kvrail, cfg, work)
    short, n_short, b_short = generate_matches_run(a, model, ep, dtype, SHORT)
    long_, n_long, b_long = generate_matches_run(a, model, ep, dtype, LONG)
    if b_short != 0 or b_long <= 0:
        raise Fail("kv_dtype %s: usage KV bytes short %d (want 0: prefilled on the decode "
                   "node), long %d (want > 0)" % (dtype, b_short, b_long))

    # The router's count: the prefill node's, which arrives with its
    # heartbeat (the short prompt is prefilled on the decode node and moves
    # none), so it must come to the request's own
    def status_router():
        st = run([a.kvrail, "status", "--router", ep, "--json"], timeout=30)
        if st.returncode:
            raise Fail("status: " + st.stderr)
        s = json.loads(st.stdout)
        return s if s["router"]["kv_bytes_moved"] > 0 else None

    s = wait_for("status kv_bytes_moved > 0", status_router, timeout=10, step=0.1)
    rs = s["router"]
    # each live node's row names the KV dtype and kernels class it registered with
    reg = [(n["name"], n["kv_dtype"], n["kernels"]) for n in s["nodes"] if n["alive"]]
    if (len(reg) != 2 or any(d != dtype for _, d, _ in reg) or
            len({k for _, _, k in reg}) != 1 or
            not re.fullmatch(r"cpu-(fma16|base)\.\d+", reg[0][2])):
        raise Fail("kv_dtype %s: the status's nodes say (name, kv_dtype, kernels) %s; want both "
                   "%s and one kernels class" % (dtype, reg, dtype))
    if rs["kv_bytes_moved"] != b_long:
        raise Fail("kv_dtype %s: the request's usage says %d KV bytes moved, the router's "
                   "status %d" % (dtype, b_long, rs["kv_bytes_moved"]))
    if rs["local_prefills"] != 1 or rs["disagg_prefills"] != 1:
        raise Fail("kv_dtype %s: local prefills %d, disaggregated %d (want 1 and 1)" % (
            dtype, rs["local_prefills"], rs["disagg_prefills"]))
    print("kv_dtype %s: generate --json == run --json --kv-dtype %s "
          "(%d-token prompt local, %d-token prompt disaggregated: %d KV bytes moved)"
          % (dtype, dtype, n_short, n_long, b_long))
    outs[dtype] = (short + long_, b_long)
    return up, ep, node_port


def mismatch(a, work, ep, node_port):
    """A decode node whose cluster file says f16 against the bf16 router."""
    cfg = cluster_file(work, "f16", ep, node_port, decode1_host="")
    log_path = os.path.join(work, "decode1.log")
    with open(log_path, "w") as log:
        p = spawn([a.decode, "--config", cfg, "--node", "decode1"], stdout=log,
                  stderr=subprocess.STDOUT)
    want = "KV dtype 'f16', the cluster file says kv_dtype bf16"

    def refused():
        with open(log_path, errors="replace") as f:
            return want in f.read()

    try:
        wait_for("decode1 refused at registration", refused, timeout=30, step=0.1)
        st = run([a.kvrail, "status", "--router", ep, "--json"], timeout=30)
        s = json.loads(st.stdout)
        if any(n["name"] == "decode1" and n["alive"] for n in s["nodes"]):
            raise Fail("decode1 (kv_dtype f16) is alive in a bf16 cluster: %s" % s["nodes"])
    finally:
        stop_group(p, grace=5)
    with open(log_path, errors="replace") as f:
        line = [x for x in f.read().splitlines() if want in x][0]
    print("kv_dtype f16 node in a bf16 cluster: refused (%s)" % line.strip())


def numerics_cluster(a, work):
    """numerics bf16dot: generate == run --numerics bf16dot; a node whose
    kernels lack AVX512-BF16 fails at start-up."""
    with open("/proc/cpuinfo") as f:
        if " avx512_bf16" not in f.read():
            print("skip (part): numerics bf16dot: this CPU has no avx512_bf16")
            return
    model = os.path.join(work, "model-bf16")
    r = run([a.mkmodel, "--out", model, "--dtype", "bf16"], timeout=60)
    if r.returncode:
        raise Fail("mkmodel: " + r.stderr)
    ep, node_port = "tcp://127.0.0.1:%d" % free_port(), free_port()
    cfg = cluster_file(work, "f32", ep, node_port, model="model-bf16", numerics="bf16dot")
    up = Up(a.kvrail, cfg, work)
    outs = []
    for prompt in (SHORT, LONG):
        n, got = check_generate(a, model, ep, prompt, run_args=("--numerics", "bf16dot"))
        outs.append(got.stdout)
        f32 = run([a.kvrail, "run", "--model", model, "--prompt", prompt, "--max-tokens", "12",
                   "--json"], timeout=60)
        if f32.returncode or f32.stdout == got.stdout:
            raise Fail("numerics bf16dot printed what f32 numerics print (rc %d): the mode is "
                       "not used" % f32.returncode)
        print("numerics bf16dot: generate --json == run --json --numerics bf16dot, != f32 "
              "numerics (%d-token prompt)" % n)
    # a node of this cluster whose kernels lack AVX512-BF16: refused at start-up
    cfg1 = cluster_file(work, "f32", ep, node_port, decode1_host="", model="model-bf16",
                        numerics="bf16dot")
    log_path = os.path.join(work, "decode1-numerics.log")
    with open(log_path, "w") as log:
        p = spawn([a.decode, "--config", cfg1, "--node", "decode1"], stdout=log,
                  stderr=subprocess.STDOUT, env=dict(os.environ, KVR_CPU_MATMUL="v3"))
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise Fail("a decode node without AVX512-BF16 kernels in a bf16dot cluster did not exit")
    finally:
        stop_group(p, grace=5)
    with open(log_path, errors="replace") as f:
        text = f.read()
    if rc == 0 or "numerics bf16dot needs a CPU with AVX512-BF16" not in text or \
            "avx512_bf16" not in text:
        raise Fail("decode1 with v3 kernels in a bf16dot cluster: rc %d, log:\n%s" % (rc, text))
    print("numerics bf16dot on kernels without AVX512-BF16: exit %d at start-up (%s)"
          % (rc, [x for x in text.splitlines() if "avx512_bf16" in x][0].strip()))
    stop(up)


def stop(up):
    up.p.send_signal(signal.SIGTERM)
    try:
        rc = up.p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise Fail("kvrail up did not stop within 15 s of SIGTERM")
    if rc != 0:
        raise Fail("kvrail up exited %d on SIGTERM" % rc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--decode", required=True)
    a = ap.parse_args()
    work = workdir("kvr-kvdtype-")
    ok = False
    try:
        model = os.path.join(work, "model")
        r = run([a.mkmodel, "--out", model], timeout=60)
        if r.returncode:
            raise Fail("mkmodel: " + r.stderr)
        outs = {}
        up, _, _ = one_cluster(a, model, work, "f32", outs)
        stop(up)
        up, ep, node_port = one_cluster(a, model, work, "bf16", outs)
        if outs["bf16"][0] == outs["f32"][0]:
            raise Fail("kv_dtype bf16 printed exactly what f32 printed: the KV dtype is not used")
        ratio = outs["bf16"][1] / outs["f32"][1]
        print("KV bytes moved for the long prompt: f32 %d, bf16 %d (ratio %.3f)"
              % (outs["f32"][1], outs["bf16"][1], ratio))
        if outs["bf16"][1] * 2 != outs["f32"][1]:
            raise Fail("bf16 KV moved %d bytes, not half of f32's %d" % (outs["bf16"][1],
                                                                      outs["f32"][1]))
        mismatch(a, work, ep, node_port)
        stop(up)
        numerics_cluster(a, work)
        ok = True
        print("kv_dtype: ok")
    except Fail as e:
        print("FAIL:", e)
        logs = os.path.join(work, "logs")
        for name in ["up.err", "decode1.log"] + (sorted(os.listdir(logs))
                                                  if os.path.isdir(logs) else []):
            path = os.path.join(work, name) if name in ("up.err", "decode1.log") else \
                os.path.join(logs, name)
            if os.path.exists(path):
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
