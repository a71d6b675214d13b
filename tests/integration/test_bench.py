#!/usr/bin/env python3
"""test_bench.py - smoke tests of kvrail-bench (tools/bench/).

    test_bench.py KVRAIL_BENCH MODE

MODE is one of
  loop      one process, loop backend: --check passes for WRITE and READ, the
            JSON document parses with sane fields, descriptors are not
            coalesced unless --coalesce, and --inject-corruption is caught;
  ucx-shm   two processes (target + initiator, TCP side channel) over UCX
  ucx-tcp   shared memory or TCP: --check passes, the target verified every
            byte the initiator wrote, notifications == posts;
  badinput  bad options give a clear message naming the option and a
            non-zero exit, never a crash; a mismatched backend is refused.
Exits 77 (skip) when the build has no UCX backend (ucx-* modes only).
"""
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)

BENCH = sys.argv[1]
MODE = sys.argv[2]
TIMEOUT = 60


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(args, env=None, timeout=TIMEOUT):
    p = sp_run([BENCH] + args, capture_output=True, text=True, timeout=timeout,
                       env=env)
    return p.returncode, p.stdout, p.stderr


def backends():
    _, out, _ = run(["--help"])
    line = [l for l in out.splitlines() if "built:" in l]
    check(line, "--help does not list the built backends")
    return line[0].split("built:")[1].strip(" )").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def parse_doc(out, what):
    try:
        doc = json.loads(out)
    except ValueError as e:
        fail("%s: --json output is not JSON (%s): %r" % (what, e, out[:500]))
    for key in ("tool", "backend", "transports", "pool_bytes", "reg_ms", "rows"):
        check(key in doc, "%s: JSON lacks %r" % (what, key))
    check(doc["tool"] == "kvrail-bench", "tool field")
    check(doc["reg_ms"] >= 0, "reg_ms negative")
    return doc


def check_rows(doc, sizes, batches, what, coalesced=False, checked=True):
    rows = doc["rows"]
    check(len(rows) == len(sizes) * len(batches),
          "%s: %d rows, want %d" % (what, len(rows), len(sizes) * len(batches)))
    i = 0
    for s in sizes:
        for b in batches:
            r = rows[i]
            i += 1
            tag = "%s row %d B x %d" % (what, s, b)
            check("error" not in r, "%s: error %s" % (tag, r.get("error")))
            check(r["block_size"] == s and r["batch"] == b, tag + ": wrong size/batch")
            check(r["ndesc"] == b, tag + ": ndesc")
            want_seg = 1 if coalesced else b
            check(r["ndesc_coalesced"] == want_seg,
                  "%s: %d segments after coalescing, want %d" % (tag, r["ndesc_coalesced"],
                                                               want_seg))
            check(r["posts"] > 0 and r["bytes"] == r["posts"] * s * b, tag + ": bytes != posts*s*b")
            check(r["gbps"] > 0 and r["seconds"] > 0 and r["posts_per_s"] > 0, tag + ": rates")
            check(abs(r["gbps"] - r["bytes"] / r["seconds"] / 1e9) <= 0.01 * r["gbps"] + 1e-6,
                  tag + ": gbps is not bytes/seconds/1e9")
            check(0 <= r["post_ns_p50"] <= r["post_ns_p99"], tag + ": post percentiles")
            check(0 <= r["lat_us_p50"] <= r["lat_us_p99"], tag + ": latency percentiles")
            if checked:
                check(r["check"] == "ok", tag + ": check " + str(r["check"]))
                check(r["verified_bytes"] == r["bytes"], tag + ": not every byte verified")
                # one lap over the pool: every slot written once
                check(r["posts"] == r["lists"], tag + ": posts != lists (one lap)")
    return rows


def mode_loop():
    sizes, batches = [4096, 16384, 1 << 20], [1, 16]
    common = ["--backend", "loop", "--pool-size", "32M", "--sizes", "4K,16K,1M",
              "--batch", "1,16", "--json", "--quiet"]
    for op in ("write", "read"):
        rc, out, err = run(common + ["--check", "--op", op])
        check(rc == 0, "loop %s --check exited %d: %s" % (op, rc, err[-2000:]))
        doc = parse_doc(out, "loop " + op)
        check(doc["backend"] == "loop", "backend field")
        check_rows(doc, sizes, batches, "loop " + op)
    # adjacent descriptors are merged into one segment
    rc, out, err = run(common + ["--check", "--coalesce"])
    check(rc == 0, "loop --coalesce exited %d: %s" % (rc, err[-2000:]))
    check_rows(parse_doc(out, "coalesce"), sizes, batches, "coalesce", coalesced=True)
    # timed (no check) rows, by duration
    rc, out, err = run(common + ["--duration", "0.1"])
    check(rc == 0, "loop timed run exited %d: %s" % (rc, err[-2000:]))
    rows = check_rows(parse_doc(out, "timed"), sizes, batches, "timed", checked=False)
    check(all(r["check"] is None for r in rows), "check field of unchecked rows")
    # the checker itself: a damaged byte must be caught and named
    rc, out, err = run(common + ["--check", "--inject-corruption"])
    check(rc != 0, "--inject-corruption: the damaged byte was not detected")
    check("wrong" in err or "wrong" in out, "--inject-corruption: no message naming the byte")
    # --cpu-time: each post also in the thread's CPU time, the row's context
    # switches and faults, the memcpy column's copies per post
    rc, out, err = run(common + ["--duration", "0.1", "--cpu-time"])
    check(rc == 0, "loop --cpu-time exited %d: %s" % (rc, err[-2000:]))
    for r in check_rows(parse_doc(out, "cpu-time"), sizes, batches, "cpu-time", checked=False):
        check(0 < r["post_cpu_ns_p50"] <= r["post_cpu_ns_p99"], "cpu-time: CPU percentiles")
        check(r["nivcsw"] >= 0 and r["nminflt"] >= 0, "cpu-time: counters")
        check(0 < r["memcpy_post_ns_p50"] <= r["memcpy_post_ns_p99"], "cpu-time: memcpy per post")
    # the readable table
    rc, out, err = run(["--backend", "loop", "--pool-size", "8M", "--sizes", "64K",
                        "--batch", "4", "--iters", "50", "--quiet"])
    check(rc == 0 and "GB/s" in out and "registration" in out, "table output: " + out + err)


def two_process(tls, extra_target=(), extra_init=(), op="write", check_mode=True):
    port = free_port()
    env = dict(os.environ)
    targs = ["--role", "target", "--listen", "127.0.0.1:%d" % port, "--backend", "ucx",
             "--tls", tls, "--pool-size", "16M", "--wait", "20000"] + list(extra_target)
    # shared memory: kvr_xfer_mem_alloc pools (the default); TCP: mmap + kvr_xfer_mem_reg
    mem = ["--mem", "reg" if tls == "tcp" else "alloc"]
    targs += mem
    tgt = spawn([BENCH] + targs, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
    try:
        iargs = ["--role", "initiator", "--peer", "127.0.0.1:%d" % port, "--backend", "ucx",
                 "--tls", tls, "--pool-size", "16M", "--sizes", "16K,1M", "--batch", "1,16",
                 "--depth", "32", "--op", op, "--json", "--quiet", "--wait", "20000"] + mem + list(
                     extra_init)
        if check_mode:
            iargs.append("--check")
        rc, out, err = run(iargs, env=env)
        tout, terr = tgt.communicate(timeout=20)
    finally:
        if tgt.poll() is None:
            tgt.kill()
            tgt.wait()
    return rc, out, err, tgt.returncode, terr


def mode_ucx(tls):
    if "ucx" not in backends():
        print("SKIP: this build has no ucx backend", file=sys.stderr)
        sys.exit(77)
    sizes, batches = [16384, 1 << 20], [1, 16]
    for op in ("write", "read"):
        # the READ run's target sleeps on the engine's event fd when idle
        ext = ["--target-wait", "event"] if op == "read" else []
        rc, out, err, trc, terr = two_process(tls, op=op, extra_target=ext)
        check(rc == 0, "initiator (%s, %s) exited %d: %s" % (tls, op, rc, err[-3000:]))
        check(trc == 0, "target (%s, %s) exited %d: %s" % (tls, op, trc, terr[-3000:]))
        doc = parse_doc(out, "ucx " + tls)
        check(doc["backend"] == "ucx" and doc["role"] == "initiator", "backend/role fields")
        check(doc["transports"], "no transports reported")
        check(doc["target_reg_ms"] > 0, "the target's registration time is missing")
        rows = check_rows(doc, sizes, batches, "ucx %s %s" % (tls, op))
        if op == "write":
            t = doc.get("target")
            check(t is not None, "no target summary in JSON")
            check(t["failures"] == 0, "target failures")
            check(t["notifs"] == sum(r["posts"] for r in rows), "target notifs != posts")
            check(t["verified_bytes"] == sum(r["bytes"] for r in rows),
                  "target verified %d bytes, initiator wrote %d" %
                  (t["verified_bytes"], sum(r["bytes"] for r in rows)))
    # the target's checker catches a damaged byte, and says so
    rc, out, err, trc, terr = two_process(tls, extra_target=["--inject-corruption"])
    check(rc != 0, "corruption at the target went unnoticed by the initiator")
    check(trc != 0 and "wrong" in terr, "target did not name the damaged byte: " + terr[-1000:])


def mode_badinput():
    cases = [
        (["--sizes", "0"], "--sizes"),
        (["--sizes", "12Q"], "--sizes"),
        (["--batch", "1,x"], "--batch"),
        (["--pool-size", "-1"], "--pool-size"),
        (["--op", "copy"], "--op"),
        (["--role", "boss"], "--role"),
        (["--role", "initiator"], "--peer"),
        (["--depth", "0"], "--depth"),
        (["--duration", "abc"], "--duration"),
        (["stray"], "stray"),
    ]
    for args, word in cases:
        rc, out, err = run(args, timeout=10)
        check(rc == 2, "%s: exit %d, want 2 (usage)" % (args, rc))
        check(word in err, "%s: message does not name %r: %r" % (args, word, err))
    rc, out, err = run(["--backend", "nosuch", "--pool-size", "1M"], timeout=10)
    check(rc == 1 and "nosuch" in err, "unknown backend: rc %d, %r" % (rc, err))
    # a post bigger than the pool is an error row, not a crash
    rc, out, err = run(["--backend", "loop", "--pool-size", "1M", "--sizes", "4M", "--batch", "1",
                        "--quiet"], timeout=10)
    check(rc == 1 and "does not fit" in out + err, "oversized post: rc %d %r" % (rc, out + err))
    # nobody listening: bounded wait, clear message
    t0 = time.time()
    rc, out, err = run(["--role", "initiator", "--peer", "127.0.0.1:%d" % free_port(),
                        "--backend", "loop", "--wait", "500", "--pool-size", "1M"], timeout=10)
    check(rc == 1 and "cannot reach target" in err, "no target: rc %d %r" % (rc, err))
    check(time.time() - t0 < 5, "no target: waited too long")
    check("--peer" in run(["--peer", "x:1"], timeout=10)[2], "--peer without initiator role")
    if "ucx" in backends():
        # --require-rdma on a machine without RDMA: a clear start-up error, no silent fall-back
        rc, out, err = run(["--backend", "ucx", "--require-rdma", "--pool-size", "1M", "--quiet"],
                           timeout=20)
        if rc == 0:
            check("rdma" in out.lower() or "rc_" in out or "ud_" in out,
                  "--require-rdma passed over a non-RDMA transport: " + out)
        else:
            check(rc == 1 and "RDMA" in err, "--require-rdma: rc %d %r" % (rc, err))
        # a target speaking another backend refuses the initiator, by name
        port = free_port()
        tgt = spawn([BENCH, "--role", "target", "--listen", "127.0.0.1:%d" % port,
                                "--backend", "ucx", "--pool-size", "1M", "--wait", "10000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            rc, out, err = run(["--role", "initiator", "--peer", "127.0.0.1:%d" % port,
                                "--backend", "loop", "--pool-size", "1M", "--wait", "10000"],
                               timeout=20)
            tgt.communicate(timeout=10)
        finally:
            if tgt.poll() is None:
                tgt.kill()
                tgt.wait()
        check(rc == 1 and "backend ucx" in err and "loop" in err,
              "backend mismatch not refused by name: rc %d %r" % (rc, err))


if MODE == "loop":
    mode_loop()
elif MODE == "ucx-shm":
    mode_ucx("posix,cma,self")
elif MODE == "ucx-tcp":
    mode_ucx("tcp")
elif MODE == "badinput":
    mode_badinput()
else:
    fail("unknown mode " + MODE)
print("ok")
