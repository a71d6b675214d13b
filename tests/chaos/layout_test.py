#!/usr/bin/env python3
"""layout_test.py - the router compares a registering node's KV layout
with the live nodes' field by field (a prefill node's blocks must be byte
for byte a decode node's), not only with the cluster file, and a mismatch
is refused at registration with a message naming the field and both
values.

1P+1D (auth: none) and a third node entry, prefill9, that nothing runs:
kvr-rogue-peer registers as prefill9 with the live nodes' model
fingerprint and their layout but for one field at a time (layers,
kv_heads, head_dim), with another KV dtype, with the engine's numerics
mode bf16dot (the cluster runs f32), and with the other kernels bit class
(cpu-base.R against the live nodes' cpu-fma16.R, or the reverse: the class
the real nodes registered, from the router's log), with the same class of
another arithmetic revision R or none (a node of another kvrail build,
whose kernels compute other bits), and with a kernels field
longer than the router keeps.  Asserted: each is refused
(a non-zero REPLY) with "field F is X, but live node N has Y" (the dtype:
the cluster file's value and its own; numerics: "field numerics is
'bf16dot', the cluster file says numerics f32"); the exact layout
registers, with and without the kernels field (the controls); the real
nodes stay alive.
"""
import datetime
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import (check, Cluster, ROGUE, run, run_main, test_start, wait_for)  # noqa: E402


def register(args, c, layers, heads, hdim, dtype, fp, numerics="", kernels=""):
    r = run([args.rogue, "--endpoint", c.node_ep, "--name", "prefill9", "--role", "prefill",
             "--layers", str(layers), "--kv-heads", str(heads), "--head-dim", str(hdim),
             "--dtype", dtype, "--numerics", numerics, "--kernels", kernels, "--fingerprint", fp,
             "--wait-ms", "3000"],
            timeout=30)
    check(r.returncode == 0, "kvr-rogue-peer failed: %s" % r.stderr)
    line = [ln for ln in r.stdout.split("\n") if ln.startswith(("REPLY", "NO-REPLY"))]
    check(line, "kvr-rogue-peer printed no reply: %s" % r.stdout)
    return line[0]


def main():
    args, bins, wd, model = test_start("kvr-layout-", [ROGUE])
    extra = "\n".join(["  - name: prefill9", "    role: prefill", "    transport:",
                       "      backend: ucx", "  - name: prefill8", "    role: prefill",
                       "    transport:", "      backend: ucx", ""])
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, extra_yaml=extra)
    try:
        c.start()
        with open(c.logs["router"]) as f:
            log = f.read()
        m = re.search(r"node decode0 registered: decode, \S+ transport, layout (\d+)x(\d+)x(\d+) "
                      r"(\S+) bs \d+, \d+ blocks, model (\S+) kernels (\S+)", log)
        check(m, "no registration line of decode0 in the router's log")
        layers, heads, hdim = (int(x) for x in m.groups()[:3])
        dtype, fp, kern = m.group(4), m.group(5), m.group(6)
        m = re.fullmatch(r"(cpu-fma16|cpu-base)(\.\d+)", kern)
        check(m, "decode0 registered kernels '%s', not cpu-fma16.R or cpu-base.R (R the "
              "arithmetic revision)" % kern)
        fam, rev = m.groups()
        cases = [("layers", (layers + 1, heads, hdim), layers + 1, layers),
                 ("kv_heads", (layers, heads * 2, hdim), heads * 2, heads),
                 ("head_dim", (layers, heads, hdim + 8), hdim + 8, hdim)]
        for field, (L, H, D), mine, theirs in cases:
            got = register(args, c, L, H, D, dtype, fp)
            print("prefill9 with %s %d (live nodes: %d): %s" % (field, mine, theirs, got))
            check(got.startswith("REPLY") and not got.startswith("REPLY 0 "),
                  "a node with %s %d was not refused: %s" % (field, mine, got))
            check(re.search(r"field %s is %d, but live node (prefill0|decode0) has %d" %
                            (field, mine, theirs), got),
                  "the refusal does not name the field %s and both values: %s" % (field, got))
        other = "bf16" if dtype != "bf16" else "f16"
        got = register(args, c, layers, heads, hdim, other, fp)
        print("prefill9 with dtype %s: %s" % (other, got))
        check("'%s'" % other in got and dtype in got and not got.startswith("REPLY 0 "),
              "a node with KV dtype %s was not refused naming both dtypes: %s" % (other, got))
        # the engine's numerics mode (another mode computes other logits):
        # refused naming the field and both modes
        got = register(args, c, layers, heads, hdim, dtype, fp, "bf16dot")
        print("prefill9 with numerics bf16dot: %s" % got)
        check(re.search(r"field numerics is 'bf16dot', the cluster file says numerics f32", got) and
              not got.startswith("REPLY 0 "),
              "a node with numerics bf16dot was not refused naming the field: %s" % got)
        # the engine kernels' bit class (cpu-base rounds otherwise than
        # cpu-fma16): refused naming the field, both classes and a live node
        # and the same family of another arithmetic revision (a node of an
        # older or newer kvrail build: its kernels compute other bits)
        other_fam = ("cpu-base" if fam == "cpu-fma16" else "cpu-fma16") + rev
        for other in (other_fam, fam, fam + ".1", fam + ".%d" % (int(rev[1:]) + 1)):
            got = register(args, c, layers, heads, hdim, dtype, fp, kernels=other)
            print("prefill9 with kernels %s (live nodes: %s): %s" % (other, kern, got))
            check(re.search(r"field kernels is '%s', but live node (prefill0|decode0) has '%s'" %
                            (re.escape(other), re.escape(kern)), got) and
                  not got.startswith("REPLY 0 "),
                  "a node with kernels %s was not refused naming both classes: %s" % (other, got))
        # a kernels field longer than the router's table holds: refused, not cut
        got = register(args, c, layers, heads, hdim, dtype, fp, kernels=kern + "-" * 16)
        print("prefill9 with a 16+ byte kernels field: %s" % got)
        check(re.search(r"field kernels is longer than 15 bytes", got) and
              not got.startswith("REPLY 0 "),
              "a node with an over-long kernels field was not refused naming it: %s" % got)
        got = register(args, c, layers, heads, hdim, dtype, fp, kernels=kern)
        print("prefill9 with the live nodes' layout and kernels (control): %s" % got)
        check(got.startswith("REPLY 0"), "the matching layout and kernels were refused: %s" % got)
        got = register(args, c, layers, heads, hdim, dtype, fp)
        print("prefill9 with the live nodes' layout (control): %s" % got)
        check(got.startswith("REPLY 0"), "the matching layout was refused: %s" % got)
        if fam == "cpu-fma16":
            # a real prefill node on the baseline kernels (KVR_CPU_MATMUL=base,
            # what a CPU without AVX2+FMA runs) says so at start-up and is
            # refused by the router, naming both classes, and never serves
            p8 = c._start("prefill8", [c.bins.prefill, "--config", c.config, "--node", "prefill8",
                                       "--stats-file", c.stats_path("prefill8")],
                          {"KVR_CPU_MATMUL": "base"})

            def refused():
                check(p8.poll() is None, "prefill8 exited: %s" % c.tail("prefill8"))
                with open(c.logs["prefill8"]) as f:
                    log8 = f.read()
                return re.search(r"REGISTER with an error: register: KV layout field kernels "
                                 r"is 'cpu-base%s', but live node \S+ has '%s'" %
                                 (re.escape(rev), re.escape(kern)), log8) and log8
            log8 = wait_for("prefill8 (KVR_CPU_MATMUL=base) to be refused naming the kernels",
                            refused, timeout=60)
            check("baseline kernels (cpu-base" in log8,
                  "prefill8 did not warn at start-up that it runs the baseline kernels: %s" %
                  log8[-2000:])
            st = c.status() or {}
            check(not any(n["name"] == "prefill8" and n.get("alive") for n in
                          st.get("nodes", [])),
                  "prefill8 (cpu-base) is alive in the router: %s" % st.get("nodes"))
            # refused again and again, it backs off (1 s doubling to 30 s: not a
            # log line and a REGISTER a second for as long as it runs)
            log8 = wait_for("prefill8's second refusal, next try in 4 s",
                            lambda: refused() if "next try in 4 s" in refused() else None,
                            timeout=30)
            tries = re.findall(r"^(\S+) W prefill8 node\[\d+\]: the router answered REGISTER with "
                               r"an error: .*next try in (\d+) s$", log8, re.M)
            check([t[1] for t in tries[:2]] == ["2", "4"],
                  "prefill8's retries do not back off 2 s, 4 s: %s" % [t[1] for t in tries])
            t0, t1 = (datetime.datetime.strptime(t[0], "%Y-%m-%dT%H:%M:%S.%fZ") for t in tries[:2])
            check((t1 - t0).total_seconds() >= 1.9,
                  "prefill8 registered again %.2f s after a refusal that said 2 s" %
                  (t1 - t0).total_seconds())
            print("prefill8 (KVR_CPU_MATMUL=base): refused, kernels cpu-base%s vs %s; "
                  "retries backed off: %s" % (rev, kern, ", ".join(t[1] + " s" for t in tries)))
        st = c.status() or {}
        alive = {n["name"] for n in st.get("nodes", []) if n.get("alive")}
        check({"prefill0", "decode0"} <= alive, "real nodes not alive after the refusals: %s" %
              alive)
        c.check_alive()
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
