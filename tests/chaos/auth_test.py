"""auth_test.py - authentication of the router's endpoints with real
processes (docs/security.md).

With `auth: curve` (keys from `kvrail keygen --config`): a cluster whose
nodes and client hold their keys works and answers token for token what
`kvrail run` gives; then, while it runs, hostile peers (kvr-rogue-peer) try
the node endpoint: no key, a key of their own, a running node's name with
another node's key (a stolen name), a free node slot's name with a node's
key.  None gets a RegisterReply with code 0 or any message meant for a node
(a prompt would come as PREFILL or RESERVE), the router logs each refusal,
a client without a key gets no answer, and the same prompts still give the
same tokens afterwards.  The transfer engines too: a peer that no router
introduced (kvr-rogue-peer --xfer-connect to the address decode0 publishes,
with no token and with a made-up one) has its notifications refused and
counted (decode0's transfer_refused), while the real prefill node's, with
the token the router made for the pair, are not.  kvrail-frontend serves
over CURVE on both router links (its default, the direct link, speaking
CurveZMQ itself), and a wrong KVRAIL_ROUTER_KEY is named in its 503.  With `auth: none` (the control) the same rogue
registers: the test would fail if the refusals came from anything but the
keys; and the router warns at start.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from cluster_lib import (Bins, ClientCluster, Fail, add_bin_args, check, free_port, make_model,
                         run, run_main, spawn, stop_group, tokens_of, wait_for, workdir)


def generate(bins, c, text, max_tokens, env=None):
    r = run([bins.kvrail, "generate", "--router", c.client_ep, "--max-tokens", str(max_tokens),
             "--temperature", "0", "--json", "--timeout", "60000", text], timeout=90, env=env)
    return r.returncode, tokens_of(r.stdout), r.stderr


def reference_text(bins, model, text, max_tokens):
    r = run([bins.kvrail, "run", "--model", model, "--prompt", text, "--max-tokens",
             str(max_tokens), "--temperature", "0", "--json"], timeout=120)
    check(r.returncode == 0, "kvrail run failed: %s" % r.stderr)
    return tokens_of(r.stdout)


def rogue(args, c, name, role="prefill", key=None, random_key=False, listen_ms=1500):
    argv = [args.rogue, "--endpoint", c.node_ep, "--name", name, "--role", role,
            "--wait-ms", "2500", "--listen-ms", str(listen_ms)]
    if key:
        argv += ["--router-pub", os.path.join(c.dir, "keys", "router.pub"), "--key", key]
    if random_key:
        argv += ["--router-pub", os.path.join(c.dir, "keys", "router.pub"), "--random-key"]
    r = run(argv, timeout=30)
    check(r.returncode == 0, "kvr-rogue-peer failed: %s" % r.stderr)
    return r.stdout.split("\n")


def xfer_rogues(args, c):
    """Transfer-level peers of decode0 that the router never introduced."""
    st = c.stats("decode0")
    check(st.get("remote_prefills", 0) >= 1 and st.get("transfer_refused") == 0 and
          st.get("transfer_tokens", 0) >= 1 and st.get("transfer_address"),
          "decode0 before the transfer rogues: remote prefills (with the router's token) "
          "should be accepted, nothing refused: %s" %
          {k: st.get(k) for k in ("remote_prefills", "transfer_refused", "transfer_tokens")})
    outs = []
    for tok in (None, "00112233445566778899aabbccddeeff"):
        argv = [args.rogue, "--xfer-connect", st["transfer_address"]]
        if tok:
            argv += ["--xfer-token", tok]
        r = run(argv, timeout=30)
        check(r.returncode == 0 and "XFER " in r.stdout,
              "kvr-rogue-peer --xfer-connect failed: %s %s" % (r.stdout, r.stderr[-500:]))
        outs.append(r.stdout.strip())
    deadline = time.time() + 10
    while c.stats("decode0").get("transfer_refused", 0) < 4 and time.time() < deadline:
        time.sleep(0.1)
    got = c.stats("decode0").get("transfer_refused", 0)
    check(got >= 4, "decode0 refused %d of the 4 notifications of peers the router never "
          "introduced (%s):\n%s" % (got, outs, c.tail("decode0")))
    print("transfer rogues (no token, a made-up one): %s; decode0 refused and counted %d" %
          (" | ".join(outs), got))


def wait_router(c, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if c.status(timeout_ms=1000) is not None:
            return
        time.sleep(0.2)
    raise Fail("router not answering:\n%s" % c.tail("router"))


def log_text(c, name):
    with open(c.logs[name]) as f:
        return f.read()


def control(args, bins, model):
    """auth: none: the rogue registers (a fresh router, no node yet)."""
    wd = workdir("kvr-auth-none-")
    c = ClientCluster(bins, wd, model, extra_yaml="auth: none\n")
    try:
        c._start("router", [bins.router, "--config", c.config, "--node", "router"])
        wait_router(c)
        out = rogue(args, c, "decode0", role="decode", listen_ms=0)
        check(out[0].startswith("REPLY 0 "),
              "auth: none: the rogue should register (control), got %s" % out)
        check("auth: none" in log_text(c, "router"),
              "auth: none is not warned about at start:\n%s" % c.tail("router"))
        print("control (auth: none): a rogue registers as decode0: %s" % out[0])
    finally:
        c.stop()


def fe_complete(base, fe, log, max_tokens=6):
    """A completion through the frontend: (status, body as text)."""
    if fe.poll() is not None:
        raise Fail("kvrail-frontend exited: %s" % open(log).read()[-2000:])
    body = json.dumps({"model": "m", "prompt": "Hello there, how are you today?",
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def frontend_serves(args, c, wd, name, extra, env=None):
    """Starts kvrail-frontend on the CURVE cluster (extra: its link
    arguments), waits for a completion of 6 tokens, returns its log."""
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    log = os.path.join(wd, "frontend-%s.log" % name)
    fe = spawn([args.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port,
                "--model-name", "m"] + extra, stdout=open(log, "w"), stderr=subprocess.STDOUT,
               env=env)
    try:
        def complete():
            try:
                st, text = fe_complete(base, fe, log)
            except (urllib.error.URLError, ConnectionError):
                return None
            if st != 200:
                print("%s: %d %s" % (name, st, text.strip()[:300]))
                return None
            return json.loads(text)
        out = wait_for("a completion through the frontend over CURVE (%s)" % name, complete,
                       timeout=60)
        check(out["usage"]["completion_tokens"] == 6 and out["choices"][0]["text"],
              "the frontend's completion over CURVE (%s): %s" % (name, out))
    finally:
        stop_group(fe)
    with open(log) as f:
        return f.read()


def frontend_leg(args, c, env_nokeys, wd, keys):
    """kvrail-frontend on the CURVE cluster: without the client keys it
    refuses to start, naming them (the router would drop its handshakes
    without a word); with them its default link (auto) is the direct one,
    speaking CURVE itself, and serves a completion, as libzmq's link
    (--router-link zmq) does; with a wrong router key (another key's .pub
    in KVRAIL_ROUTER_KEY) the direct link's requests fail with a 503 that
    names the key mismatch, and the frontend keeps serving /health."""
    port = free_port()
    fe_argv = [args.frontend, "--config", c.config, "--listen", "127.0.0.1:%d" % port]
    r = run(fe_argv, timeout=20, env=env_nokeys)
    check(r.returncode != 0 and "KVRAIL_CLIENT_KEY" in r.stderr and "auth: curve" in r.stderr,
          "kvrail-frontend on an auth: curve cluster without keys: rc %d, %s" % (
              r.returncode, r.stderr))
    text = frontend_serves(args, c, wd, "curve-auto", [])
    check("router link: direct (ZMTP 3.1 on the loop's own socket), CURVE" in text,
          "the frontend's default link on a CURVE cluster is not the direct one with CURVE:\n%s"
          % text[-2000:])
    text = frontend_serves(args, c, wd, "curve-zmq", ["--router-link", "zmq"])
    check("router link: zmq (libzmq DEALER, --router-link zmq), CURVE" in text,
          "the frontend did not log its libzmq CURVE link:\n%s" % text[-2000:])

    # a wrong router key (the router cannot open our HELLO and drops it),
    # a client key the router does not take (a node's, not in KEYS/clients/)
    base = "http://127.0.0.1:%d" % port
    for what, var, path, want in [
            ("router", "KVRAIL_ROUTER_KEY", os.path.join(keys, "prefill0.pub"),
             "not the one in KVRAIL_ROUTER_KEY"),
            ("client", "KVRAIL_CLIENT_KEY", os.path.join(keys, "decode1.key"),
             "did not accept this client's key, KVRAIL_CLIENT_KEY")]:
        log = os.path.join(wd, "frontend-wrong-%s-key.log" % what)
        fe = spawn(fe_argv + ["--model-name", "m", "--router-link", "direct"],
                   env=dict(os.environ, **{var: path}), stdout=open(log, "w"),
                   stderr=subprocess.STDOUT)
        try:
            def health():
                try:
                    return urllib.request.urlopen(base + "/health", timeout=2).status == 200
                except OSError:
                    check(fe.poll() is None,
                          "kvrail-frontend exited: %s" % open(log).read()[-2000:])
                    return False
            wait_for("the frontend's /health (wrong %s key)" % what, health, timeout=20)
            st, text = fe_complete(base, fe, log)
            print("wrong %s over the direct link: %d %s" % (var, st, text.strip()[:400]))
            check(st >= 500 and want in text,
                  "a wrong %s key: %d %s (want a 5xx saying '%s')" % (what, st, text, want))
            check(fe.poll() is None and health(),
                  "the frontend stopped serving after a wrong %s key" % what)
        finally:
            stop_group(fe)
    print("kvrail-frontend: refused without client keys; auto takes the direct link with CURVE "
          "and serves, as --router-link zmq does; a wrong router or client key is named in a "
          "503")


def main():
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    ap.add_argument("--rogue", required=True)
    ap.add_argument("--frontend", required=True)
    args = ap.parse_args()
    bins = Bins(args)
    r = run([bins.kvrail, "keygen", "/nonexistent-dir-for-probe"], timeout=10)
    if "no CURVE" in (r.stderr or ""):
        print("SKIP: libzmq without CURVE: %s" % r.stderr.strip())
        return 77
    wd = workdir("kvr-auth-")
    model = make_model(bins, wd)
    control(args, bins, model)

    # decode1: a slot of the file with a key and no process (a free name)
    c = ClientCluster(bins, wd, model, n_prefill=1, n_decode=2,
                     extra_yaml="auth: curve\nkeys: keys\n")
    c.decodes = ["decode0"]
    r = run([bins.kvrail, "keygen", "--config", c.config, "--client", "tester"], timeout=30)
    check(r.returncode == 0, "kvrail keygen failed: %s %s" % (r.stdout, r.stderr))
    keys = os.path.join(wd, "keys")
    check(oct(os.stat(os.path.join(keys, "prefill0.key")).st_mode & 0o777) == "0o600",
          "a secret key file is not 0600")
    os.environ["KVRAIL_ROUTER_KEY"] = os.path.join(keys, "router.pub")
    os.environ["KVRAIL_CLIENT_KEY"] = os.path.join(keys, "clients", "tester.key")
    prompts = [("Hello there, how are you today?", 8),
               ("The quick brown fox jumps over the lazy dog. " * 6, 10),
               ("kvrail moves KV caches between nodes", 6)]
    ref = [reference_text(bins, model, t, n) for t, n in prompts]
    check(all(ref), "kvrail run gave no tokens")
    try:
        c.start()
        for i, (text, n) in enumerate(prompts):
            rc, got, err = generate(bins, c, text, n)
            check(rc == 0 and got == ref[i],
                  "prompt %d with keys: rc %d, %s; kvrail run gives %s (%s)" %
                  (i, rc, got, ref[i], err))

        # kvrail-loadgen is a CURVE client too: keys by flags (not the environment)
        env = dict(os.environ)
        env.pop("KVRAIL_ROUTER_KEY")
        env.pop("KVRAIL_CLIENT_KEY")
        lg = [bins.loadgen, "--router", c.client_ep, "--mode", "closed", "--concurrency", "2",
              "--requests", "4", "--prompt-len", "12", "--output-len", "5", "--quiet"]
        r = run(lg + ["--router-key", os.path.join(keys, "router.pub"), "--client-key",
                      os.path.join(keys, "clients", "tester.key"), "--summary-json",
                      os.path.join(wd, "lg-curve.json")], timeout=90, env=env)
        with open(os.path.join(wd, "lg-curve.json")) as f:
            lgs = json.load(f)
        check(r.returncode == 0 and lgs["ok"] == 4 and lgs["out_tok_per_s"] > 0,
              "kvrail-loadgen with --router-key/--client-key: rc %d %s %s" % (
                  r.returncode, lgs, r.stderr[-500:]))
        r = run(lg + ["--timeout-ms", "1500"], timeout=60, env=env)
        check(r.returncode != 0, "kvrail-loadgen without a key was served: %s" % r.stdout)
        r = run(lg + ["--router-key", os.path.join(keys, "router.pub")], timeout=60, env=env)
        check(r.returncode != 0 and "KVRAIL_CLIENT_KEY" in r.stderr,
              "kvrail-loadgen with a router key and no client key: rc %d, %s" % (
                  r.returncode, r.stderr))
        print("kvrail-loadgen: 4 requests as a CURVE client (--router-key, --client-key); "
              "without a key nothing is served; half a key pair is refused at start")
        frontend_leg(args, c, env, wd, keys)

        cases = [
            ("no key, as decode0", dict(name="decode0", role="decode")),
            ("a key of its own, as decode0", dict(name="decode0", role="decode", random_key=True)),
            ("a key of its own, as prefill0", dict(name="prefill0", random_key=True)),
            ("prefill0's key, as decode0 (stolen name)",
             dict(name="decode0", role="decode", key=os.path.join(keys, "prefill0.key"))),
            ("decode0's key, as prefill0 (stolen name)",
             dict(name="prefill0", key=os.path.join(keys, "decode0.key"))),
            ("prefill0's key, as decode1 (a free name)",
             dict(name="decode1", role="decode", key=os.path.join(keys, "prefill0.key"))),
        ]
        for what, kw in cases:
            out = rogue(args, c, **kw)
            got = [l for l in out if l]
            check(not any(l.startswith("REPLY 0 ") for l in got),
                  "rogue with %s registered: %s" % (what, got))
            check(not any(l.startswith("RECEIVED") for l in got),
                  "rogue with %s received node messages: %s" % (what, got))
            print("rogue with %s: %s" % (what, " | ".join(got)))
            if kw["name"] == "decode1":
                # the connection is up (the key is a node's), the name is not
                # its key's: refused with an answer saying so
                check(got and got[0].startswith("REPLY ") and "not node decode1's key" in got[0],
                      "a node's key under a free name was not refused by name: %s" % got)
        text = log_text(c, "router")
        check("is not in the nodes' keys" in text,
              "the router did not log the refused unknown key:\n%s" % c.tail("router"))

        # a client without a key gets nothing from the router
        env = dict(os.environ)
        env.pop("KVRAIL_ROUTER_KEY")
        env.pop("KVRAIL_CLIENT_KEY")
        r = run([bins.kvrail, "status", "--router", c.client_ep, "--json", "--timeout", "1500"],
                timeout=20, env=env)
        check(r.returncode != 0, "a client without a key got a status: %s" % r.stdout[:200])
        rc, got, err = generate(bins, c, prompts[0][0], 4, env=env)
        check(rc != 0 and not got, "a client without a key generated %s" % got)

        xfer_rogues(args, c)

        c.check_alive()
        st = c.status()
        alive = {n["name"] for n in st.get("nodes", []) if n.get("alive")}
        check(alive == {"prefill0", "decode0"}, "nodes alive after the rogues: %s" % alive)
        # kvrail status shows the trust counters of every process: the
        # router's refusals, and each node's own drops (none here)
        rt = st.get("router", {})
        check(rt.get("auth_refused", 0) >= 1 and "refused_registrations" in rt,
              "kvrail status --json has no router refusals after %d rogues: %s" % (len(cases), rt))
        for n in st.get("nodes", []):
            check(n.get("bad_frames") == 0 and n.get("bad_notifications") == 0,
                  "node %s's own drop counters missing or non-zero: %s" % (n.get("name"), n))
        r = run([bins.kvrail, "status", "--router", c.client_ep], timeout=20)
        check(r.returncode == 0 and "trust (router): auth refused %d" % rt["auth_refused"]
              in r.stdout and "BAD NOTIF" in r.stdout,
              "kvrail status does not print the trust counters:\n%s" % r.stdout)
        print("kvrail status after the rogues: auth refused %d, registrations refused %d" % (
            rt["auth_refused"], rt["refused_registrations"]))
        for i, (text, n) in enumerate(prompts):
            rc, got, err = generate(bins, c, text, n)
            check(rc == 0 and got == ref[i],
                  "after the rogues, prompt %d: rc %d, %s; kvrail run gives %s (%s)" %
                  (i, rc, got, ref[i], err))
        print("auth: curve: %d prompts token for token before and after %d rogue peers" %
              (len(prompts), len(cases)))
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
