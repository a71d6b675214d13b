"""garbage_blob_test.py - a registered decode node that hands out a
checksummed but garbage transport address must not bring a prefill node
down (issue 12: it aborted inside UCX), and the blame for the failed
prefill lands on that decode node, not on the prefill node.

A 1P+2D cluster (auth: none; the UCX transport; the router's metrics on)
is started with decode0 real; kvr-rogue-peer registers as decode1 with the
real layout and fingerprint, a transport address blob that is framed and
checksummed correctly but whose UCX worker address says version 13 (UCX
1.13 asserts on it: 'addr version 13'), garbage rkeys, and answers every
reservation.
 1. With decode0 alive: prompts (long enough to be prefilled remotely, two in
    flight, so that decode1 - idle, a whole free pool - is picked) all
    succeed on decode0 with `kvrail run`'s tokens and logprobs: prefill0
    refuses decode1's address and says the fault is the decode node's
    (PrefillDone.decode_fault), the router releases decode1's reservation
    and dispatches the request to decode0.  Asserted from the router's
    metrics: decode1 blamed at least once (and cooled down once it was
    blamed twice in a row), prefill0 blamed never.
 2. decode0 killed: a prompt can only go to decode1; the request ends (an
    error, not a hang) naming the refused address of decode1; prefill0 is
    still alive, still not blamed, and its log names the refused address.
 3. With a real decode node again, the next prompt gives `kvrail run`'s
    tokens.
The control: the same with KVR_UCX_CHECK=0 on the prefill node (the check
off) would have the prefill node die; it is not run here, the conformance
test shows the abort (test_damaged_blobs).
"""
import os
import signal
import re
import struct
import subprocess
import random
import time

from cluster_lib import (check, check_outputs, ClientCluster, free_port, node_metrics, reference,
                         ROGUE, run, run_main, spawn, stop_group, test_start, tokens_of, wait_for)

M64 = (1 << 64) - 1
P1, P2, P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
P4, P5 = 9650029242287828579, 2870177450012600261


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, v):
    return (_rotl((acc + v * P2) & M64, 31) * P1) & M64


def xxh64(data, seed=0):
    """XXH64, as transport/xfer_blob.c frames blobs with (seed 0)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for k in range(4):
            h = ((h ^ _round(0, v[k])) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1) & M64, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * P5) & M64, 11) * P1) & M64
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M64
    h = ((h ^ (h >> 29)) * P3) & M64
    return h ^ (h >> 32)


def garbage_address():
    """A UCX address blob (xfer_blob.h framing, backend 2, kind 1) whose
    kvrail header is right and whose UCX worker address is garbage."""
    wa = bytes([0x0d]) + bytes(range(1, 64))  # version nibble 13
    payload = struct.pack("<IIQ16sII", 0x41584355, 4242, 0, bytes(16), 0, len(wa)) + wa
    head = struct.pack("<IHHHHI", 0x5852564b, 1, 2, 1, 0, len(payload))
    return head + struct.pack("<Q", xxh64(head + payload)) + payload


def wait_log(c, name, text, timeout=40):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(c.logs[name]) as f:
            if text in f.read():
                return
        time.sleep(0.1)
    check(False, "'%s' not in %s's log within %d s:\n%s" % (text, name, timeout, c.tail(name)))


def blamed(port, node):
    return node_metrics(port).get(("kvrail_node_failures_blamed_total", node))


def generate(bins, c, text, n):
    return run([bins.kvrail, "generate", "--router", c.client_ep, "--max-tokens", str(n),
                "--temperature", "0", "--json", "--timeout", "30000", text], timeout=60)


def main():
    args, bins, wd, model = test_start("kvr-garbage-blob-", [ROGUE])
    blob = os.path.join(wd, "garbage.addr")
    with open(blob, "wb") as f:
        f.write(garbage_address())
    c = ClientCluster(bins, wd, model, n_prefill=1, n_decode=2, extra_yaml="auth: none\n")
    c.decodes = ["decode0"]  # decode1 is the rogue's slot
    mport = free_port()
    with open(c.config) as f:
        y = f.read()
    y = y.replace("  - name: router\n    role: router\n",
                  "  - name: router\n    role: router\n    metrics_port: %d\n" % mport)
    with open(c.config, "w") as f:
        f.write(y)
    rng = random.Random(12)
    # past the local-prefill threshold (32 tokens): prefilled on prefill0
    prompts = [([rng.randrange(4, 500) for _ in range(rng.randrange(40, 200))], 6)
               for _ in range(6)]
    rogue = None
    try:
        c.start()
        text, n = "the prefill node lives on", 8
        r = run([bins.kvrail, "run", "--model", model, "--prompt", text, "--max-tokens", str(n),
                 "--temperature", "0", "--json"], timeout=120)
        check(r.returncode == 0, "kvrail run: %s" % r.stderr)
        want = tokens_of(r.stdout)
        refs = reference(bins, model, prompts)
        with open(c.logs["router"]) as f:
            m = re.search(r"node decode0 registered: decode, \S+ transport, layout (\d+)x(\d+)x"
                          r"(\d+) (\S+) bs \d+, \d+ blocks, model (\S+)", f.read())
        check(m, "no registration line of decode0 in the router's log")
        layers, heads, hdim, dtype, fp = m.groups()
        rogue_out = open(os.path.join(wd, "rogue.out"), "w+")
        rogue = spawn([args.rogue, "--endpoint", c.node_ep, "--name", "decode1", "--role",
                       "decode", "--layers", layers, "--kv-heads", heads, "--head-dim", hdim,
                       "--dtype", dtype, "--fingerprint", fp, "--blocks", "4096",
                       "--black-hole", "--reserve", "--address-file", blob, "--rkeys", layers,
                       "--listen-ms", "120000"], stdout=rogue_out, stderr=subprocess.STDOUT)
        wait_log(c, "router", "node decode1 registered")

        # 1. a healthy decode node beside the rogue: every request succeeds there
        t0 = time.time()
        rc, outs, log = c.loadgen(prompts, ["--no-ignore-eos", "--concurrency", "2"],
                                  name="beside", timeout=120)
        check(rc == 0, "beside the rogue: kvrail-loadgen exit %d:\n%s" % (rc, log[-2000:]))
        check_outputs(outs, refs, what="beside the rogue")
        check(all(o.get("decode_node") == "decode0" for o in outs.values()),
              "a request ended on a decode node other than decode0: %s" %
              [o.get("decode_node") for o in outs.values()])
        # kvrail status reads the router's nodes directly; its metrics are
        # copies made once a second: wait until they agree
        st = {n["name"]: n for n in (c.status() or {}).get("nodes", [])}
        check(st.get("decode1", {}).get("failures_blamed", 0) >= 1,
              "kvrail status --json shows decode1 not blamed: %s" % st.get("decode1"))
        got = wait_for("the router's metrics to show decode1 blamed as kvrail status does",
                       lambda: blamed(mport, "decode1") == st["decode1"]["failures_blamed"] and
                       blamed(mport, "prefill0") is not None and node_metrics(mport), timeout=10)
        b1, b0 = got[("kvrail_node_failures_blamed_total", "decode1")], \
            got[("kvrail_node_failures_blamed_total", "prefill0")]
        cd = got.get(("kvrail_node_cooldowns_total", "decode1"), 0)
        check(b0 == 0, "prefill0 was blamed %d times for decode1's address" % b0)
        check(got.get(("kvrail_node_failures_blamed_total", "decode0")) == 0,
              "decode0 was blamed: %s" % got)
        check(cd == b1 // 2, "decode1 blamed %d times in a row, %d cool-downs (want %d)" %
              (b1, cd, b1 // 2))
        check(st["decode1"].get("cooldowns") == cd and
              st.get("prefill0", {}).get("failures_blamed") == 0,
              "kvrail status --json disagrees with the metrics (decode1 blamed %d, %d "
              "cool-downs): %s" % (b1, cd, {k: {f: v.get(f) for f in ("failures_blamed",
                                                                     "cooldowns", "cooling")}
                                            for k, v in st.items()}))
        with open(c.logs["router"]) as f:
            check("dispatched to another decode node" in f.read(),
                  "the router's log does not say the request went to another decode node")
        print("beside the rogue: %d of %d requests equal kvrail run on decode0 in %.1f s; "
              "decode1 blamed %d times (%d cool-downs), prefill0 blamed 0" %
              (len(outs), len(prompts), time.time() - t0, b1, cd))

        # 2. the rogue alone: the request ends, naming the cause
        c.kill("decode0", signal.SIGKILL)
        wait_log(c, "router", "node decode0 (decode) is dead")
        c.procs = [(nm, p) for nm, p in c.procs if nm != "decode0"]  # killed on purpose
        t0 = time.time()
        r = generate(bins, c, " ".join("word%d" % i for i in range(80)), 8)
        check(r.returncode != 0, "a request through a garbage address succeeded: %s" % r.stdout)
        # the client is told the cause (the refused address of decode1), not
        # only a symptom of the retries that followed it
        check("decode1" in r.stderr and "transport address it registered was refused" in
              r.stderr, "the error does not name the refused address: %s" % r.stderr)
        check("no other live decode node" in r.stderr,
              "the error does not say no other decode node could take it: %s" % r.stderr)
        wait_log(c, "prefill0", "is not one this UCX can use")
        c.check_alive()  # prefill0 (and the router) still running
        wait_for("decode1 blamed again", lambda: (blamed(mport, "decode1") or 0) > b1, timeout=10)
        check(blamed(mport, "prefill0") == 0, "prefill0 blamed for decode1's address")
        print("garbage address alone: request ended with an error in %.1f s (%s); prefill0 "
              "alive and not blamed, its log names the refused address" %
              (time.time() - t0, r.stderr.strip().splitlines()[-1][:160] if r.stderr else "-"))

        # 3. a real decode node again
        stop_group(rogue, grace=0)
        rogue = None
        c._start("decode0", [bins.decode, "--config", c.config, "--node", "decode0"])
        wait_log(c, "router", "node decode0 registered", timeout=60)
        deadline = time.time() + 60
        while True:
            r = generate(bins, c, text, n)
            got = tokens_of(r.stdout)
            if r.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.5)
        check(r.returncode == 0 and got == want,
              "after the rogue: rc %d, %s; kvrail run gives %s (%s)" %
              (r.returncode, got, want, r.stderr[-300:]))
        print("after the rogue: the same prefill node answers as kvrail run does")
    finally:
        if rogue:
            stop_group(rogue, grace=0)
        c.stop()


if __name__ == "__main__":
    run_main(main)
