#!/usr/bin/env python3
"""install_test.py - what `meson install` puts on an operator's machine.

--case install: `meson install --destdir D` installs the pkg-config file,
the libkvrail-client headers and library, the man pages (version filled in,
rendered by man -l), the systemd units, the sysusers entry, the examples,
the Slurm script and the Kubernetes manifests.  A small C program is built
with `pkg-config --cflags --libs kvrail-client` against D alone and run
against a kvrail-router from D: it connects, pings, and reads the status.

--case systemd: `systemd-analyze verify` passes on every installed unit with
no message at all (ExecStart pointed at D's bindir, MANPATH at D's man pages
so that Documentation= is checked too); a control copy with a misspelled key
must make it speak.  Then the units' ExecStart lines are run as systemd would
run them: the unit's Environment= and EnvironmentFile= (a kvrail.env naming
the test's cluster file), ${VAR} and %i expanded, router first (the units'
After= order), and the 1P+1D cluster they form serves a generation equal to
`kvrail run`.  (Not emulated: User=, the sandboxing options, LimitMEMLOCK;
the library is found through LD_LIBRARY_PATH since D is not in ld.so.conf.)

usage: install_test.py --case install|systemd --build DIR --kvrail BIN --mkmodel BIN
"""
import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Fail, check, free_port, reap_all, run, spawn, workdir  # noqa: E402

PROGRAM = r"""
#include <stdio.h>
#include <kvr_client.h>
int main(int argc, char **argv)
{
    kvr_client_t *c = NULL;
    static struct kvr_cluster_status s;
    if (argc != 2 || kvr_client_connect(argv[1], &c) != KVR_OK)
        return 2;
    if (kvr_client_ping(c, 5000) != KVR_OK || kvr_client_status(c, 5000, &s) != KVR_OK) {
        fprintf(stderr, "router: %s\n", kvr_client_error(c));
        return 1;
    }
    printf("status ok: %zu nodes, block size %u\n", s.n_nodes, (unsigned)s.block_size);
    kvr_client_close(c);
    return 0;
}
"""


def install(build, dest):
    r = run(["meson", "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet"],
            timeout=120)
    check(r.returncode == 0, "meson install: %s%s" % (r.stdout, r.stderr))
    prefix = run(["meson", "introspect", "--buildoptions", build], timeout=60)
    opts = {o["name"]: o["value"] for o in json.loads(prefix.stdout)}
    return opts["prefix"], opts["libdir"], opts["bindir"]


def find1(dest, pattern):
    hits = glob.glob(os.path.join(dest, pattern.lstrip("/")), recursive=True)
    check(len(hits) == 1, "want one %s under %s, found %s" % (pattern, dest, hits))
    return hits[0]


def start_router(bindir, libdir, work):
    pc, pn = free_port(), free_port()
    cfg = os.path.join(work, "router.yaml")
    with open(cfg, "w") as f:
        f.write("model: m\nrouter: {client: 'tcp://127.0.0.1:%d', node: 'tcp://127.0.0.1:%d'}\n"
                "nodes:\n  - {name: router, role: router}\n  - {name: d, role: decode}\n" % (pc, pn))
    env = dict(os.environ, LD_LIBRARY_PATH=libdir)
    log = open(os.path.join(work, "router.log"), "w")
    spawn([os.path.join(bindir, "kvrail-router"), "--config", cfg, "--node", "router"],
          stdout=log, stderr=subprocess.STDOUT, env=env)
    return "tcp://127.0.0.1:%d" % pc


def case_install(a, dest, work):
    prefix, libdir, bindir = install(a.build, dest)
    d = lambda p: os.path.join(dest, prefix.lstrip("/"), p)  # noqa: E731
    pc = find1(dest, "**/pkgconfig/kvrail-client.pc")
    for h in ("kvr_client.h", "kvr_status.h"):
        check(os.path.exists(d("include/kvrail/" + h)), "header %s not installed" % h)
    for m in ("kvrail", "kvrail-router", "kvrail-prefill", "kvrail-decode"):
        p = d("share/man/man1/%s.1" % m)
        check(os.path.exists(p), "man page %s not installed" % p)
        text = open(p).read()
        check("@VERSION@" not in text and re.search(r'"kvrail \d+\.\d+', text),
              "man page %s: version not filled in" % m)
        if shutil.which("man"):
            r = run(["man", "-l", "-P", "cat", p], timeout=30)
            check(r.returncode == 0 and "NAME" in r.stdout and m in r.stdout,
                  "man -l %s: %s" % (m, r.stderr))
    for f in ("lib/systemd/system/kvrail-router.service", "lib/systemd/system/kvrail-prefill@.service",
              "lib/systemd/system/kvrail-decode@.service", "lib/systemd/system/kvrail.target",
              "lib/sysusers.d/kvrail.conf", "share/kvrail/examples/cluster.yaml",
              "share/kvrail/slurm/kvrail.sbatch", "share/kvrail/k8s/base/kustomization.yaml",
              "share/kvrail/prometheus/prometheus.yml", "share/kvrail/grafana/kvrail.json"):
        check(os.path.exists(d(f)), "%s not installed" % f)
    check(os.access(d("share/kvrail/slurm/kvrail.sbatch"), os.X_OK), "kvrail.sbatch not executable")
    print("installed: pkg-config file, headers, 4 man pages, units, sysusers, examples, "
          "slurm, k8s, Prometheus scrape config, Grafana dashboard")

    # build against the installed files only
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pc), PKG_CONFIG_SYSROOT_DIR=dest)
    env.pop("PKG_CONFIG_LIBDIR", None)
    r = run(["pkg-config", "--cflags", "--libs", "kvrail-client"], timeout=30, env=env)
    check(r.returncode == 0, "pkg-config: %s" % r.stderr)
    flags = r.stdout.split()
    check(any(f.startswith("-I" + dest) for f in flags) and "-lkvrail-client" in flags,
          "pkg-config flags do not point into DESTDIR: %s" % flags)
    src = os.path.join(work, "prog.c")
    with open(src, "w") as f:
        f.write(PROGRAM)
    exe = os.path.join(work, "prog")
    cc = os.environ.get("CC", "cc")
    r = run([cc, "-Wall", "-Werror", src, "-o", exe] + flags, timeout=120)
    check(r.returncode == 0, "building against kvrail-client: %s" % r.stderr)
    libd = os.path.join(dest, libdir.lstrip("/")) if os.path.isabs(libdir) else d(libdir)
    bind = os.path.join(dest, bindir.lstrip("/")) if os.path.isabs(bindir) else d(bindir)
    ep = start_router(bind, libd, work)
    r = run([exe, ep], timeout=30, env=dict(os.environ, LD_LIBRARY_PATH=libd))
    check(r.returncode == 0 and "status ok" in r.stdout, "the program against the installed "
          "router: rc %d %s %s" % (r.returncode, r.stdout, r.stderr))
    print("built with pkg-config --cflags --libs kvrail-client; talks to the installed router: "
          + r.stdout.strip())


def unit_service(path):
    """{key: [values]} of a unit's [Service] section."""
    sec, out = None, {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            sec = line
            continue
        if sec == "[Service]" and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def exec_like_systemd(unit, instance, dest, prefix_bindir, libdir, work, name):
    svc = unit_service(unit)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for e in svc.get("Environment", []):
        for kv in e.split():
            k, v = kv.split("=", 1)
            env[k] = v
    for ef in svc.get("EnvironmentFile", []):
        p = os.path.join(dest, ef.lstrip("-").lstrip("/"))
        if os.path.exists(p):
            for line in open(p):
                line = line.strip()
                if line and not line.startswith("#"):
                    k, v = line.split("=", 1)
                    env[k] = v
        else:
            check(ef.startswith("-"), "%s: EnvironmentFile %s missing" % (unit, ef))
    (cmd,) = svc["ExecStart"]
    cmd = cmd.replace("%i", instance)
    cmd = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), cmd)
    argv = cmd.split()
    check(argv[0].startswith(prefix_bindir + "/"), "%s: ExecStart %s not in %s" % (
        unit, argv[0], prefix_bindir))
    argv[0] = os.path.join(dest, argv[0].lstrip("/"))
    env["LD_LIBRARY_PATH"] = libdir
    log = open(os.path.join(work, name + ".log"), "w")
    return spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def case_systemd(a, dest, work):
    if not shutil.which("systemd-analyze"):
        print("SKIP: systemd-analyze not installed (apt-get install systemd)")
        return 77
    prefix, libdir, bindir = install(a.build, dest)
    pbin = os.path.join(prefix, bindir)
    udir = os.path.join(dest, prefix.lstrip("/"), "lib/systemd/system")
    man = os.path.join(dest, prefix.lstrip("/"), "share/man")
    vdir = os.path.join(work, "units")
    os.mkdir(vdir)
    units = sorted(os.listdir(udir))
    check(len(units) == 4, "units: %s" % units)
    paths = []
    for u in units:
        text = open(os.path.join(udir, u)).read().replace(pbin + "/", os.path.join(
            dest, pbin.lstrip("/")) + "/")
        u = u.replace("@.", "@x0.")
        with open(os.path.join(vdir, u), "w") as f:
            f.write(text)
        paths.append(os.path.join(vdir, u))
    env = dict(os.environ, MANPATH=man)
    r = run(["systemd-analyze", "verify"] + paths, timeout=60, env=env)
    check(r.returncode == 0 and not (r.stdout + r.stderr).strip(),
          "systemd-analyze verify: rc %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    bad = os.path.join(vdir, "kvrail-bad.service")
    with open(bad, "w") as f:
        f.write(open(paths[0]).read().replace("LimitNOFILE=", "LimitNOFLE="))
    r = run(["systemd-analyze", "verify", bad], timeout=60, env=env)
    check("LimitNOFLE" in r.stdout + r.stderr, "control: verify said nothing about a bad key")
    print("systemd-analyze verify: %s clean; a misspelled key is reported" % ", ".join(units))

    # the units' ExecStart lines, as systemd would run them
    m = run([a.mkmodel, "--out", os.path.join(work, "model")], timeout=60)
    check(m.returncode == 0, "mkmodel: %s" % m.stderr)
    pc, pn = free_port(), free_port()
    cfg = os.path.join(work, "cluster.yaml")
    with open(cfg, "w") as f:
        f.write("model: model\nrouter: {client: 'tcp://127.0.0.1:%d', node: 'tcp://127.0.0.1:%d'}\n"
                "timeouts: {heartbeat_ms: 200}\nthresholds: {local_prefill_tokens: 8}\n"
                "nodes:\n  - {name: router, role: router}\n"
                "  - {name: prefill0, role: prefill}\n"
                "  - {name: decode0, role: decode, pool_blocks: 512}\n" % (pc, pn))
    os.makedirs(os.path.join(dest, "etc/kvrail"))
    with open(os.path.join(dest, "etc/kvrail/kvrail.env"), "w") as f:
        f.write("# written by install_test.py\nKVRAIL_CONFIG=%s\n" % cfg)
    libd = os.path.join(dest, prefix.lstrip("/"), libdir)
    exec_like_systemd(os.path.join(udir, "kvrail-router.service"), "", dest, pbin, libd, work,
                      "router")
    r = run([a.kvrail, "cluster", "wait", cfg, "--node", "router", "--timeout", "20000"],
            timeout=40)
    check(r.returncode == 0, "router unit: %s" % r.stderr)
    exec_like_systemd(os.path.join(udir, "kvrail-prefill@.service"), "prefill0", dest, pbin, libd,
                      work, "prefill0")
    exec_like_systemd(os.path.join(udir, "kvrail-decode@.service"), "decode0", dest, pbin, libd,
                      work, "decode0")
    r = run([a.kvrail, "cluster", "wait", cfg, "--timeout", "30000"], timeout=50)
    check(r.returncode == 0, "nodes from the units did not register: %s" % r.stderr)
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    ref = run([a.kvrail, "run", "--model", os.path.join(work, "model"), "--prompt", prompt,
               "--max-tokens", "8", "--json"], timeout=60)
    got = run([a.kvrail, "generate", "--router", "tcp://127.0.0.1:%d" % pc, "--max-tokens", "8",
               "--json", prompt], timeout=60)
    ids = lambda s: [o["token_id"] for o in map(json.loads, s.splitlines()) if "token_id" in o]  # noqa: E731,E501
    check(ref.returncode == 0 and got.returncode == 0 and ids(got.stdout) == ids(ref.stdout)
          and ids(got.stdout), "generate %s (%s) != run %s" % (got.stdout, got.stderr,
                                                              ref.stdout))
    print("ExecStart of kvrail-router, kvrail-prefill@prefill0, kvrail-decode@decode0: "
          "1P+1D up, generate == run (%d tokens)" % len(ids(got.stdout)))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["install", "systemd"])
    ap.add_argument("--build", required=True)
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    a = ap.parse_args()
    work = workdir("kvr-install-")
    dest = os.path.join(work, "dest")
    rc = 1
    try:
        rc = case_install(a, dest, work) or 0 if a.case == "install" else case_systemd(a, dest,
                                                                                         work)
    except Fail as e:
        print("FAIL:", e)
        for lg in sorted(glob.glob(os.path.join(work, "*.log"))):
            print("---", lg, "\n" + "".join(open(lg, errors="replace").readlines()[-10:]))
    finally:
        reap_all()
        if rc != 1:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
