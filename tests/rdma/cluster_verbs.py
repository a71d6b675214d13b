#!/usr/bin/env python3
"""cluster_verbs.py BUILD - 1 prefill + 1 decode node with the KV cache moved
over the verbs backend (soft-RoCE rxe_lo inside the test VM), every output
token-for-token equal to `kvrail run`.  Run by tests/rdma/guest.sh.

Uses tests/integration/cluster_lib.py (real router, prefill and decode
processes, kvrail-loadgen).  Prompts are longer than the local-prefill
threshold, so every request is disaggregated; the decode node's stats must
show KV blocks received.  Exits 77 when the cluster binaries are not built.
"""
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from cluster_lib import (Cluster, Fail, check, make_model, reference, run_main, sp_run,  # noqa
                         workdir, check_outputs)


class B:
    pass


class SlowCluster(Cluster):
    """cluster_lib's Cluster with the patience a loaded TCG guest needs: a
    status call that takes longer than a second is not a failure here."""

    def status(self, timeout_ms=3000):
        try:
            r = sp_run([self.bins.loadgen, "--router", self.client_ep, "--status",
                                "--timeout-ms", str(max(timeout_ms, 5000))],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None


def main():
    build = sys.argv[1]
    b = B()
    paths = {"router": "router/kvrail-router", "prefill": "prefill/kvrail-prefill",
             "decode": "decode/kvrail-decode", "kvrail": "tools/kvrail/kvrail",
             "mkmodel": "tools/mkmodel/kvrail-mkmodel", "loadgen": "tools/loadgen/kvrail-loadgen"}
    for k, rel in paths.items():
        p = os.path.join(build, rel)
        if not os.access(p, os.X_OK):
            print("SKIP: %s not built (%s)" % (k, p), file=sys.stderr)
            return 77
        setattr(b, k, p)
    os.environ.setdefault("KVR_VERBS_DEVICES", "rxe_lo")
    wd = workdir("kvr-verbs-cluster-")
    model = make_model(b, wd)
    rng = random.Random(11)
    prompts = [([rng.randrange(4, 512) for _ in range(n)], 5) for n in (40, 90)]
    ref = reference(b, model, prompts)
    c = SlowCluster(b, wd, model, transport="verbs", local_prefill_tokens=8)
    try:
        c.start(timeout=100)
        rc, outs, log = c.loadgen(prompts, ["--concurrency", "2", "--no-ignore-eos"], timeout=150)
        check(rc == 0, "kvrail-loadgen exit %d: %s" % (rc, log[-800:]))
        check_outputs(outs, ref, what="over verbs")
        ds = c.stats("decode0")
        check(ds.get("kv_bytes_received", 0) > 0, "decode0 received no KV bytes: %s" % ds)
        print("decode0 stats: %s" % {k: v for k, v in ds.items() if "kv" in k or "block" in k
                                     or "transport" in k})
        print("1P+1D over verbs: %d prompts, tokens equal to kvrail run" % len(prompts))
        return 0
    except Fail:
        for n in ("router", "prefill0", "decode0"):
            print(c.tail(n), file=sys.stderr)
        raise
    finally:
        c.stop()


if __name__ == "__main__":
    run_main(main)
