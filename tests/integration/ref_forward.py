#!/usr/bin/env python3
"""ref_forward.py - an independent NumPy reference of the Llama-family forward
pass (Llama 2/3 incl. llama3 rope scaling, Qwen2 with q/k/v biases, Mistral
with sliding window), for checking kvrail's engine.

It shares no code with the engine: it reads config.json and the safetensors
files itself (single file or sharded with model.safetensors.index.json),
widens f16/bf16 to float64 and computes everything in float64, following
Hugging Face's modeling_llama / modeling_qwen2 / modeling_mistral: RMSNorm,
rotate-half RoPE, grouped-query attention with a causal (optionally
sliding-window) mask, SwiGLU, tied or untied lm_head.

    python3 ref_forward.py MODEL_DIR TOKENS(1,2,3)   prints the last logits
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        buf = raw[base + b:base + en]
        if e["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            a = u.view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{path}: {name}: dtype {e['dtype']}")
        out[name] = a.reshape(e["shape"])
    return out


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            w.update(read_safetensors(os.path.join(model_dir, fn)))
    else:
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    return cfg, w


def inv_freq(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "linear":
            f = f / rs["factor"]
        elif kind == "llama3":
            factor = rs["factor"]
            low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
            old = rs.get("original_max_position_embeddings", 8192)
            low_wl, high_wl = old / low, old / high
            wl = 2 * math.pi / f
            scaled = np.where(wl > low_wl, f / factor, f)
            smooth = (old / wl - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wl >= high_wl) & (wl <= low_wl)
            f = np.where(medium, smoothed, scaled)
    return f


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, freq):
    # x [T, heads, dh]; rotate_half convention
    ang = np.outer(pos, freq)  # [T, dh/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def round_kv(x, kv_dtype):
    """x (float64) as the engine's KV pool holds it: f32, then bf16 or f16
    rounded to nearest even (the engine rounds its f32 K/V once)."""
    f = x.astype(np.float32)
    if kv_dtype == "f32":
        return f.astype(np.float64)
    if kv_dtype == "f16":
        return f.astype(np.float16).astype(np.float64)
    if kv_dtype == "bf16":
        u = f.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"kv dtype {kv_dtype}")


def forward(cfg, w, tokens, kv_dtype=None):
    """The logits of every position; kv_dtype ("f32", "bf16", "f16") rounds
    K (after RoPE) and V as a KV pool of that dtype stores them (None: kept
    in float64)."""
    arch = cfg["architectures"][0]
    d = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    dh = cfg.get("head_dim") or d // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    window = 0
    if arch == "MistralForCausalLM":
        window = cfg.get("sliding_window") or 0
    elif arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        window = cfg.get("sliding_window") or 0
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    freq = inv_freq(cfg, dh)
    x = w["model.embed_tokens.weight"][np.array(tokens)]
    i = np.arange(T)
    mask = i[None, :] <= i[:, None]
    if window:
        mask &= i[None, :] > i[:, None] - window
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        for name, t in (("q", "q"), ("k", "k"), ("v", "v")):
            b = w.get(p + f"self_attn.{name}_proj.bias")
            if b is not None:
                if t == "q":
                    q = q + b
                elif t == "k":
                    k = k + b
                else:
                    v = v + b
        q = rope(q.reshape(T, H, dh), pos, freq)
        k = rope(k.reshape(T, Hkv, dh), pos, freq)
        v = v.reshape(T, Hkv, dh)
        if kv_dtype:
            k, v = round_kv(k, kv_dtype), round_kv(v, kv_dtype)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(dh)
        s = np.where(mask[None], s, -np.inf)
        s = s - s.max(-1, keepdims=True)
        e = np.exp(s)
        a = e / e.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * dh)
        o = o @ w[p + "self_attn.o_proj.weight"].T
        ob = w.get(p + "self_attn.o_proj.bias")
        if ob is not None:
            o = o + ob
        x = x + o
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    if cfg.get("tie_word_embeddings", False):
        lm = w["model.embed_tokens.weight"]
    else:
        lm = w["lm_head.weight"]
    return x @ lm.T


def main():
    cfg, w = load(sys.argv[1])
    toks = [int(t) for t in sys.argv[2].split(",")]
    logits = forward(cfg, w, toks)
    print(json.dumps({"argmax": int(np.argmax(logits[-1])),
                      "last": [round(float(v), 6) for v in logits[-1][:8]]}))


if __name__ == "__main__":
    main()
