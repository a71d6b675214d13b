"""test_zmtp_hostile.py - kvrail-frontend's direct router link (libkvrail-
client's zmtp.c, --router-link direct) against fake "routers" that break
ZMTP on purpose: each a TCP server in this test that answers every
connection the same broken way, while a completion request waits on the
frontend.  For every one the frontend must answer the request with a clear
error naming what was wrong (and answer a heartbeat PING with its PONG) (5xx, the link's reason in the message), keep
serving (/health), and not grow (RSS after all of them within a bound of
RSS after the first: the link's buffers are bounded, nothing is kept per
broken connection).  Then: with CURVE keys set the frontend refuses
--router-link direct at start-up, naming --router-link zmq, and its
default (auto) takes libzmq's link.  The real router over
the direct link is frontend_openai's part (the default link).
"""
import argparse
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
from cluster_lib import check  # noqa: E402


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
    # (one part, not two), the buffer bounded by the limit
    ("big-frame", HANDSHAKE, bytes([0x02]) + struct.pack(">Q", 15 << 20) + b"x" * (15 << 20),
     "message has 1 frames"),
    # a heartbeat PING (RFC 37: TTL, context): answered with PONG and the
    # same context; the request itself is never answered
    ("ping", HANDSHAKE, command(b"\x04PING\x00\x0aabc"), "does not answer"),
]


class FakeRouter:
    """Answers every connection with `first`, then (after reading at least
    one byte past our greeting and READY: the request) `later`, then keeps
    reading until the peer leaves."""

    def __init__(self, first, later):
        self.first, self.later = first, later
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
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
    rss0 = None
    for name, first, later, want in SCENARIOS:
        fr = FakeRouter(first, later)
        port = cl.free_port()
        base = "http://127.0.0.1:%d" % port
        log = os.path.join(work, "frontend-%s.log" % name)
        # the first by name: localhost's addresses (::1 first, where it has
        # one) are tried in turn until 127.0.0.1, where the fake listens
        host = "localhost" if rss0 is None else "127.0.0.1"
        fe = cl.spawn([a.frontend, "--router", "tcp://%s:%d" % (host, fr.port), "--model-name",
                       "m", "--listen", "127.0.0.1:%d" % port, "--router-link", "direct"],
                      stdout=open(log, "w"), stderr=subprocess.STDOUT)
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
            if name == "ping":
                check(b"\x04\x08\x04PONGabc" in fr.seen,
                      "ping: no PONG with the PING's context: %r" % fr.seen[-200:])
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
    # CURVE keys set: --router-link direct is refused at start-up, naming the
    # way out; the default (auto) takes libzmq's link, which reads the keys
    # (auth_curve serves through it on a real CURVE cluster)
    env = dict(os.environ, KVRAIL_ROUTER_KEY="/nonexistent/router.pub",
               KVRAIL_CLIENT_KEY="/nonexistent/client.key")
    argv = [a.frontend, "--router", "tcp://127.0.0.1:1", "--model-name", "m", "--listen",
            "127.0.0.1:%d" % cl.free_port()]
    r = cl.run(argv + ["--router-link", "direct"], timeout=20, env=env)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "--router-link zmq" in out,
          "CURVE keys with the direct link: rc %d, output %s" % (r.returncode, out))
    print("CURVE keys, --router-link direct: refused (%s)" % out.strip().splitlines()[-1][:200])
    r = cl.run(argv, timeout=20, env=env)
    out = r.stdout + r.stderr
    check(r.returncode != 0 and "/nonexistent/router.pub" in out and "--router-link" not in out,
          "CURVE keys with the default link: rc %d, output %s" % (r.returncode, out))
    print("CURVE keys, auto: libzmq's link reads the keys (%s)" % out.strip().splitlines()[0][:200])
    print("PASS")


if __name__ == "__main__":
    cl.run_main(main)
