#!/usr/bin/env python3
"""mkseeds.py - writes the seed corpora of the decode, cluster, model and
tokenizer fuzz targets (tests/fuzz/corpus/<target>/; the router's come from
mkseeds.c).  Each seed is one scenario or file named for what it exercises;
the record formats are described at the top of each target's .c file.

    tests/fuzz/mkseeds.py            (from the source root)
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(HERE, "data")


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- decode: op bytes (fuzz_decode.c) ----
def reserve(rid, prefix=0, suffix=5, mt=9, attempt=0, local=False, p1=False, flags=0):
    return bytes([1, rid - 1, prefix, suffix, mt, (attempt << 4) | (1 if local else 0) | (2 if p1 else 0), flags])


def notif(kind, rid, attempt=0, own_block=True, tok=5, p1=False, inc2=False, badfp=False, blk=0):
    b0 = (kind - 1) | (0x10 if p1 else 0) | (0x20 if inc2 else 0) | (0x40 if badfp else 0)
    return bytes([4, b0, rid - 1, (attempt << 4) | (1 if own_block else 0), tok, blk])


HELLO, READY, ABORT, PROGRESS = 1, 2, 3, 4
STEP, EXPIRE, RESYNC = bytes([5]), bytes([6]), bytes([7])


def cancel(rid):
    return bytes([2, rid - 1])


def raw(method, flags, payload):
    return bytes([0, method, flags, len(payload)]) + payload


def decode_seeds():
    for paged in (0, 1):
        p = bytes([paged])
        sfx = "-paged" if paged else "-whole"
        put("decode", "local-prefill" + sfx, p + reserve(1, 1, 20, 9, local=True) + STEP * 12)
        put("decode", "remote" + sfx,
            p + reserve(1, 2, 6, 7) + notif(HELLO, 1) + notif(READY, 1) + STEP * 9)
        put("decode", "prefix-reuse" + sfx,
            p + reserve(1, 2, 3, 2, local=True) + STEP * 8 + reserve(2, 2, 9, 3, local=True)
            + STEP * 8 + RESYNC)
        put("decode", "retry" + sfx,
            p + reserve(1, 1, 8, 6) + notif(HELLO, 1) + notif(PROGRESS, 1)
            + reserve(1, 1, 8, 6, attempt=1, p1=True) + notif(HELLO, 1, p1=True)
            + notif(READY, 1, attempt=0) + notif(READY, 1, attempt=1, p1=True) + STEP * 8)
        put("decode", "cancel-quarantine" + sfx,
            p + reserve(1, 0, 12, 5) + cancel(1) + reserve(1, 0, 12, 5)
            + notif(ABORT, 1) + EXPIRE + STEP)
        put("decode", "lease-expiry" + sfx, p + reserve(3, 1, 4, 4) + EXPIRE + notif(READY, 3))
        put("decode", "pool-full" + sfx,
            p + b"".join(reserve(r, r % 3, 23, 11, local=True) for r in (1, 2, 3, 4))
            + STEP * 20 + cancel(2) + STEP * 10)
        put("decode", "mismatch" + sfx,
            p + reserve(2, 0, 3, 3) + notif(HELLO, 2, badfp=True) + notif(READY, 2)
            + reserve(4, 0, 3, 3) + notif(READY, 4, inc2=True) + notif(READY, 4, tok=200))
        put("decode", "raw" + sfx,
            p + raw(7, 0, b"\x08\x01") + raw(7, 2, b"\xff\xff") + raw(9, 0, b"")
            + bytes([3, 4]) + b"KVRN" + RESYNC)


# ---- cluster: cluster files ----
def cluster_seeds():
    files = sorted(glob.glob(os.path.join(ROOT, "deploy", "local", "*.yaml")))
    files += [os.path.join(ROOT, "deploy", "k8s", "base", "cluster.yaml")]
    for f in files:
        if os.path.exists(f):
            put("cluster", os.path.basename(os.path.dirname(f)) + "-" + os.path.basename(f),
                open(f, "rb").read())
    base = (b"cluster: c\nmodel: m\nrouter:\n  client: tcp://127.0.0.1:1\n  node: tcp://127.0.0.1:2\n")
    put("cluster", "curve.yaml", base + b"auth: curve\nkeys: keys\nnodes:\n  - name: d\n"
        b"    role: decode\n    pool_blocks: 8\n    restart: always\n    metrics_port: 9400\n")
    put("cluster", "full.yaml", base + b"block_size: 32\ntimeouts:\n  lease_ms: 5\n"
        b"  heartbeat_ms: 100\nthresholds:\n  local_prefill_tokens: 4\nlimits:\n"
        b"  max_queue: 3\n  reservation: whole\n  prefill_chunk_tokens: 64\n"
        b"nodes:\n  - name: p\n    role: prefill\n    device: cuda:1\n    transport: verbs\n"
        b"    require_rdma: true\n  - {name: d, role: decode, pool_bytes: 1048576, host: h}\n")
    put("cluster", "dup.yaml", base + b"nodes:\n  - name: a\n    role: decode\n  - name: a\n"
        b"    role: prefill\n")
    put("cluster", "anchors.yaml", b"x: &a {role: decode}\n" + base
        + b"nodes:\n  - <<: *a\n    name: d\n  - *a\n")


# ---- model: 0x00 + safetensors, 0x01 + config.json ----
def model_seeds():
    st = open(os.path.join(DATA, "model", "model.safetensors"), "rb").read()
    cfg = open(os.path.join(DATA, "model", "config.json"), "rb").read()
    put("model", "safetensors-tiny", b"\x00" + st)
    hl = int.from_bytes(st[:8], "little")
    put("model", "safetensors-header-only", b"\x00" + st[:8 + hl])
    hdr = b'{"a": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}, ' \
          b'"__metadata__": {"format": "pt"}}'
    put("model", "safetensors-small", b"\x00" + len(hdr).to_bytes(8, "little") + hdr + bytes(12))
    put("model", "config-tiny", b"\x01" + cfg)
    put("model", "config-gqa", b"\x01" + cfg.replace(b'"num_key_value_heads": 1',
                                                      b'"num_key_value_heads": 2'))
    put("model", "config-huge", b"\x01" + cfg.replace(b'"vocab_size": 320',
                                                       b'"vocab_size": 1e300'))


# ---- tokenizer: 0x80 + tokenizer.json, or selector + text ----
def tokenizer_seeds():
    for name in ("model/tokenizer.json", "tokenizer-sp.json", "tokenizer-unigram.json"):
        put("tokenizer", "load-" + os.path.basename(name.replace("/", "-")),
            b"\x80" + open(os.path.join(DATA, name), "rb").read())
    texts = [b"", b"Hello, world!", "caf\u00e9 \U0001F600 \u2581x".encode(), b"\xff\xfe\xc3",
             b"<s>hello</s> <unk>", b"<|begin_of_text|>a<|end_of_text|>", b"  \n\t  ab ba a",
             b"1234567890 it's we'll", b"\x00\x01 nul"]
    for i, t in enumerate(texts):
        for sel in (0, 1, 2, 4):
            put("tokenizer", "text-%d-%d" % (i, sel), bytes([sel]) + t)


if __name__ == "__main__":
    decode_seeds()
    cluster_seeds()
    model_seeds()
    tokenizer_seeds()
    sys.exit(0)
