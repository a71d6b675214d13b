#!/usr/bin/env python3
"""gpu_cluster_test.py - a 1P+1D cluster on one GPU (issue 15): both nodes
with device: cuda:0 and transport cuda_ipc, so the decode node's KV pool is
in HBM (cudaMalloc through the transfer engine) and the prefill node pushes
each layer's KV into it over CUDA IPC, the notification after the copies.

Checks: every request finishes; the greedy outputs equal `kvrail run
--device cuda:0` token for token (one request at a time, prompts shorter
than a prefill chunk, so the cluster's GEMMs have the run's shapes: cuBLAS is
deterministic per shape, not batch-invariant); requests went through the
prefill node and KV bytes moved; both nodes are alive at the end.
Exit 77 (with the reason) without a usable GPU.

usage: gpu_cluster_test.py --router R --prefill-bin P --decode-bin D --kvrail K
                           --mkmodel M --loadgen L
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import (Bins, Cluster, add_bin_args, check, make_model,  # noqa: E402
                         make_prompts, reference, run, workdir, check_outputs)


def run_ids(bins, model, toks, mt):
    r = run([bins.kvrail, "run", "--model", model, "--prompt-tokens", ",".join(map(str, toks)),
             "--max-tokens", str(mt), "--json", "--device", "cuda:0"], timeout=120)
    return r, [int(m) for m in re.findall(r'"token_id": (\d+)', r.stdout)]


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    a = ap.parse_args()
    bins = Bins(a)
    wd = workdir("gpu-cluster")
    try:
        model = make_model(bins, wd)
        prompts = make_prompts(12, max_len=400, max_tokens=12)
        r, _ = run_ids(bins, model, prompts[0][0], 1)
        if r.returncode != 0:
            if "cudaGetDeviceCount" in r.stderr or "has no CUDA" in r.stderr:
                print("SKIP: %s" % r.stderr.strip())
                return 77
            check(False, "kvrail run --device cuda:0 failed: %s" % r.stderr)
        ref = reference(bins, model, prompts, jobs=1, run_args=("--device", "cuda:0"))
        c = Cluster(bins, wd, model, n_prefill=1, n_decode=1, transport="cuda_ipc")
        text = open(c.config).read()
        for n in ("prefill0", "decode0"):
            text = re.sub(r"(\n(\s*)- name: %s\n)" % n, r"\1\2  device: cuda:0\n", text, count=1)
        with open(c.config, "w") as f:
            f.write(text)
        check(text.count("device: cuda:0") == 2, "device lines not written")
        try:
            c.start()
            rc, outs, log = c.loadgen(prompts, ["--concurrency", "1", "--no-ignore-eos"])
            print(log)
            check(rc == 0, "kvrail-loadgen exit %d" % rc)
            check_outputs(outs, ref, what="against kvrail run --device cuda:0")
            disagg = [o for o in outs.values() if not o["local_prefill"]]
            check(disagg and sum(o["kv_bytes"] for o in disagg) > 0,
                  "no request pushed KV through the prefill node")
            c.check_alive()
            print("OK: %d prompts, %d through the prefill node over cuda_ipc, outputs == kvrail run"
                  % (len(prompts), len(disagg)))
        finally:
            c.stop()
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
