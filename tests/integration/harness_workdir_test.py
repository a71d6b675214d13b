#!/usr/bin/env python3
"""harness_workdir_test.py - cluster_lib's work directories go on every exit path.

A child harness (this file with --child MODE, TMPDIR a fresh directory of
this test's) makes a workdir() through cluster_lib, puts a model in it
(model/config.json, model/model.safetensors), starts through
cluster_lib.spawn a writer that logs there until stopped and writes a last
line on SIGTERM (a node logging its shutdown), prints the directory, then
ends by MODE:
  pass       run_main's fn returns 0: the directory is removed,
  skip       returns 77 (skipped): removed,
  fail       raises Fail: kept, its log and config.json still there, the
             weights removed, "kept DIR for diagnosis" on stderr,
  exception  raises RuntimeError: kept as for fail,
  exit       sys.exit(3) outside run_main (atexit): kept as for fail,
  sigterm    waits to be sent SIGTERM (meson's timeout): kept as for fail,
  keep       KVR_KEEP_WORKDIR=1 and returns 0: kept whole, weights included.
The writer makes the order matter: a directory removed before its writer
is reaped comes back with the last line in it, so pass and skip also fail
if the cleanup ran before the reap.  At the end nothing but
the kept directories was left in TMPDIR; this test removes those itself.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402

WEIGHTS = 1 << 20


def child(mode):
    def fn():
        d = cl.workdir("kvr-harness-wd-")
        os.mkdir(os.path.join(d, "model"))
        with open(os.path.join(d, "model", "config.json"), "w") as f:
            f.write("{}\n")
        with open(os.path.join(d, "model", "model.safetensors"), "wb") as f:
            f.write(b"\0" * WEIGHTS)
        log = os.path.join(d, "node.log")
        # logs until stopped, and a last line when sent SIGTERM (a node
        # logging its shutdown), making its directory again if it is gone:
        # the race of a cleanup before the reap (rmtree against a writer)
        # made certain, so the directory stays if the order is wrong
        cl.spawn(["sh", "-c", 'trap \'mkdir -p "${0%/*}"; echo stopping >> "$0"; exit 0\' TERM; '
                  'while :; do echo line >> "$0"; sleep 0.05; done', log])
        cl.wait_for("the writer's first line", lambda: os.path.exists(log), timeout=10)
        print(d, flush=True)
        if mode == "fail":
            raise cl.Fail("deliberate")
        if mode == "exception":
            raise RuntimeError("deliberate")
        if mode == "sigterm":
            for _ in range(3000):  # short sleeps: see harness_test.py
                time.sleep(0.1)
        return 77 if mode == "skip" else 0

    if mode == "exit":
        # a script that exits without run_main: only atexit sees the end
        fn()
        sys.exit(3)
    cl.run_main(fn)


# mode -> (exit status, directory kept, weights kept)
CASES = {"pass": (0, False, False), "skip": (77, False, False), "fail": (1, True, False),
         "exception": (1, True, False), "exit": (3, True, False),
         "sigterm": (128 + 15, True, False), "keep": (0, True, True)}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="kvr-harness-wd-test-")
    bad = 0
    try:
        for mode, (want_rc, want_kept, want_weights) in CASES.items():
            env = dict(os.environ, TMPDIR=tmp)
            env.pop(cl.KEEP_ENV, None)
            if mode == "keep":
                env[cl.KEEP_ENV] = "1"
            err = tempfile.TemporaryFile(mode="w+")
            h = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", mode],
                                 stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                 start_new_session=True)
            try:
                d = h.stdout.readline().strip()
                if mode == "sigterm" and d:
                    h.send_signal(signal.SIGTERM)
                rc = h.wait(timeout=30)
                err.seek(0)
                stderr = err.read()
            finally:
                err.close()
                cl.killgroup(h, signal.SIGKILL)
            problems = []
            if not d.startswith(tmp + "/"):
                problems.append("printed %r, not a directory under TMPDIR" % d)
            if rc != want_rc:
                problems.append("exit %d, want %d" % (rc, want_rc))
            if os.path.isdir(d) != want_kept:
                problems.append("directory %s" % ("removed" if want_kept else "left behind"))
            if want_kept and os.path.isdir(d):
                for f in ("node.log", "model/config.json"):
                    if not os.path.exists(os.path.join(d, f)):
                        problems.append("kept directory lost %s" % f)
                w = os.path.exists(os.path.join(d, "model", "model.safetensors"))
                if w != want_weights:
                    problems.append("weights %s" % ("removed" if want_kept else "kept"))
                said = ("kept %s (%s=1)" % (d, cl.KEEP_ENV) if want_weights
                        else "kept %s for diagnosis" % d)
                if said not in stderr:
                    problems.append("stderr does not say %r" % said)
            elif "kept " in stderr:
                problems.append("stderr says kept for a removed directory")
            print("%-9s exit %d, directory %s -> %s" % (
                mode, rc, "kept" if os.path.isdir(d) else "removed",
                "ok" if not problems else "FAIL: " + "; ".join(problems)))
            if problems:
                print("  its stderr:\n" + stderr[-3000:])
            bad += bool(problems)
            if os.path.isdir(d):
                shutil.rmtree(d)
        left = os.listdir(tmp)
        if left:
            print("FAIL: left in TMPDIR: %s" % left)
            bad += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
