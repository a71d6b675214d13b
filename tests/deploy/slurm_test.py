#!/usr/bin/env python3
"""slurm_test.py - deploy/slurm/kvrail.sbatch under a real Slurm on this machine.

Starts munged, slurmctld and slurmd (Debian's slurm-wlm and munge) from a
generated slurm.conf in a temporary directory (one node: this host, its
CPUs; proctrack/linuxproc, no cgroups), submits the batch script with
`--prefill 1 --decode 1` over a template whose nodes are on localhost, and
asserts: the job runs and the script renders the cluster onto the job's
node, starts router, prefill0 and decode0 as job steps and writes `ready`;
a generation through the router gives the same tokens as `kvrail run`;
`scancel` ends the job and leaves no kvrail process and no job step.
Reports the time from sbatch to the first generated token.

Exits 77 only where Slurm cannot run here: the packages are missing (they are
in tools/install-deps.sh --test) or slurmd/slurmctld do not come up (their
log tail is printed as the reason).

usage: slurm_test.py --src DIR --kvrail BIN --mkmodel BIN --bin-dir DIR|BIN...
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Fail, check, free_port, reap_all, run, spawn, wait_for, workdir  # noqa: E402

SKIP = 77
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "srun", "sinfo")


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no %s)" % path


def procs_of(tmp):
    """pids of processes that belong to this test's Slurm: their environment
    names our slurm.conf or their command line our directory."""
    out = []
    conf = ("SLURM_CONF=%s/slurm.conf" % tmp).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read()
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read()
            with open("/proc/%s/stat" % d) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if conf in env.split(b"\0") or tmp.encode() in cmd:
            out.append((int(d), cmd.replace(b"\0", b" ").decode(errors="replace").strip()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--mkmodel", required=True)
    ap.add_argument("--bin-dir", nargs="+", required=True,
                    help="folders (or the binaries) of kvrail-{router,prefill,decode}")
    a = ap.parse_args()
    missing = [t for t in TOOLS if not shutil.which(t, path=os.environ.get("PATH", "") +
                                                    ":/usr/sbin:/sbin")]
    if missing:
        print("SKIP: %s not installed (tools/install-deps.sh --test installs slurm-wlm munge)"
              % " ".join(missing))
        return SKIP
    if os.geteuid() != 0:
        print("SKIP: slurmd must run as root to start job steps as the submitting user")
        return SKIP
    tmp = workdir("kvr-slurm-")
    os.chmod(tmp, 0o700)
    env = dict(os.environ, SLURM_CONF=os.path.join(tmp, "slurm.conf"),
               PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    ok, rc = False, 1
    try:
        # munge with its own key and socket
        key = os.path.join(tmp, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = os.path.join(tmp, "munge.sock")
        spawn(["munged", "-F", "--force", "-S", sock, "--key-file", key, "--log-file",
               os.path.join(tmp, "munged.log"), "--pid-file", os.path.join(tmp, "munged.pid"),
               "--seed-file", os.path.join(tmp, "munged.seed")], env=env,
              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "munged.err"), "w"))
        try:
            wait_for("munged's socket", lambda: os.path.exists(sock), 15)
        except Fail:
            print("SKIP: munged did not start:\n" + tail(os.path.join(tmp, "munged.err")) +
                  tail(os.path.join(tmp, "munged.log")))
            return SKIP

        host = socket.gethostname().split(".")[0]
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        cpus = os.cpu_count() or 1
        for d in ("state", "spool"):
            os.mkdir(os.path.join(tmp, d))
        conf = """ClusterName=kvrtest
SlurmctldHost={host}
SlurmUser={user}
SlurmdUser=root
SlurmctldPort={cport}
SlurmdPort={dport}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmdTimeout=60
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=kvr Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""".format(host=host, user=user, cport=free_port(), dport=free_port(), sock=sock, tmp=tmp,
           cpus=cpus)
        with open(env["SLURM_CONF"], "w") as f:
            f.write(conf)
        spawn(["slurmctld", "-D", "-i", "-f", env["SLURM_CONF"]], env=env,
              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "slurmctld.err"), "w"))
        spawn(["slurmd", "-D", "-N", host, "-f", env["SLURM_CONF"]], env=env,
              stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "slurmd.err"), "w"))

        def node_idle():
            r = run(["sinfo", "-h", "-N", "-o", "%T"], timeout=20, env=env)
            return r.returncode == 0 and r.stdout.strip() in ("idle", "mixed")
        try:
            wait_for("the Slurm node to be idle", node_idle, 40, step=0.5)
        except Fail:
            print("SKIP: slurmctld/slurmd did not come up here:\n--- slurmctld\n%s--- slurmd\n%s"
                  % (tail(os.path.join(tmp, "slurmctld.log")) + tail(os.path.join(
                      tmp, "slurmctld.err")), tail(os.path.join(tmp, "slurmd.log")) +
                     tail(os.path.join(tmp, "slurmd.err"))))
            return SKIP
        print("slurm: munged, slurmctld, slurmd up; node %s idle (%d CPUs)" % (host, cpus))

        # the cluster: a template on localhost, binaries in one folder
        bindir = os.path.join(tmp, "bin")
        os.mkdir(bindir)
        os.symlink(os.path.abspath(a.kvrail), os.path.join(bindir, "kvrail"))
        for d in a.bin_dir:
            d = d if os.path.isdir(d) else os.path.dirname(d)
            for role in ("router", "prefill", "decode"):
                p = os.path.join(d, "kvrail-" + role)
                if os.path.exists(p) and not os.path.exists(os.path.join(bindir, "kvrail-" + role)):
                    os.symlink(os.path.abspath(p), os.path.join(bindir, "kvrail-" + role))
        m = run([a.mkmodel, "--out", os.path.join(tmp, "model")], timeout=60)
        check(m.returncode == 0, "mkmodel: %s" % m.stderr)
        pc = free_port()
        tmpl = os.path.join(tmp, "template.yaml")
        with open(tmpl, "w") as f:
            f.write("model: model\nrouter: {client: 'tcp://127.0.0.1:%d', node: "
                    "'tcp://127.0.0.1:%d'}\ntimeouts: {heartbeat_ms: 200}\n"
                    "thresholds: {local_prefill_tokens: 8}\nnodes:\n"
                    "  - {name: router, role: router}\n  - {name: p, role: prefill}\n"
                    "  - {name: d, role: decode, pool_blocks: 512}\n" % (pc, free_port()))
        jobdir = os.path.join(tmp, "job")
        t0 = time.monotonic()
        r = run(["sbatch", "--parsable", "-N1", "-n1", "--chdir", tmp, "--output",
                 os.path.join(tmp, "job.out"),
                 "--export=ALL,KVRAIL_BIN_DIR=%s,KVRAIL_LOG_DIR=%s,KVRAIL_WAIT_MS=60000" % (
                     bindir, jobdir),
                 os.path.join(a.src, "deploy", "slurm", "kvrail.sbatch"), tmpl, "--prefill", "1",
                 "--decode", "1"], timeout=30, env=env)
        check(r.returncode == 0, "sbatch: %s" % r.stderr)
        job = r.stdout.strip().split(";")[0]

        def job_state():
            q = run(["squeue", "-h", "-j", job, "-o", "%T"], timeout=20, env=env)
            return q.stdout.strip()

        def ready():
            st = job_state()
            if st not in ("PENDING", "CONFIGURING", "RUNNING"):
                raise Fail("job %s is %r before ready:\n%s" % (job, st, tail(
                    os.path.join(tmp, "job.out"))))
            return os.path.exists(os.path.join(jobdir, "ready"))
        wait_for("the job's ready file", ready, 90, step=0.2)
        with open(os.path.join(jobdir, "ready")) as f:
            ep = f.read().strip()
        check(ep == "tcp://%s:%d" % (host, pc), "router endpoint %s" % ep)
        prompt = "The quick brown fox jumps over the lazy dog. " * 4
        got = run([a.kvrail, "generate", "--router", ep, "--max-tokens", "8", "--json", prompt],
                  timeout=60)
        t_first = time.monotonic() - t0
        ref = run([a.kvrail, "run", "--model", os.path.join(tmp, "model"), "--prompt", prompt,
                   "--max-tokens", "8", "--json"], timeout=60)
        ids = lambda s: [o["token_id"] for o in map(json.loads, s.splitlines()) if "token_id" in o]  # noqa: E731,E501
        check(got.returncode == 0 and ref.returncode == 0 and ids(got.stdout) == ids(ref.stdout)
              and ids(got.stdout), "generate %s %s != run %s" % (got.stdout, got.stderr,
                                                                 ref.stdout))
        steps = run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], timeout=20, env=env).stdout
        check(all("kvrail-" + n in steps for n in ("router", "prefill0", "decode0")),
              "job steps: %s" % steps)
        print("job %s: router, prefill0, decode0 as job steps; generate == run (%d tokens); "
              "sbatch -> last token of the first generation %.1f s" % (job, len(ids(got.stdout)),
                                                                      t_first))

        r = run(["scancel", job], timeout=30, env=env)
        check(r.returncode == 0, "scancel: %s" % r.stderr)
        wait_for("the job to leave the queue", lambda: job_state() == "", 60, step=0.3)
        left = wait_for("no kvrail process of the job",
                        lambda: [p for p in procs_of(jobdir)] == [] or None, 30, step=0.3) \
            if procs_of(jobdir) else True
        check(left, "left: %s" % procs_of(jobdir))
        out = open(os.path.join(tmp, "job.out")).read()
        check("stopping" in out, "the batch script did not stop its steps:\n" + out)
        print("scancel: job gone, no kvrail process left, the script stopped its steps")
        ok, rc = True, 0
    except Fail as e:
        print("FAIL:", e)
        for n in ("job.out", "slurmctld.log", "slurmd.log"):
            print("---", n, "\n" + tail(os.path.join(tmp, n)))
        jd = os.path.join(tmp, "job")
        for n in sorted(os.listdir(jd)) if os.path.isdir(jd) else []:
            if n.endswith(".log"):
                print("---", n, "\n" + tail(os.path.join(jd, n)))
    finally:
        run(["scancel", "--full", "-u", subprocess.run(["id", "-un"], capture_output=True,
                                                       text=True).stdout.strip()],
            timeout=30, env=env) if os.path.exists(env["SLURM_CONF"]) else None
        reap_all()
        # slurmstepd and the steps are not our children: kill what is left of ours
        for pid, _ in procs_of(tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
