#!/usr/bin/env python3
"""test_engine_ref.py - the engine's logits against the independent NumPy
reference (ref_forward.py), prefill and 32 greedy decode steps, for each
architecture, GQA ratios 1 and 4, f32/f16/bf16 weights, tied and untied,
sharded, llama3 rope scaling and a sliding window.

    test_engine_ref.py MKMODEL ENGINE_DUMP

Bounds: max |engine - reference| over every logit of every position <= 1e-3
with f32 weights.  With f16/bf16 weights both sides widen the same rounded
values exactly and the engine computes in f32, so the same arithmetic error
applies; the stated bound is 2e-3 to leave room.  The reference runs in
float64.

KV pool dtypes (KV_CASES): with a bf16 or f16 KV pool the engine is checked
against the reference that rounds K and V the same way (the same bounds as
f32: the implementation), and the error against the unrounded float64
reference is the dtype's accuracy, stated per dtype relative to the largest
|logit| (measured: f16 <= 4.8e-4, bf16 <= 2.2e-3 of it):
    f16 KV  <= 1e-3 max|logit|   (10-bit mantissa: K/V relative error <= 2^-11)
    bf16 KV <= 6e-3 max|logit|   (7-bit mantissa: K/V relative error <= 2^-8)

numerics bf16dot (NUMERICS_CASES, on a CPU with avx512_bf16): the bf16-weight
matmuls take their activations rounded to bf16 (relative error <= 2^-9 per
element) and sum pairs of products in vdpbf16ps; against the float64
reference (unrounded activations), measured <= 5.6e-3 of max|logit|:
    bf16dot  <= 1e-2 max|logit|
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_forward  # noqa: E402

# name, mkmodel flags, block size, max_tokens (prefill chunk), bound[, prompt length]
CASES = [
    ("llama-f32-gqa1", "--arch llama --heads 4 --kv-heads 4", 16, 0, 1e-3),
    ("llama-f32-gqa4-llama3rope-tied", "--arch llama --heads 8 --kv-heads 2 --hidden 64 "
     "--rope-scaling llama3 --tie", 16, 0, 1e-3),
    ("qwen2-f32-gqa1", "--arch qwen2 --heads 4 --kv-heads 4", 8, 0, 1e-3),
    ("qwen2-f32-gqa4-shards", "--arch qwen2 --heads 4 --kv-heads 1 --shards 3", 16, 16, 1e-3),
    ("mistral-f32-gqa1-window", "--arch mistral --heads 4 --kv-heads 4 --sliding-window 24",
     16, 0, 1e-3),
    ("mistral-f32-gqa4", "--arch mistral --heads 8 --kv-heads 2 --hidden 128 --layers 3", 4,
     0, 1e-3),
    ("llama-bf16-gqa4", "--arch llama --heads 8 --kv-heads 2 --dtype bf16", 16, 0, 2e-3),
    ("qwen2-f16-gqa4", "--arch qwen2 --heads 4 --kv-heads 1 --dtype f16", 16, 0, 2e-3),
    # long prompts: sgemm (with bf16 widening) and GEMM attention in row tiles
    ("llama-bf16-gqa4-long", "--arch llama --heads 8 --kv-heads 2 --dtype bf16", 16, 0, 2e-3,
     150),
    ("mistral-f32-gqa1-window-long", "--arch mistral --heads 4 --kv-heads 4 --sliding-window 40",
     16, 100, 1e-3, 150),
]

# base case (index into CASES), KV dtype, bound against the unrounded
# reference as a fraction of max |logit|
KV_CASES = [
    (1, "f16", 1e-3),
    (1, "bf16", 6e-3),
    (2, "bf16", 6e-3),
    (7, "f16", 1e-3),
    (8, "bf16", 6e-3),
    (9, "f16", 1e-3),
]

# numerics bf16dot (bf16 weights on AVX512-BF16 vdpbf16ps, activations
# rounded to bf16): base case, bound against the float64 reference (whose
# activations are not rounded) as a fraction of max |logit|.  Run only on a
# CPU with avx512_bf16 (elsewhere the mode is refused at start-up).
NUMERICS_BOUND = 1e-2
NUMERICS_CASES = [6, 8]

N_PROMPT_DEFAULT = 37
N_DECODE = 32


def main():
    mkmodel, dump = sys.argv[1], sys.argv[2]
    worst = 0.0
    runs = [(i, "f32", None) for i in range(len(CASES))] + KV_CASES
    with open("/proc/cpuinfo") as f:
        bf16dot = " avx512_bf16" in f.read()
    if bf16dot:
        runs += [(i, "f32", "bf16dot") for i in NUMERICS_CASES]
    else:
        print("skip (part): numerics bf16dot: this CPU has no avx512_bf16")
    with tempfile.TemporaryDirectory(prefix="kvr-engine-ref-") as tmp:
        for i, kv, kv_bound in runs:
            name, flags, bs, max_tokens, bound = CASES[i][:5]
            numerics = "f32"
            if kv_bound == "bf16dot":
                numerics, kv_bound = kv_bound, None
            N_PROMPT = CASES[i][5] if len(CASES[i]) > 5 else N_PROMPT_DEFAULT
            mdir = os.path.join(tmp, name)
            if not os.path.isdir(mdir):
                sp_run([mkmodel, "--out", mdir, "--seed", str(100 + i)] + flags.split(),
                       check=True)
            if kv != "f32":
                name = f"{name}-kv{kv}"
            if numerics != "f32":
                name = f"{name}-{numerics}"
            rng = np.random.default_rng(i)
            prompt = rng.integers(0, 256, N_PROMPT).tolist()
            out = os.path.join(tmp, name + ".out")
            env = dict(os.environ, KVR_LOG_LEVEL="warn")
            sp_run([dump, mdir, ",".join(map(str, prompt)), str(N_DECODE), out, str(bs),
                    str(max_tokens), kv, numerics], check=True, env=env)
            with open(out + ".json") as f:
                meta = json.load(f)
            V = meta["vocab"]
            got = np.fromfile(out + ".f32", dtype="<f4").reshape(-1, V)
            toks = meta["tokens"]
            assert toks[:N_PROMPT] == prompt, "driver changed the prompt"
            assert got.shape[0] == N_PROMPT + N_DECODE
            # the row for position p is the logits after tokens[0..p]; the
            # last decoded token is fed at position N_PROMPT + N_DECODE - 1
            cfg, w = ref_forward.load(mdir)
            ref = ref_forward.forward(cfg, w, toks[:N_PROMPT + N_DECODE],
                                      kv_dtype=kv if kv != "f32" else None)
            err_pre = float(np.max(np.abs(got[:N_PROMPT] - ref[:N_PROMPT])))
            err_dec = float(np.max(np.abs(got[N_PROMPT:] - ref[N_PROMPT:])))
            scale = float(np.max(np.abs(ref)))
            if numerics != "f32":  # the mode's accuracy, relative to max |logit|
                bound = NUMERICS_BOUND * scale
            # greedy tokens must be the reference's argmax wherever the top
            # two are not within the error bound
            for p in range(N_PROMPT - 1, N_PROMPT + N_DECODE - 1):
                top2 = np.sort(ref[p])[-2:]
                if top2[1] - top2[0] > 2 * bound:
                    assert toks[p + 1] == int(np.argmax(ref[p])), \
                        f"{name}: greedy token at position {p + 1} differs from the reference"
            acc = ""
            if kv != "f32":
                exact = ref_forward.forward(cfg, w, toks[:N_PROMPT + N_DECODE])
                err_kv = float(np.max(np.abs(got - exact))) / float(np.max(np.abs(exact)))
                acc = f"  vs unrounded KV {err_kv:.1e} of max|logit| (bound {kv_bound:.0e})"
                if not err_kv <= kv_bound:
                    print(f"FAIL: {name}: error against the unrounded reference above "
                          f"{kv_bound} of max|logit|")
                    return 1
            if numerics != "f32":
                acc = (f"  {max(err_pre, err_dec) / scale:.1e} of max|logit| "
                       f"(bound {NUMERICS_BOUND:.0e})")
            print(f"{name:34s} prefill max err {err_pre:.2e}  decode max err {err_dec:.2e}  "
                  f"(|logit| up to {scale:.1f}, bound {bound:.0e}){acc}")
            if not (err_pre <= bound and err_dec <= bound):
                print(f"FAIL: {name}: error above {bound}")
                return 1
            if scale < 0.5:
                print(f"FAIL: {name}: logits nearly all zero; the test model is degenerate")
                return 1
            worst = max(worst, err_pre, err_dec)
    print(f"all {len(runs)} cases within bounds; worst error {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
