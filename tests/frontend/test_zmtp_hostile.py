"""test_zmtp_hostile.py - kvrail-frontend's direct router link (libkvrail-
client's zmtp.c, --router-link direct) against fake "routers" that break
ZMTP on purpose: each a TCP server in this test that answers every
connection the same broken way, while a completion request waits on the
frontend.  For every one the frontend must answer the request with a clear
error naming what was wrong (and answer a heartbeat PING with its PONG) (5xx, the link's reason in the message), keep
serving (/health), and not grow (RSS after all of them within a bound of
RSS after the first: the link's buffers are bounded, nothing is kept per
broken connection).

The same for the link's CURVE (zmtp_curve.c): fake CURVE "routers" that
do the server's side of CurveZMQ in this test (libsodium through ctypes)
and break it on purpose: a WELCOME of the wrong size, a WELCOME sealed by
another key than KVRAIL_ROUTER_KEY's, a READY box that does not open, a
MESSAGE whose nonce repeats or goes down (a replay), a MESSAGE box that
does not open; and one that answers a heartbeat PING sealed, whose PONG
must come back sealed with the PING's context.  Each drops the link with
the reason named in the 5xx.  With keys that cannot be read, the frontend
refuses to start naming the file, whatever the link.  The real router
over the direct link: frontend_openai (NULL) and auth_curve (CURVE).
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cluster_lib as cl  # noqa: E402
from cluster_lib import Fail, check  # noqa: E402


def greeting(mech=b"NULL", minor_flag=0x7F, major=3):
    return (b"\xff" + b"\0" * 8 + bytes([minor_flag, major, 1]) + mech.ljust(20, b"\0")
            + b"\0" + b"\0" * 31)


def command(body):
    if len(body) <= 255:
        return bytes([0x04, len(body)]) + body
    return bytes([0x06]) + struct.pack(">Q", len(body)) + body


def ready(sock_type=b"ROUTER"):
    return command(b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(sock_type))
                   + sock_type)


HANDSHAKE = greeting() + ready()

# name: (bytes sent at once, bytes sent once the frontend has written its
# request, text the error must carry)
SCENARIOS = [
    ("http", b"HTTP/1.1 400 Bad Request\r\n\r\n", None, "not a ZeroMQ socket"),
    ("zmtp1", b"\xff" + b"\0" * 8 + b"\x00" + b"\0" * 54, None, "ZMTP 1.0"),
    ("zmtp2", greeting(major=1), None, "speaks ZMTP 1.x"),
    ("curve", greeting(b"CURVE"), None, "CURVE mechanism"),
    ("pub", greeting() + ready(b"PUB"), None, "is a PUB socket"),
    ("error", greeting() + command(b"\x05ERROR\x07go away"), None,
     "refused the connection: go away"),
    ("no-ready", greeting() + bytes([0x00, 3]) + b"abc", None, "no READY"),
    ("big-ready", greeting() + bytes([0x06]) + struct.pack(">Q", 1 << 20), None,
     "command of 1048576 bytes exceeds"),
    ("huge-frame", HANDSHAKE, bytes([0x02]) + struct.pack(">Q", 1 << 40),
     "frame of 1099511627776 bytes exceeds"),
    ("flags", HANDSHAKE, bytes([0xF0, 1, 0]), "reserved bits"),
    ("parts", HANDSHAKE, bytes([0x01, 1, 0]) * 9 + bytes([0x00, 1, 0]), "more than 8 parts"),
    ("cmd-in-msg", HANDSHAKE, bytes([0x01, 1, 0]) + command(b"\x04PING\0\0"),
     "command inside a message"),
    ("bad-envelope", HANDSHAKE, bytes([0x01, 3]) + b"abc" + bytes([0x00, 0]),
     "envelope is 3 bytes"),
    # 50,000 bad messages in a burst: each refused, nothing kept
    ("flood", HANDSHAKE, (bytes([0x01, 3]) + b"abc" + bytes([0x00, 0])) * 50000,
     "envelope is 3 bytes"),
    # a 15 MiB frame, within the limit: held while it arrives, refused whole
    # (its one part is no envelope), the buffer bounded by the limit
    ("big-frame", HANDSHAKE, bytes([0x02]) + struct.pack(">Q", 15 << 20) + b"x" * (15 << 20),
     "envelope is 15728640 bytes, want 16"),
    # a heartbeat PING (RFC 37: TTL, context): answered with PONG and the
    # same context; the request itself is never answered
    ("ping", HANDSHAKE, command(b"\x04PING\x00\x0aabc"), "does not answer"),
]


# --- CURVE: the server side of CurveZMQ (RFC 26), libsodium via ctypes ---
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(b):
    out = ""
    for i in range(0, len(b), 4):
        v = int.from_bytes(b[i:i + 4], "big")
        out += "".join(Z85[(v // 85 ** k) % 85] for k in range(4, -1, -1))
    return out


def listen_local():
    """A listening socket on 127.0.0.1 and a free port: (socket, port)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    return ls, ls.getsockname()[1]


class Sodium:
    def __init__(self):
        self.lib = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
        check(self.lib.sodium_init() >= 0, "sodium_init failed")

    def keypair(self):
        pk, sk = ctypes.create_string_buffer(32), ctypes.create_string_buffer(32)
        self.lib.crypto_box_keypair(pk, sk)
        return pk.raw, sk.raw

    def box(self, m, nonce, pk, sk):
        c = ctypes.create_string_buffer(len(m) + 16)
        check(self.lib.crypto_box_easy(c, m, ctypes.c_ulonglong(len(m)), nonce, pk, sk) == 0,
              "crypto_box_easy")
        return c.raw

    def open(self, c, nonce, pk, sk):
        m = ctypes.create_string_buffer(max(len(c) - 16, 1))
        if self.lib.crypto_box_open_easy(m, c, ctypes.c_ulonglong(len(c)), nonce, pk, sk) != 0:
            return None
        return m.raw[:len(c) - 16]


def frame(body, flags=0):
    if len(body) <= 255:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            raise OSError("closed")
        b += got
    return b


def recv_frame(s):
    flags = recv_exact(s, 1)[0]
    n = struct.unpack(">Q", recv_exact(s, 8))[0] if flags & 2 else recv_exact(s, 1)[0]
    return flags, recv_exact(s, n)


class CurveFakeRouter:
    """The server's side of a CURVE handshake with the frontend's direct
    link, broken as `mode` says; `seen_pong`: the PONG it opened (mode
    "ping")."""

    def __init__(self, na, server_pk, server_sk, mode):
        self.na, self.pk, self.sk, self.mode = na, server_pk, server_sk, mode
        self.ls, self.port = listen_local()
        self.conns = 0
        self.seen_pong = None
        self.initiate_ok = False
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self.one, args=(s,), daemon=True).start()

    def message(self, nonce, data, flags, key):
        n = b"CurveZMQMESSAGES" + struct.pack(">Q", nonce)
        return frame(b"\x07MESSAGE" + struct.pack(">Q", nonce) +
                     self.na.box(bytes([flags]) + data, n, *key))

    def one(self, s):
        na, mode = self.na, self.mode
        try:
            s.settimeout(20)
            s.sendall(greeting(b"CURVE"))
            g = recv_exact(s, 64)
            check(g[12:17] == b"CURVE", "the client's greeting names %r" % g[12:32])
            flags, hello = recv_frame(s)
            check(flags == 4 and len(hello) == 200 and hello[:8] == b"\x05HELLO\x01\x00",
                  "the client's HELLO: flags %d, %d bytes" % (flags, len(hello)))
            cn_pub = hello[80:112]
            check(na.open(hello[120:200], b"CurveZMQHELLO---" + hello[112:120], cn_pub,
                          self.sk) == b"\0" * 64, "the client's HELLO box does not open")
            s_pub, s_sec = na.keypair()  # S'
            wn = os.urandom(16)
            cookie = os.urandom(96)
            sealer = self.sk if mode != "welcome-box" else na.keypair()[1]
            welcome = (b"\x07WELCOME" + wn +
                       na.box(s_pub + cookie, b"WELCOME-" + wn, cn_pub, sealer))
            if mode == "welcome-size":
                welcome = welcome[:-1]
            s.sendall(frame(welcome, 4))
            flags, init = recv_frame(s)
            check(flags & 4 and init[:9] == b"\x08INITIATE" and init[9:105] == cookie,
                  "the client's INITIATE")
            plain = na.open(init[113:], b"CurveZMQINITIATE" + init[105:113], cn_pub, s_sec)
            check(plain is not None, "the client's INITIATE box does not open")
            vouch = na.open(plain[48:128], b"VOUCH---" + plain[32:48], plain[:32], s_sec)
            check(vouch == cn_pub + self.pk, "the client's vouch")
            check(b"\x0bSocket-Type\x00\x00\x00\x06DEALER" in plain[128:],
                  "the client's metadata: %r" % plain[128:])
            self.initiate_ok = True
            meta = b"\x0bSocket-Type\x00\x00\x00\x06ROUTER"
            rkey = (cn_pub, s_sec) if mode != "ready-box" else (cn_pub, na.keypair()[1])
            s.sendall(frame(b"\x05READY" + struct.pack(">Q", 1) +
                            na.box(meta, b"CurveZMQREADY---" + struct.pack(">Q", 1), *rkey), 4))
            key = (cn_pub, s_sec)
            if mode == "ping":  # a heartbeat PING, sealed: its PONG must come sealed
                s.sendall(self.message(2, b"\x04PING\x00\x0aabc", 2, key))
            else:
                recv_frame(s)  # the request's first part
            # a one-part message (the client refuses it, the link lives), then the fault
            ok = self.message(2, b"x", 0, key)
            if mode == "replay":
                s.sendall(ok + ok)
            elif mode == "nonce-down":
                s.sendall(self.message(5, b"x", 0, key) + self.message(3, b"x", 0, key))
            elif mode == "message-box":
                bad = bytearray(self.message(2, b"x", 0, key))
                bad[-1] ^= 1
                s.sendall(bytes(bad))
            while True:
                flags, body = recv_frame(s)
                if mode == "ping" and body[:8] == b"\x07MESSAGE":
                    p = na.open(body[16:], b"CurveZMQMESSAGEC" + body[8:16], cn_pub, s_sec)
                    if p is not None and p[0] == 2:
                        self.seen_pong = p[1:]
        except (OSError, Fail):
            pass
        finally:
            s.close()

    def close(self):
        self.ls.close()


# name: (mode, text the error must carry)
CURVE_SCENARIOS = [
    ("curve-welcome-size", "welcome-size", "a WELCOME of 167 bytes"),
    ("curve-welcome-box", "welcome-box",
     "does not match KVRAIL_ROUTER_KEY: WELCOME box failed to open"),
    ("curve-ready-box", "ready-box", "READY box failed to open"),
    ("curve-replay", "replay", "nonce 2 after 2 (a replay"),
    ("curve-nonce-down", "nonce-down", "nonce 3 after 5 (a replay"),
    ("curve-message-box", "message-box", "MESSAGE box failed to open"),
    ("curve-ping", "ping", "does not answer"),
]


class FakeRouter:
    """Answers every connection with `first`, then (after reading at least
    one byte past our greeting and READY: the request) `later`, then keeps
    reading until the peer leaves."""

    def __init__(self, first, later):
        self.first, self.later = first, later
        self.ls, self.port = listen_local()
        self.conns = 0
        self.seen = b""  # what the frontend wrote after its greeting and READY
        self.stop = False
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while not self.stop:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self.one, args=(s,), daemon=True).start()

    def one(self, s):
        try:
            s.settimeout(20)
            s.sendall(self.first)
            if self.later is not None:
                got = b""
                while len(got) < 64 + 1:  # the greeting, then anything (READY, the request)
                    b = s.recv(65536)
                    if not b:
                        return
                    got += b
                s.sendall(self.later)
                self.seen += got
            while True:
                b = s.recv(65536)
                if not b:
                    break
                self.seen = (self.seen + b)[-65536:]
        except OSError:
            pass
        finally:
            s.close()

    def close(self):
        self.stop = True
        self.ls.close()


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def healthy(base, fe):
    check(fe.poll() is None, "the frontend exited (rc %s)" % fe.poll())
    try:
        return urllib.request.urlopen(base + "/health", timeout=2).status == 200
    except OSError:
        return False


def complete(base):
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frontend", required=True)
    a = ap.parse_args()
    work = cl.workdir("zmtp-hostile")
    # CURVE keys: the fake routers' pair S, the frontend's pair C, as
    # kvrail keygen writes them
    na = Sodium()
    s_pk, s_sk = na.keypair()
    c_pk, c_sk = na.keypair()
    rpub, ckey = os.path.join(work, "router.pub"), os.path.join(work, "client.key")
    with open(rpub, "w") as f:
        f.write(z85(s_pk) + "\n")
    fd = os.open(ckey, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(z85(c_pk) + "\n" + z85(c_sk) + "\n")
    curve_env = dict(os.environ, KVRAIL_ROUTER_KEY=rpub, KVRAIL_CLIENT_KEY=ckey)
    plan = [(name, lambda f=first, l=later: FakeRouter(f, l), want, None)
            for name, first, later, want in SCENARIOS]
    plan += [(name, lambda m=mode: CurveFakeRouter(na, s_pk, s_sk, m), want, curve_env)
             for name, mode, want in CURVE_SCENARIOS]
    # a NULL router and a client with keys: refused, never met in the clear
    plan.append(("curve-keys-null-router", lambda: FakeRouter(HANDSHAKE, None),
                 "uses the NULL mechanism, not CURVE", curve_env))
    rss0 = None
    for name, make, want, env in plan:
        fr = make()
        port = cl.free_port()
        base = "http://127.0.0.1:%d" % port
        log = os.path.join(work, "frontend-%s.log" % name)
        # the first by name: localhost's addresses (::1 first, where it has
        # one) are tried in turn until 127.0.0.1, where the fake listens
        host = "localhost" if rss0 is None else "127.0.0.1"
        fe = cl.spawn([a.frontend, "--router", "tcp://%s:%d" % (host, fr.port), "--model-name",
                       "m", "--listen", "127.0.0.1:%d" % port, "--router-link", "direct"],
                      stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        try:
            cl.wait_for("the frontend's /health", lambda: healthy(base, fe), timeout=20)
            status, text = complete(base)
            print("%s: %d %s" % (name, status, text.strip()[:300]))
            check(status >= 500, "%s: status %d, want an error: %s" % (name, status, text))
            msg = json.loads(text)["error"]["message"]
            if want:
                check(want in msg, "%s: the error '%s' does not say '%s'" % (name, msg, want))
            check(fe.poll() is None, "%s: the frontend died" % name)
            check(urllib.request.urlopen(base + "/health", timeout=5).status == 200,
                  "%s: /health after the error" % name)
            check(fr.conns >= 1, "%s: the frontend never connected" % name)
            if name in ("http", "huge-frame"):
                # a second request on the same frontend, over retried
                # connections (one broken before, one after the handshake)
                status2, text2 = complete(base)
                msg2 = json.loads(text2)["error"]["message"]
                check(status2 >= 500 and want in msg2 and fe.poll() is None,
                      "%s: second request %d %s" % (name, status2, text2))
            # the PONG went out when the PING came, before the request's
            # error; the fake's thread reads it on its own time: poll for it
            if name == "ping":
                cl.wait_for("the PONG with the PING's context",
                            lambda: b"\x04\x08\x04PONGabc" in fr.seen, timeout=20)
            if name == "curve-ping":
                cl.wait_for("a sealed PONG", lambda: fr.seen_pong is not None, timeout=20)
                check(fr.seen_pong == b"\x04PONGabc",
                      "curve-ping: no sealed PONG with the PING's context: %r" % fr.seen_pong)
            if name.startswith("curve-") and name not in ("curve-welcome-size",
                                                          "curve-welcome-box",
                                                          "curve-keys-null-router"):
                check(fr.initiate_ok, "%s: the client's INITIATE was not right" % name)
            rss = rss_kb(fe.pid)
            print("%s: %d connections, RSS %d KiB" % (name, fr.conns, rss))
            if rss0 is None:
                rss0 = rss
            # one input buffer of a frame at most (16 MiB) may be held; no more
            check(rss < rss0 + 32 * 1024,
                  "%s: RSS %d KiB grew past %d + 32 MiB" % (name, rss, rss0))
        finally:
            cl.stop_group(fe)
            fr.close()
        with open(log) as f:
            check("router link: direct" in f.read(), "%s: the frontend did not log its link" % name)
    # CURVE keys that cannot be read: the frontend refuses to start, naming
    # the file, whichever link it has (never a plain connection instead)
    env = dict(os.environ, KVRAIL_ROUTER_KEY="/nonexistent/router.pub",
               KVRAIL_CLIENT_KEY="/nonexistent/client.key")
    argv = [a.frontend, "--router", "tcp://127.0.0.1:1", "--model-name", "m", "--listen",
            "127.0.0.1:%d" % cl.free_port()]
    for link in ("direct", "auto", "zmq"):
        r = cl.run(argv + ["--router-link", link], timeout=20, env=env)
        out = r.stdout + r.stderr
        check(r.returncode != 0 and "/nonexistent/router.pub" in out,
              "unreadable CURVE keys, --router-link %s: rc %d, output %s" % (
                  link, r.returncode, out))
        print("unreadable CURVE keys, --router-link %s: refused (%s)" % (
            link, out.strip().splitlines()[0][:200]))
    print("PASS")


if __name__ == "__main__":
    cl.run_main(main)
