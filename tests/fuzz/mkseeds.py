#!/usr/bin/env python3
"""mkseeds.py - writes the seed corpora of the decode, cluster, model,
tokenizer, zmtp and openai fuzz targets (tests/fuzz/corpus/<target>/; the
router's come from mkseeds.c).  Each seed is one scenario or file named for what it exercises;
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


# ---- zmtp: config byte + records (fuzz_zmtp.c) ----
def zlen(b):
    return (bytes([len(b)]) if len(b) < 255 else b"\xff" + len(b).to_bytes(2, "little")) + b


def zraw(b, chunk=0):
    return bytes([chunk << 3]) + zlen(b)


def zgreet(chunk=0):
    return bytes([1 | chunk << 3])


def zready(props=b"\x0bSocket-Type\x00\x00\x00\x06ROUTER", chunk=0):
    return bytes([2 | chunk << 3]) + zlen(props)  # NULL: READY's properties


def zwelcome(flip=0, chunk=0):
    return bytes([2 | chunk << 3, flip])  # CURVE


def zerror(reason, chunk=0):
    return bytes([3 | chunk << 3]) + zlen(reason)  # NULL


def zcready(meta=b"\x0bSocket-Type\x00\x00\x00\x06ROUTER", step=1, chunk=0):
    return bytes([3 | chunk << 3, step]) + zlen(meta)  # CURVE


def zframe(flags, body, step=1, curve=False, chunk=0):
    """NULL: flags as on the wire; CURVE: ZMTP's MORE 1 and COMMAND 4 become
    the box's MORE 1 and COMMAND 2 (other bits as given)"""
    if curve:
        flags = (flags & ~4) | (2 if flags & 4 else 0)
    return bytes([4 | chunk << 3, flags]) + zlen(body) + (bytes([step]) if curve else b"")


def zsend(*lens):
    return bytes([5, len(lens)]) + bytes(lens)


def zbig(flags, units, count, curve=False, chunk=0):
    """count frames of units x 512 bytes in one piece (CURVE: a nonce step of 1 each)"""
    if curve:
        flags = (flags & ~4) | (2 if flags & 4 else 0)
    return bytes([7 | chunk << 3, flags, units, count - 1]) + (b"\x01" * count if curve else b"")


ZCLOSE, ZRESET, ZDRIVE = bytes([6]), bytes([6 | 1 << 3]), b"\x00\x00"  # ZDRIVE: 0 raw bytes
ENVELOPE = bytes.fromhex("4b56523101000003") + (7).to_bytes(8, "big")  # magic, version, method, id


def zmtp_seeds():
    sock = b"\x0bSocket-Type\x00\x00\x00\x06"
    for mf in range(4):
        for curve in (0, 1):
            cfg = bytes([curve | mf << 1])
            hs = (zgreet() + zwelcome() + zcready()) if curve else (zgreet() + zready())
            def fr(flags, body, step=1):
                return zframe(flags, body, step, bool(curve))
            msg = fr(1, ENVELOPE) + fr(0, bytes(range(40)))
            tag = "curve" if curve else "null"
            put("zmtp", "%s-%d-open" % (tag, mf), cfg + hs + msg + zsend(2, 3) + msg)
            if mf == 3:
                big = bytes((i * 7) & 0xff for i in range(3000))
                put("zmtp", "%s-3-long-frame" % tag, cfg + hs + fr(1, ENVELOPE) + fr(0, big))
                put("zmtp", "%s-3-queued-before-open" % tag,
                    bytes([curve | 6 | 8]) + zsend(1, 200) + hs + msg + zsend(3, 1, 1))
    for curve in (0, 1):
        cfg = bytes([curve | 4])
        tag = "curve" if curve else "null"
        hs = (zgreet() + zwelcome() + zcready()) if curve else (zgreet() + zready())
        fr = lambda flags, body, step=1: zframe(flags, body, step, bool(curve))
        put("zmtp", tag + "-ping", cfg + hs + fr(4, b"\x04PING\x00\x0a" + b"ctx1") + ZDRIVE)
        put("zmtp", tag + "-nine-parts", cfg + hs + b"".join(fr(1, b"p") for _ in range(9)) + fr(0, b"x"))
        put("zmtp", tag + "-command-in-message", cfg + hs + fr(1, ENVELOPE) + fr(4, b"\x04PING\x00\x00"))
        put("zmtp", tag + "-split", cfg + bytes([1 | 1 << 3]) +
            (zwelcome(chunk=5) + zcready(chunk=3) if curve else zready(chunk=3)) +
            zframe(1, ENVELOPE, 1, bool(curve), chunk=7) + zframe(0, bytes(300), 1, bool(curve), chunk=31))
        put("zmtp", tag + "-closed-mid-message", cfg + hs + fr(1, ENVELOPE) + ZCLOSE + ZDRIVE)
        put("zmtp", tag + "-whole-then-close", cfg + hs + fr(0, ENVELOPE) + ZCLOSE)
        put("zmtp", tag + "-reset", cfg + hs + fr(1, ENVELOPE) + ZRESET + zsend(1, 1))
        big = bytes([curve | 6])  # max_frame 100000: the buffer grows from 64 KiB
        put("zmtp", tag + "-big-whole", big + hs + zbig(0, 100, 3, bool(curve)) + zbig(1, 60, 2, bool(curve), chunk=3)
            + fr(0, b"end"))
        put("zmtp", tag + "-big-over-limit", big + hs + zbig(0, 255, 1, bool(curve)))
        put("zmtp", tag + "-big-message", big + hs + zbig(1, 100, 3, bool(curve)))
        put("zmtp", tag + "-greeting-zmtp1", cfg + zraw(b"\xff" + bytes(8) + b"\x00"))
        put("zmtp", tag + "-greeting-v2", cfg + zraw(b"\xff" + bytes(8) + b"\x7f\x02"))
        put("zmtp", tag + "-not-zmq", cfg + zraw(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
        other = b"NULL" if curve else b"CURVE"
        put("zmtp", tag + "-other-mechanism",
            cfg + zraw(b"\xff" + bytes(8) + b"\x7f\x03\x01" + other + bytes(52 - len(other))))
    # NULL: handshake and framing faults
    cfg = b"\x04"
    hs = zgreet() + zready()
    put("zmtp", "null-error", cfg + zgreet() + zerror(b"no thanks"))
    put("zmtp", "null-error-empty", cfg + zgreet() + zraw(b"\x04\x06\x05ERROR"))
    put("zmtp", "null-ready-pub", cfg + zgreet() + zready(sock[:-1] + b"\x03PUB"))
    put("zmtp", "null-ready-no-type", cfg + zgreet() + zready(b"\x08Identity\x00\x00\x00\x00"))
    put("zmtp", "null-ready-bad-len", cfg + zgreet() + zready(sock[:-1] + b"\x60ROUTER"))
    put("zmtp", "null-ready-long", cfg + zgreet() + zready(b"\x03Foo\x00\x00\x01\x00" + bytes(256) + sock + b"DEALER"))
    put("zmtp", "null-not-ready", cfg + zgreet() + zraw(b"\x04\x06\x05HELLO"))
    put("zmtp", "null-data-first", cfg + zgreet() + zraw(b"\x00\x03abc"))
    put("zmtp", "null-reserved-flags", cfg + hs + zframe(0x80, b"x"))
    put("zmtp", "null-huge-frame", cfg + hs + zraw(b"\x02\x00\x00\x01\x00\x00\x00\x00\x00"))
    put("zmtp", "null-long-small", cfg + hs + zframe(8, b"tiny"))
    put("zmtp", "null-frame-over-limit", b"\x00" + hs + zframe(0, bytes(17)))
    put("zmtp", "null-empty-command", cfg + hs + zraw(b"\x04\x00"))
    put("zmtp", "null-pong-unasked", cfg + hs + zframe(4, b"\x04PONG"))
    put("zmtp", "null-flood", b"\x02" + hs + b"".join(zframe(0, bytes([i]) * 200) for i in range(30)))
    # CURVE: handshake and MESSAGE faults
    cfg = b"\x05"
    hs = zgreet() + zwelcome() + zcready()
    put("zmtp", "curve-welcome-bad-box", cfg + zgreet() + zwelcome(flip=100))
    put("zmtp", "curve-welcome-short", cfg + zgreet() + zraw(b"\x04\xa7\x07WELCOME" + bytes(159)))
    put("zmtp", "curve-error-after-initiate", cfg + zgreet() + zwelcome() +
        zraw(b"\x04\x0a\x05ERROR\x03400"))
    put("zmtp", "curve-ready-pub", cfg + zgreet() + zwelcome() + zcready(sock[:-1] + b"\x03PUB"))
    put("zmtp", "curve-ready-short", cfg + zgreet() + zwelcome() + zraw(b"\x04\x08\x05READY\x00\x00"))
    put("zmtp", "curve-ready-garbage-box", cfg + zgreet() + zwelcome() + zraw(b"\x04\x30\x05READY" + bytes(42)))
    put("zmtp", "curve-replay", cfg + hs + zframe(0, b"a", 1, True) + zframe(0, b"b", 0, True))
    put("zmtp", "curve-nonce-jump", cfg + hs + zframe(0, b"a", 9, True) + zframe(0, b"b", 255, True))
    put("zmtp", "curve-more-outside", cfg + hs + zframe(0x10, b"a", 1, True))
    put("zmtp", "curve-unknown-command", cfg + hs + zframe(4, b"\x05HELLO", 1, True) + zframe(0, b"a", 1, True))
    put("zmtp", "curve-reserved-inside", cfg + hs + bytes([4, 4]) + zlen(b"a") + b"\x01")
    put("zmtp", "curve-plain-after-open", cfg + hs + zraw(b"\x00\x03abc"))
    put("zmtp", "curve-not-message", cfg + hs + zraw(b"\x00\x21\x07MASSAGE" + bytes(25)))
    put("zmtp", "curve-message-short", cfg + hs + zraw(b"\x00\x10\x07MESSAGE" + bytes(8)))
    put("zmtp", "curve-over-limit", b"\x01" + hs + zframe(0, bytes(40), 1, True))
    put("zmtp", "curve-flood", b"\x03" + hs + b"".join(zframe(1 if i % 4 else 0, bytes([i]) * 100, 1, True) for i in range(40)))


# ---- openai: mode byte (bit 0 chat, 1 no context length, 2 a max_tokens
# bound, 3 n at most 4) + the request body (fuzz_openai.c) ----
def openai_seeds():
    comp = [
        b'{"model": "fuzz-model", "prompt": "Hello"}',
        b'{"model": "fuzz-model", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 8, "stream": true, '
        b'"stream_options": {"include_usage": true}}',
        b'{"model": "fuzz-model", "prompt": [1, 2, 3], "logprobs": 3, "echo": false, "best_of": 1}',
        b'{"model": "fuzz-model", "prompt": [[1, 2], [3]], "temperature": 0.5, "top_p": 0.9, '
        b'"top_k": 40, "min_p": 0.05, "seed": 7}',
        b'{"model": "fuzz-model", "prompt": "x", "stop": ["\\n", "END"], "stop_token_ids": [2, 3], '
        b'"ignore_eos": true, "user": "u1"}',
        b'{"model": "fuzz-model", "prompt": "x", "logit_bias": {"5": 100, "17": -100.0}, '
        b'"presence_penalty": 1.5, "frequency_penalty": -2, "repetition_penalty": 1.1}',
        b'{"model": "fuzz-model", "prompt": "x", "stop": "s", "suffix": null, "n": null}',
        b'{"model": "fuzz-model", "prompt": "x", "max_tokens": 1e300, "n": -1, "seed": 1.5}',
        b'{"model": "fuzz-model", "prompt": "x", "best_of": 3, "echo": true}',
        b'{"model": "other", "prompt": "x"}',
        b'{"model": "fuzz-model", "prompt": "a\u0000b"}',
        b'{"model": "fuzz-model", "prompt": [1, "a"], "stop": [1]}',
        b'{"model": "fuzz-model", "prompt": "\ud83d\ude00 \xc3\xa9 \xff\xfe", "stop": ["\xed\xa0\x80"]}',
        b'{"model": "fuzz-model", "prompt": "x", "logit_bias": {"01": 1, "1": 2}}',
        b'{"model": "fuzz-model", "prompt": "x", "frobnicate": 1}',
        b'{"model": "fuzz-model", "prompt": ' + b"[" * 100 + b"]" * 100 + b'}',
        b'[1, 2, 3]',
        b'{"model\u0000x": "fuzz-model", "prompt": "x"}',
        b'{"model": "fuzz-model", "prompt": "x", "stream_options": {"include_usage": 1}, "stream": false}',
        b'{"model": "fuzz-model", "prompt": [' + b", ".join(b'"p"' for _ in range(65)) + b']}',
        b'{"model": "fuzz-model", "prompt": [2147483647, 2147483648, -1, 9223372036854775808]}',
    ]
    chat = [
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": "Hi"}]}',
        b'{"model": "fuzz-model", "messages": [{"role": "system", "content": "Be brief."}, '
        b'{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}, '
        b'{"role": "assistant", "content": null}], "logprobs": true, "top_logprobs": 5, '
        b'"max_completion_tokens": 9}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": "x"}, '
        b'{"role": "system", "content": "late"}]}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": "x"}], '
        b'"chat_template_kwargs": {"enable_thinking": true}, "n": 3, "stream": true}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": 5}]}',
        b'{"model": "fuzz-model", "messages": [{"content": "x"}]}',
        b'{"model": "fuzz-model", "messages": [], "top_logprobs": 3}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": "x"}], "prompt": "y"}',
        b'{"model": "fuzz-model", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
        b'{"model": "fuzz-model", "messages": [{"role": "\xff", "content": "' + b"w " * 300 + b'"}]}',
    ]
    for i, b in enumerate(comp):
        put("openai", "completion-%02d" % i, bytes([0]) + b)
    # regressions: a member given twice overflowed the request's stop (16),
    # stop_token_ids (32) and logit_bias (300) arrays and leaked the first
    # prompt's (and an unknown member was ignored when null)
    m = b'{"model": "fuzz-model", "prompt": "x", '
    put("openai", "regress-dup-stop", b"\0" + m + b'"stop": [' + b",".join(b'"%d"' % i for i in range(16))
        + b'], "stop": ["q"]}')
    put("openai", "regress-dup-prompt", b"\0" + m + b'"prompt": [1, 2]}')
    put("openai", "regress-dup-stop-token-ids", b"\0" + m + b'"stop_token_ids": ['
        + b",".join(b"%d" % i for i in range(32)) + b'], "stop_token_ids": [100000, 1]}')
    bias = [b'{' + b",".join(b'"%d": 1' % i for i in range(k, k + 300)) + b'}' for k in (0, 300)]
    put("openai", "regress-dup-logit-bias", b"\0" + m + b'"logit_bias": ' + bias[0] + b', "logit_bias": '
        + bias[1] + b'}')
    put("openai", "unknown-null", b"\1" + b'{"model": "fuzz-model", "messages": '
        b'[{"role": "user", "content": "x"}], "frobnicate": null}')
    for i, b in enumerate(chat):
        put("openai", "chat-%02d" % i, bytes([1]) + b)
    put("openai", "completion-no-context", b"\x0e" + comp[1])
    put("openai", "chat-no-context-bounded", b"\x07" + chat[0])
    put("openai", "chat-n4", b"\x09" + chat[3])
    deep = b"[" * 500 + b"]" * 500  # the template prints it: its nesting bound, not the stack
    put("openai", "chat-deep-text", b"\x01" + b'{"model": "fuzz-model", "messages": [{"role": "user", '
        b'"content": [{"type": "text", "text": ' + deep + b'}]}], "chat_template_kwargs": '
        b'{"enable_thinking": ' + deep + b'}}')


if __name__ == "__main__":
    decode_seeds()
    cluster_seeds()
    model_seeds()
    tokenizer_seeds()
    zmtp_seeds()
    openai_seeds()
    sys.exit(0)
