#!/usr/bin/env python3
"""test_engine_badinput.py - broken model directories give a clear error
naming the file and the tensor or key, never a crash.

    test_engine_badinput.py MKMODEL ENGINE_DUMP

Each case copies a freshly generated tiny model, breaks one thing, runs the
engine's loader (engine_dump) and checks: exit status 1 (not a signal), the
status name, and that the message names the file and the tensor/key.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import sp_run, spawn  # noqa: E402  (own process groups, reaped on every exit path)


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data, pad=True):
    h = json.dumps(header).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def edit_header(fn):
    def apply(d):
        p = os.path.join(d, "model.safetensors")
        h, data = read_st(p)
        fn(h)
        write_st(p, h, data)
    return apply


def truncate(d):
    p = os.path.join(d, "model.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size // 2)


def bad_header_len(d):
    p = os.path.join(d, "model.safetensors")
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))


def short_file(d):
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"\x10\x00")


def header_garbage(d):
    p = os.path.join(d, "model.safetensors")
    h, data = read_st(p)
    raw = json.dumps(h).encode()[:-5] + b"]]]]]"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def edit_config(fn):
    def apply(d):
        p = os.path.join(d, "config.json")
        with open(p) as f:
            c = json.load(f)
        fn(c)
        with open(p, "w") as f:
            json.dump(c, f)
    return apply


def malformed_config(d):
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 64,,\n}\n')


def no_weights(d):
    os.remove(os.path.join(d, "model.safetensors"))


def bad_index(d):
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}, f)


Q = "model.layers.0.self_attn.q_proj.weight"
G = "model.layers.1.mlp.gate_proj.weight"


def set_dtype(name, dt):
    def fn(h):
        h[name]["dtype"] = dt
    return fn


def set_shape(name, shape):
    def fn(h):
        h[name]["shape"] = shape
    return fn


def drop(name):
    def fn(h):
        del h[name]
    return fn


# name, breaker, status, substrings the message must contain
CASES = [
    ("truncated safetensors", truncate, "KVR_ERR_INVALID", ["model.safetensors", "truncated"]),
    ("bad header length", bad_header_len, "KVR_ERR_INVALID",
     ["model.safetensors", "header length"]),
    ("file too short", short_file, "KVR_ERR_INVALID", ["model.safetensors", "too short"]),
    ("header not JSON", header_garbage, "KVR_ERR_INVALID",
     ["model.safetensors", "header JSON", "line 1"]),
    ("unknown dtype", edit_header(set_dtype(Q, "I8")), "KVR_ERR_UNSUPPORTED",
     ["model.safetensors", Q, "I8"]),
    ("dtype vs size mismatch", edit_header(set_dtype(Q, "F16")), "KVR_ERR_INVALID",
     ["model.safetensors", Q, "bytes"]),
    ("shape mismatch", edit_header(set_shape(G, [64, 192])), "KVR_ERR_INVALID",
     ["model.safetensors", G, "[64, 192]", "[192, 64]"]),
    ("missing tensor", edit_header(drop(G)), "KVR_ERR_NOT_FOUND", [G, "missing"]),
    ("missing lm_head", edit_header(drop("lm_head.weight")), "KVR_ERR_NOT_FOUND",
     ["lm_head.weight", "tie_word_embeddings"]),
    ("unknown architecture", edit_config(lambda c: c.update(architectures=["GPT2LMHeadModel"])),
     "KVR_ERR_UNSUPPORTED", ["config.json", "architectures", "GPT2LMHeadModel"]),
    ("missing config key", edit_config(lambda c: c.pop("hidden_size")), "KVR_ERR_INVALID",
     ["config.json", "hidden_size"]),
    ("wrong config type", edit_config(lambda c: c.update(num_hidden_layers="2")),
     "KVR_ERR_INVALID", ["config.json", "num_hidden_layers"]),
    ("heads vs kv heads", edit_config(lambda c: c.update(num_key_value_heads=3)),
     "KVR_ERR_INVALID", ["config.json", "num_key_value_heads"]),
    ("unknown rope scaling", edit_config(lambda c: c.update(rope_scaling={"rope_type": "yarn",
                                                                          "factor": 2.0})),
     "KVR_ERR_UNSUPPORTED", ["config.json", "yarn"]),
    ("malformed config JSON", malformed_config, "KVR_ERR_INVALID",
     ["config.json", "line 3"]),
    ("no safetensors", no_weights, "KVR_ERR_NOT_FOUND", ["model.safetensors"]),
    ("index names a missing shard", bad_index, "KVR_ERR_NOT_FOUND",
     ["model-00002-of-00002.safetensors"]),
]


def main():
    mkmodel, dump = sys.argv[1], sys.argv[2]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="kvr-engine-bad-") as tmp:
        good = os.path.join(tmp, "good")
        sp_run([mkmodel, "--out", good, "--seed", "7"], check=True)
        r = sp_run([dump, good, "1,2,3", "1", os.path.join(tmp, "ok")],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"the unbroken model fails: {r.stderr}"
        for i, (name, breaker, status, want) in enumerate(CASES):
            d = os.path.join(tmp, f"case{i}")
            shutil.copytree(good, d)
            breaker(d)
            r = sp_run([dump, d, "1,2,3", "1", os.path.join(tmp, f"out{i}")],
                               capture_output=True, text=True, timeout=30)
            msg = r.stderr.strip()
            ok = r.returncode == 1 and status in msg and all(w in msg for w in want)
            print(f"{'ok  ' if ok else 'FAIL'} {name:30s} rc={r.returncode} {msg}")
            if not ok:
                print(f"     want rc=1, {status}, containing {want}")
                failed += 1
        # random damage: bytes of the safetensors header and of config.json
        # flipped, files cut at random points: a clean success or exit 1
        # with a message, never a signal (crash) or a hang
        import random
        rnd = random.Random(1234)
        st_path = os.path.join(good, "model.safetensors")
        with open(st_path, "rb") as f:
            st_raw = f.read()
        (hlen,) = struct.unpack("<Q", st_raw[:8])
        with open(os.path.join(good, "config.json"), "rb") as f:
            cfg_raw = f.read()
        crashes = 0
        for i in range(60):
            d = os.path.join(tmp, f"fuzz{i}")
            shutil.copytree(good, d)
            kind = i % 3
            if kind == 0:
                b = bytearray(st_raw[:8 + hlen])
                for _ in range(rnd.randint(1, 4)):
                    b[rnd.randrange(8, len(b))] = rnd.randrange(256)
                data = bytes(b) + st_raw[8 + hlen:]
                with open(os.path.join(d, "model.safetensors"), "wb") as f:
                    f.write(data)
            elif kind == 1:
                with open(os.path.join(d, "model.safetensors"), "wb") as f:
                    f.write(st_raw[:rnd.randrange(0, len(st_raw))])
            else:
                b = bytearray(cfg_raw)
                for _ in range(rnd.randint(1, 3)):
                    b[rnd.randrange(len(b))] = rnd.choice(b'{}[]",:0123456789-.eE \x00\xff')
                with open(os.path.join(d, "config.json"), "wb") as f:
                    f.write(bytes(b))
            r = sp_run([dump, d, "1,2,3", "1", os.path.join(tmp, f"fo{i}")],
                               capture_output=True, text=True, timeout=30)
            if r.returncode not in (0, 1) or (r.returncode == 1 and not r.stderr.strip()):
                print(f"FAIL fuzz case {i} (kind {kind}): rc={r.returncode} {r.stderr[-300:]}")
                crashes += 1
            shutil.rmtree(d)
        print(f"{'ok  ' if crashes == 0 else 'FAIL'} 60 randomly damaged models: no crash")
        failed += crashes
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
