#!/usr/bin/env python3
"""device_refusal_test.py - `device: cuda:N` is honored or refused at start,
never a silent CPU run (issue 15), on any machine:

  - a build without CUDA: a decode node with device: cuda:0 and
    `kvrail run --device cuda:0` fail with "no CUDA" in their message;
  - a CUDA build on a machine without a GPU (CI): both fail at start with
    CUDA's own reason from cudaGetDeviceCount and the hint to use cpu;
  - a CUDA build on a machine with a GPU: `kvrail run --device cuda:0` runs
    and prints the same first token as --device cpu for a greedy run of the
    tiny model (gpu_run_ref bounds the rest), a node with device: cuda:0 and
    a ucx transport refuses (its HBM pool needs cuda_ipc), and cuda:99 is
    refused as no such GPU.
The same binaries run --device cpu first, so a failure here is the device's.

usage: device_refusal_test.py --kvrail K --decode-bin D --mkmodel M --cuda 0|1
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Cluster, check, make_model, run, workdir  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--decode-bin", required=True)
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--cuda", type=int, required=True, help="1: this build has CUDA")
    a = ap.parse_args()
    bins = argparse.Namespace(mkmodel=a.mkmodel, kvrail=a.kvrail, decode=a.decode_bin,
                              router="", prefill="", loadgen="")
    wd = workdir("gpu-refusal")
    try:
        return cases(a, bins, wd)
    finally:
        shutil.rmtree(wd, ignore_errors=True)


def cases(a, bins, wd):
    model = make_model(bins, wd)
    base = [a.kvrail, "run", "--model", model, "--prompt-tokens", "1,2,3,4,5", "--max-tokens", "4",
            "--json", "--ignore-eos"]
    cpu = run(base + ["--device", "cpu"], timeout=60)
    check(cpu.returncode == 0, "kvrail run --device cpu failed: %s" % cpu.stderr)
    gpu = run(base + ["--device", "cuda:0"], timeout=120)
    print("kvrail run --device cuda:0 -> exit %d: %s" % (gpu.returncode, gpu.stderr.strip()[-300:]))
    has_gpu = False
    if not a.cuda:
        check(gpu.returncode != 0 and "has no CUDA" in gpu.stderr,
              "a build without CUDA must refuse cuda:0 naming that: %s" % gpu.stderr)
    elif gpu.returncode != 0:
        check("cudaGetDeviceCount" in gpu.stderr and "device: cpu" in gpu.stderr,
              "no GPU here: the refusal must carry CUDA's reason and the fix: %s" % gpu.stderr)
        check(gpu.stdout.strip() == "", "a refused run printed tokens: %s" % gpu.stdout)
    else:
        has_gpu = True
        ids = lambda out: [int(m) for m in re.findall(r'"token_id": (\d+)', out)]
        c, g = ids(cpu.stdout), ids(gpu.stdout)
        print("tokens cpu %s, cuda %s" % (c, g))
        check(len(g) == 4 and g[0] == c[0], "cuda:0 run differs from cpu at once: %s vs %s" % (g, c))
        bad = run(base + ["--device", "cuda:99"], timeout=60)
        check(bad.returncode != 0 and "no such GPU" in bad.stderr,
              "cuda:99 must be refused as no such GPU: %s" % bad.stderr)
    bad = run(base + ["--device", "gpu0"], timeout=60)
    check(bad.returncode == 2 and "not a device" in bad.stderr, "--device gpu0: %s" % bad.stderr)

    # the node: device: cuda:0 in the cluster file
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=1)
    text = open(c.config).read()
    cuda_yaml = os.path.join(wd, "cuda.yaml")
    with open(cuda_yaml, "w") as f:
        f.write(re.sub(r"(\n(\s*)- name: decode0\n)", r"\1\2  device: cuda:0\n", text, count=1))
    check("device: cuda:0" in open(cuda_yaml).read(), "cuda.yaml: no device line written")
    r = run([a.decode_bin, "--config", cuda_yaml, "--node", "decode0"], timeout=60)
    out = r.stdout + r.stderr
    print("kvrail-decode device: cuda:0 -> exit %d: %s" % (r.returncode, out.strip()[-300:]))
    check(r.returncode != 0, "a decode node with device: cuda:0 started (rc 0)")
    if not a.cuda:
        want = "has no CUDA"
    elif not has_gpu:
        want = "cudaGetDeviceCount"
    else:
        want = "only transport backend cuda_ipc"  # the test's cluster uses ucx
    check("asks for device cuda:0" in out and want in out,
          "the node's refusal must say '%s': %s" % (want, out))
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
