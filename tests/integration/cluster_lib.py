"""cluster_lib.py - starts a real kvrail cluster (router, prefill and decode
nodes as separate processes) for the end-to-end tests, and talks to it.

Every process a test starts goes through spawn() / run() here: each child
leads its own process group (a new session), has PR_SET_PDEATHSIG(SIGKILL)
set between fork and exec (so even a SIGKILL of the test takes it along), and
is recorded; reap_all() kills every recorded group (SIGTERM, then SIGKILL
after 5 s) and runs on every exit path: normal exit and uncaught exceptions
(atexit), SIGTERM / SIGINT / SIGHUP (meson's timeout sends SIGTERM).  Tests
that do not use Cluster import spawn (for Popen) and sp_run (for
subprocess.run) from here too.

Work directories (workdir()) are recorded too and dealt with after the
processes are reaped (a node may write into its directory until it dies):
removed when the test passes (run_main saw 0 or 77), kept for diagnosis when
it fails, with a "kept DIR for diagnosis" line on stderr.  See
finish_workdirs() for what a kept directory holds.

A Cluster writes a cluster file with free loopback ports (or the addresses of
network namespaces), starts every process with --config/--node (decode and
prefill nodes also write --stats-file JSON that the tests read), waits until
the router reports every node alive, and stops everything at the end
(SIGTERM, then SIGKILL).  Requests go through kvrail-loadgen (--prompts FILE
--outputs FILE); references come from `kvrail run --json`.  Stdlib only.
"""
import argparse
import atexit
import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

SKIP = 77

# ---- process groups: every child of a test is reaped on every exit path ----

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_children = []  # Popen objects, each the leader of its own process group
_harness_pid = os.getpid()


def _child_setup():
    """Runs in the child between fork and exec (after setsid): die with the
    test, and give up if the test already died before the prctl."""
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != _harness_pid:
        os._exit(126)


def spawn(argv, **kw):
    """subprocess.Popen in a new session (its own process group) that dies
    with this process; recorded for reap_all()."""
    kw["start_new_session"] = True
    # the child of a forked helper process has a different parent
    global _harness_pid
    _harness_pid = os.getpid()
    kw["preexec_fn"] = _child_setup
    p = subprocess.Popen(argv, **kw)
    _children.append(p)
    return p


def killgroup(p, sig):
    """Sends sig to p's whole process group (also after p itself exited:
    the group id stays taken while any member lives)."""
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(p, grace=5.0):
    """SIGTERM to p's group, SIGKILL after grace seconds; waits for p."""
    if p.poll() is None:
        killgroup(p, signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    killgroup(p, signal.SIGKILL)  # stragglers in the group, or p itself
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print("harness: pid %d did not die after SIGKILL" % p.pid, file=sys.stderr)
    if p in _children:
        _children.remove(p)


def run(argv, timeout, **kw):
    """subprocess.run(capture_output=True, text=True) through spawn(): on a
    timeout or any exception the child's whole group is killed."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    inp = kw.pop("input", None)
    if inp is not None:
        kw["stdin"] = subprocess.PIPE
    p = spawn(argv, **kw)
    try:
        out, err = p.communicate(input=inp, timeout=timeout)
    except BaseException:
        stop_group(p, grace=0)
        raise
    killgroup(p, signal.SIGKILL)  # anything it left behind in its group
    if p in _children:
        _children.remove(p)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def sp_run(argv, timeout=300, check=False, capture_output=False, input=None, **kw):
    """Drop-in for subprocess.run (same arguments and result) through
    spawn(): the child leads its own group, dies with this process, and its
    group is killed on a timeout or any exception.  timeout defaults to 300 s
    (every wait in a test is bounded)."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    p = spawn(argv, **kw)
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except BaseException:
        stop_group(p, grace=0)
        raise
    killgroup(p, signal.SIGKILL)
    if p in _children:
        _children.remove(p)
    r = subprocess.CompletedProcess(argv, p.returncode, out, err)
    if check:
        r.check_returncode()
    return r


_reaping = False


def reap_all():
    """Stops every recorded process group: SIGTERM to all, SIGKILL after 5 s."""
    global _reaping
    if _reaping or os.getpid() != _harness_pid:
        return
    _reaping = True
    try:
        live = list(_children)
        for p in live:
            if p.poll() is None:
                killgroup(p, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in live:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            killgroup(p, signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _children.clear()
    finally:
        _reaping = False


# ---- work directories: removed when the test passes, logs kept when it fails ----
#
# A failed test's directory is how the failure gets debugged (node logs,
# cluster file, stats, loadgen output), so it stays; but the model weights a
# test made with kvrail-mkmodel are megabytes (the slow model 71 MB) that a
# run can remake bit for bit (mkmodel is seeded; config.json stays to say
# which), so a failed run drops them unless KVR_KEEP_WORKDIR=1 (or a test's
# --keep) asks to keep everything: a machine that fails the same test every
# night keeps kilobytes of logs per failure, not a model.  KVR_KEEP_WORKDIR=1
# also keeps a passing test's directory.  tests/run.sh gives each run a
# fresh TMPDIR, removed after a passing run (which must leave it empty) and
# kept, named, after a failing one.

KEEP_ENV = "KVR_KEEP_WORKDIR"
# what a kept directory drops: model weights (remade by kvrail-mkmodel)
_WEIGHTS = (".safetensors", ".gguf")
_workdirs = []  # made by workdir(), not yet removed or reported


def keep_workdirs():
    """Keeps every work directory in full, also when the test passes (--keep)."""
    os.environ[KEEP_ENV] = "1"


def _drop_weights(d):
    dropped = 0
    for root, _, files in os.walk(d):
        for f in files:
            if f.endswith(_WEIGHTS):
                try:
                    path = os.path.join(root, f)
                    dropped += os.path.getsize(path)
                    os.unlink(path)
                except OSError:
                    pass
    return dropped


def finish_workdirs(passed):
    """Removes the recorded work directories when passed, else keeps them
    (less their model weights, unless KVR_KEEP_WORKDIR=1) and says where on
    stderr.  Call only after the processes that write there are reaped."""
    keep_all = os.environ.get(KEEP_ENV) == "1"
    for d in list(_workdirs):
        if not os.path.isdir(d):  # the test removed it itself
            pass
        elif passed and not keep_all:
            shutil.rmtree(d, ignore_errors=True)
        elif keep_all:
            print("kept %s (%s=1)" % (d, KEEP_ENV), file=sys.stderr)
        else:
            dropped = _drop_weights(d)
            print("kept %s for diagnosis%s (%s=1 keeps everything)" % (
                d, ", model weights (%.1f MB) removed" % (dropped / 1e6) if dropped else "",
                KEEP_ENV), file=sys.stderr)
        _workdirs.remove(d)


def _on_signal(sig, frame):
    print("harness: signal %d: stopping %d process group(s)" % (sig, len(_children)),
          file=sys.stderr)
    if _reaping:  # interrupted reap_all: no more grace
        for p in list(_children):
            killgroup(p, signal.SIGKILL)
    else:
        reap_all()
    # a test stopped by a signal (meson's timeout: SIGTERM) failed
    finish_workdirs(passed=False)
    sys.stderr.flush()
    os._exit(128 + sig)


def _at_exit():
    reap_all()
    # run_main has dealt with its test's directories; what is left here
    # comes from an exit path that did not go through it (an exception in a
    # script without run_main, sys.exit from a helper): not known to have
    # passed, so kept, without weights, and reported
    if os.getpid() == _harness_pid:
        finish_workdirs(passed=False)


atexit.register(_at_exit)
for _s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_s, _on_signal)


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_for(what, cond, timeout=20.0, step=0.05):
    """Polls cond() until it returns a true value, which it returns; Fail
    naming what after timeout s (state, not time: the timeout only bounds a
    hang)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Fail("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(step)


class Bins:
    def __init__(self, args):
        self.router = args.router
        self.prefill = args.prefill_bin
        self.decode = args.decode_bin
        self.kvrail = args.kvrail
        self.mkmodel = args.mkmodel
        self.loadgen = args.loadgen

    @classmethod
    def from_build(cls, build):
        """The binaries of a meson build directory (for the benchmark scripts)."""
        return cls(argparse.Namespace(
            router=os.path.join(build, "router", "kvrail-router"),
            prefill_bin=os.path.join(build, "prefill", "kvrail-prefill"),
            decode_bin=os.path.join(build, "decode", "kvrail-decode"),
            kvrail=os.path.join(build, "tools", "kvrail", "kvrail"),
            mkmodel=os.path.join(build, "tools", "mkmodel", "kvrail-mkmodel"),
            loadgen=os.path.join(build, "tools", "loadgen", "kvrail-loadgen")))


def add_bin_args(ap):
    ap.add_argument("--router", required=True)
    ap.add_argument("--prefill-bin", required=True)
    ap.add_argument("--decode-bin", required=True)
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--keep", action=_KeepAction, help="keep the work directory, model included")


class _KeepAction(argparse.Action):
    """--keep: sets args.keep and keeps the work directories (keep_workdirs)."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=False, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        keep_workdirs()


def test_start(prefix, options=(), model_args=()):
    """A cluster test's start: its arguments (the binaries, add_bin_args, and
    options: (flag, add_argument keywords) pairs, e.g. ROGUE), a fresh work
    directory named prefix..., and the test model made in it (kvrail-mkmodel
    with model_args).  Returns (args, bins, workdir, model)."""
    ap = argparse.ArgumentParser()
    add_bin_args(ap)
    for flag, kw in options:
        ap.add_argument(flag, **kw)
    args = ap.parse_args()
    bins = Bins(args)
    wd = workdir(prefix)
    return args, bins, wd, make_model(bins, wd, model_args)


# the chaos tests' rogue peer binary (tests/chaos/rogue_peer.c)
ROGUE = ("--rogue", {"required": True})
# prompts' length for the fence tests (long enough to stop a node mid-prefill)
TOKENS = ("--tokens", {"type": int, "default": 1600})
# kvrail-mkmodel's arguments for a model whose long prefills take a while
# (8 layers, hidden 512): the fence tests stop a node in the middle of one
SLOW_MODEL = ["--layers", "8", "--hidden", "512", "--heads", "8", "--kv-heads", "2",
              "--intermediate", "1024", "--seed", "5"]


def make_model(bins, workdir, extra=()):
    d = os.path.join(workdir, "model")
    r = run([bins.mkmodel, "--out", d, *extra], timeout=60)
    check(r.returncode == 0, "kvrail-mkmodel failed: %s" % r.stderr)
    return d


class Cluster:
    def __init__(self, bins, workdir, model, n_prefill=1, n_decode=1, pool_blocks=2048,
                 transport="ucx", tls="", queue_ms=5000, lease_ms=10000, local_prefill_tokens=32,
                 max_batch=32, hosts=None, netns=None, threads=1, extra_yaml="",
                 heartbeat_timeout_ms=3000, prefill_ms=60000):
        self.bins = bins
        self.dir = workdir
        self.model = model
        self.procs = []
        self.logs = {}
        self.netns = netns or {}  # node name -> namespace
        hosts = hosts or {}
        rhost = hosts.get("router", "127.0.0.1")
        self.client_ep = "tcp://%s:%d" % (rhost, free_port())
        self.node_ep = "tcp://%s:%d" % (rhost, free_port())
        self.prefills = ["prefill%d" % i for i in range(n_prefill)]
        self.decodes = ["decode%d" % i for i in range(n_decode)]
        y = ["cluster: test", "model: %s" % model, "block_size: 16", "router:",
             "  client: %s" % self.client_ep, "  node: %s" % self.node_ep]
        if netns:
            y += ["  client_bind: tcp://0.0.0.0:%s" % self.client_ep.rsplit(":", 1)[1],
                  "  node_bind: tcp://0.0.0.0:%s" % self.node_ep.rsplit(":", 1)[1]]
        y += ["timeouts:", "  lease_ms: %d" % lease_ms, "  queue_ms: %d" % queue_ms,
              "  heartbeat_ms: 200", "  heartbeat_timeout_ms: %d" % heartbeat_timeout_ms,
              "  request_ms: 120000", "  prefill_ms: %d" % prefill_ms,
              "thresholds:", "  local_prefill_tokens: %d" % local_prefill_tokens,
              "limits:", "  max_queue: 256", "  prefill_retries: 2", "nodes:",
              "  - name: router", "    role: router"]
        for n in self.prefills:
            y += ["  - name: %s" % n, "    role: prefill", "    threads: %d" % threads,
                  "    transport:", "      backend: %s" % transport]
            if tls:
                y += ["      tls: %s" % tls]
        for n in self.decodes:
            y += ["  - name: %s" % n, "    role: decode", "    threads: %d" % threads,
                  "    pool_blocks: %d" % pool_blocks, "    max_batch: %d" % max_batch,
                  "    transport:", "      backend: %s" % transport]
            if tls:
                y += ["      tls: %s" % tls]
        self.config = os.path.join(workdir, "cluster.yaml")
        with open(self.config, "w") as f:
            f.write("\n".join(y) + "\n" + extra_yaml)

    def _start(self, name, argv, env_extra=None):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        ns = self.netns.get(name)
        if ns:
            argv = ["ip", "netns", "exec", ns] + argv
        env = dict(os.environ)
        env.setdefault("KVR_LOG_LEVEL", "info")
        env.update(env_extra or {})
        p = spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, p))
        self.logs[name] = log.name
        return p

    def stats_path(self, name):
        return os.path.join(self.dir, name + ".stats.json")

    def start(self, timeout=40):
        self._start("router", [self.bins.router, "--config", self.config, "--node", "router"])
        for n in self.prefills:
            self._start(n, [self.bins.prefill, "--config", self.config, "--node", n,
                            "--stats-file", self.stats_path(n)])
        for n in self.decodes:
            self._start(n, [self.bins.decode, "--config", self.config, "--node", n,
                            "--stats-file", self.stats_path(n)])
        deadline = time.time() + timeout
        want = set(self.prefills + self.decodes)
        last = None
        while time.time() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise Fail("%s exited with %s during start-up:\n%s" %
                               (name, p.returncode, self.tail(name)))
            st = self.status(timeout_ms=1000)
            if st:
                last = st
                alive = {n["name"] for n in st.get("nodes", []) if n.get("alive")}
                if want <= alive and all(self.stats(n).get("registered") for n in want):
                    return
            time.sleep(0.2)
        raise Fail("cluster not up within %d s (last status %s)\n%s" %
                   (timeout, last, "\n".join(self.tail(n) for n, _ in self.procs)))

    def tail(self, name, n=30):
        try:
            with open(self.logs[name]) as f:
                lines = f.readlines()[-n:]
            return "--- %s ---\n%s" % (name, "".join(lines))
        except OSError:
            return ""

    def status(self, timeout_ms=3000):
        """The router's status as `kvrail status --json` prints it (through
        libkvrail-client, which also takes the CURVE keys from KVRAIL_ROUTER_KEY
        / KVRAIL_CLIENT_KEY), or None when it did not answer."""
        r = run(self._ns_client() + [self.bins.kvrail, "status", "--router", self.client_ep,
                                     "--json", "--timeout", str(timeout_ms)],
                timeout=timeout_ms / 1000 + 10)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def _ns_client(self):
        ns = self.netns.get("client")
        return ["ip", "netns", "exec", ns] if ns else []

    def stats(self, name):
        try:
            with open(self.stats_path(name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def loadgen(self, prompts, extra=(), timeout=240, name="load"):
        """Runs kvrail-loadgen over prompts [(tokens, max_tokens)], returns
        (returncode, outputs by id, stdout)."""
        pf = os.path.join(self.dir, name + ".prompts.jsonl")
        of = os.path.join(self.dir, name + ".outputs.jsonl")
        with open(pf, "w") as f:
            for i, (toks, mt) in enumerate(prompts):
                f.write(json.dumps({"id": i, "tokens": toks, "max_tokens": mt}) + "\n")
        argv = self._ns_client() + [self.bins.loadgen, "--router", self.client_ep, "--prompts", pf,
                                    "--outputs", of, "--timeout-ms", str(int(timeout * 1000 - 5000))]
        r = run(argv + list(extra), timeout=timeout)
        outs = {}
        if os.path.exists(of):
            with open(of) as f:
                for line in f:
                    o = json.loads(line)
                    outs[o["id"]] = o
        return r.returncode, outs, r.stdout + r.stderr

    def wait_idle(self, timeout=15):
        """Waits until every decode node holds no reservation and has its
        whole pool faulted in (a pool is pre-faulted in the background after
        registration; blocks above its faulted horizon are neither free nor
        usable yet), and every prefill node no request; returns the decode
        stats.  Only stats files written after the call count: a node
        rewrites its file periodically, and an older file may predate the
        work the caller just finished."""
        deadline = time.time() + timeout
        since_ns = time.time_ns()
        while True:
            ds = {n: self.stats(n) for n in self.decodes}
            ps = {n: self.stats(n) for n in self.prefills}
            fresh = all(self.stats_mtime_ns(n) >= since_ns for n in self.decodes + self.prefills)
            idle = fresh and all(s.get("requests") == 0 and s.get("reserved_blocks") == 0 and
                       s.get("pool_faulted_blocks", s.get("total_blocks")) == s.get("total_blocks")
                       for s in ds.values()) \
                and all(s.get("active") == 0 and s.get("queued") == 0 for s in ps.values())
            if idle:
                return ds
            if time.time() > deadline:
                raise Fail("nodes not idle after %d s (stats files rewritten since: %s): "
                           "decode %s prefill %s" % (
                    timeout, fresh, {n: (s.get("requests"), s.get("reserved_blocks")) for n, s in ds.items()},
                    {n: (s.get("active"), s.get("queued")) for n, s in ps.items()}))
            time.sleep(0.2)

    def stats_mtime_ns(self, name):
        try:
            return os.stat(self.stats_path(name)).st_mtime_ns
        except OSError:
            return 0

    def kill(self, name, sig=signal.SIGKILL):
        """Sends sig to the node's process group; waits for it to end unless
        sig is SIGSTOP or SIGCONT."""
        for n, p in self.procs:
            if n == name and p.poll() is None:
                killgroup(p, sig)
                if sig not in (signal.SIGSTOP, signal.SIGCONT):
                    p.wait(timeout=10)

    def loadgen_start(self, prompts, extra=(), name="load", timeout=240):
        """Starts kvrail-loadgen in the background; finish with loadgen_wait."""
        pf = os.path.join(self.dir, name + ".prompts.jsonl")
        of = os.path.join(self.dir, name + ".outputs.jsonl")
        with open(pf, "w") as f:
            for i, (toks, mt) in enumerate(prompts):
                f.write(json.dumps({"id": i, "tokens": toks, "max_tokens": mt}) + "\n")
        argv = self._ns_client() + [self.bins.loadgen, "--router", self.client_ep, "--prompts", pf,
                                    "--outputs", of, "--timeout-ms", str(int(timeout * 1000 - 5000))]
        p = spawn(argv + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return (p, of, timeout)

    def loadgen_wait(self, h):
        p, of, timeout = h
        try:
            out, _ = p.communicate(timeout=timeout)
        finally:
            stop_group(p, grace=0)
        outs = {}
        if os.path.exists(of):
            with open(of) as f:
                for line in f:
                    o = json.loads(line)
                    outs[o["id"]] = o
        return p.returncode, outs, out

    def check_alive(self):
        for name, p in self.procs:
            check(p.poll() is None, "%s died (exit %s):\n%s" % (name, p.returncode, self.tail(name)))

    def stop(self):
        for name, p in self.procs:
            if p.poll() is None:
                killgroup(p, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for name, p in self.procs:
            stop_group(p, grace=max(0.1, deadline - time.monotonic()))


class Ref(list):
    """What `kvrail run` generated for one prompt: the token ids (the list)
    and their logprobs (.logprobs), exactly as printed (9 significant
    digits: a float's exact value)."""

    def __init__(self, ids, logprobs):
        super().__init__(ids)
        self.logprobs = logprobs


def diff_output(o, ref):
    """'' when a kvrail-loadgen output o holds exactly what `kvrail run`
    generated (ref, from reference()): the same token ids and, bit for bit,
    the same logprobs (every engine path is bit-identical: local or remote
    prefill, any cached prefix, any batch); else what differs."""
    if o.get("status") != 0:
        return "request %s failed: %s" % (o.get("id"), o.get("message"))
    if o["tokens"] != list(ref):
        return "tokens %s, kvrail run %s" % (o["tokens"], list(ref))
    if o.get("logprobs") != ref.logprobs:
        bad = [k for k, (a, b) in enumerate(zip(o.get("logprobs") or [], ref.logprobs)) if a != b]
        return "same tokens, logprobs differ at %s: %s, kvrail run %s" % (
            bad, o.get("logprobs"), ref.logprobs)
    return ""


def check_outputs(outs, ref, ids=None, what="cluster"):
    """Every request in ids (default: all of ref) has an output that
    succeeded and holds exactly what `kvrail run` generated (diff_output)."""
    ids = list(range(len(ref))) if ids is None else list(ids)
    bad = []
    for i in ids:
        o = outs.get(i)
        d = "no output" if o is None else diff_output(o, ref[i])
        if d:
            bad.append("request %d%s: %s" % (i, "" if o is None else (
                " (cached %s, local %s, %s->%s)" % (o.get("cached_tokens"), o.get("local_prefill"),
                                                    o.get("prefill_node"), o.get("decode_node"))), d))
    check(not bad, "%s: %d of %d outputs differ from kvrail run:\n%s" % (
        what, len(bad), len(ids), "\n".join(bad[:10])))


def node_metrics(port):
    """{(metric, peer): value} of the kvrail_node_* series (per-node blame,
    cool-downs) on the router's /metrics at 127.0.0.1:port."""
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read()
    out = {}
    for ln in body.decode().splitlines():
        m = re.match(r'^(kvrail_node_\w+)\{([^}]*)\} (\S+)$', ln)
        peer = m and re.search(r'peer="([^"]*)"', m.group(2))
        if peer:
            out[(m.group(1), peer.group(1))] = float(m.group(3))
    return out


def reference(bins, model, prompts, jobs=2, ignore_eos=False, sampling=(), run_args=()):
    """Greedy outputs of `kvrail run` for each (tokens, max_tokens), as Ref
    (ids, with their logprobs); with sampling (kvrail run flags, e.g.
    --temperature 0.8), sampled with seed i for prompt i (what kvrail-loadgen's
    requests use: --seed = their id); run_args are added to every run
    (e.g. --device cuda:0)."""
    outs = [None] * len(prompts)
    running = []
    i = 0
    while i < len(prompts) or running:
        while i < len(prompts) and len(running) < jobs:
            toks, mt = prompts[i]
            argv = [bins.kvrail, "run", "--model", model, "--prompt-tokens",
                    ",".join(map(str, toks)), "--max-tokens", str(mt), "--temperature", "0",
                    "--json", *run_args] + (["--ignore-eos"] if ignore_eos else [])
            if sampling:
                argv += list(sampling) + ["--seed", str(i)]
            running.append((i, spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)))
            i += 1
        idx, p = running.pop(0)
        try:
            out, err = p.communicate(timeout=120)
        finally:
            stop_group(p, grace=0)
        check(p.returncode == 0, "kvrail run failed for prompt %d: %s" % (idx, err))
        ids, lps = [], []
        # lines end at "\n" only: str.splitlines() would also cut at U+2028,
        # \x1c.. \x1e, \x85, which a sampled token's JSON text may hold
        for line in out.split("\n"):
            line = line.strip()
            if not line:
                continue
            o = json.loads(line)
            if "token_id" in o:
                ids.append(o["token_id"])
                lps.append(o["logprob"])
        outs[idx] = Ref(ids, lps)
    return outs


def make_prompts(n=40, seed=7, vocab=512, max_len=700, max_tokens=12):
    """n prompts of 1..max_len tokens; several share long prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, vocab) for _ in range(L)] for L in (520, 400, 300)]
    lens = [1, 2, 15, 16, 17, 31, 33, 64, 700, 699]
    prompts = []
    for i in range(n):
        if i < len(lens):
            toks = [rng.randrange(4, vocab) for _ in range(lens[i])]
        elif i % 3 == 0:
            pre = prefixes[i % len(prefixes)]
            toks = pre + [rng.randrange(4, vocab) for _ in range(rng.randrange(1, max_len - len(pre)))]
        else:
            toks = [rng.randrange(4, vocab) for _ in range(rng.randrange(1, max_len + 1))]
        prompts.append((toks, rng.randrange(1, max_tokens + 1)))
    return prompts


def workdir(prefix):
    """A fresh directory prefix... under $TMPDIR, removed or kept at exit by
    finish_workdirs() (see above)."""
    d = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR", "/tmp"))
    _workdirs.append(d)
    return d


# The chaos tests' name for a Cluster, from when only this one went through
# libkvrail-client for its status.
ClientCluster = Cluster


def tokens_of(text):
    """The token ids of `kvrail generate/run --json` output."""
    ids = []
    for line in text.split("\n"):  # not splitlines(): see reference()
        line = line.strip()
        if line.startswith("{"):
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if "token_id" in o:
                ids.append(o["token_id"])
    return ids


def run_main(fn):
    """Runs fn() -> exit code, mapping Fail to 1 with its message and any
    other exception to 1 with its traceback; then reaps every process and
    removes the work directories if the test passed (0, or 77: skipped), or
    keeps them for diagnosis (finish_workdirs)."""
    code = 1
    try:
        code = fn()
    except Fail as e:
        print("FAIL: %s" % e, file=sys.stderr)
    except SystemExit as e:  # sys.exit() inside fn: its code, as Python would exit
        code = e.code
    except Exception:
        traceback.print_exc()
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it, exits 1
        print(code, file=sys.stderr)
        code = 1
    reap_all()
    finish_workdirs(passed=code in (0, SKIP))
    sys.exit(code)
