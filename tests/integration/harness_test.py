#!/usr/bin/env python3
"""harness_test.py - cluster_lib's process groups reap on every exit path.

A child harness (this file with --child MODE) spawns, through
cluster_lib.spawn, `sh -c 'sleep 300 & echo $!; wait'` (a leader and a
grandchild in its group), prints both pids, then ends by MODE:
  exception  an uncaught exception (atexit reaps),
  exit       sys.exit(3) without stopping anything (atexit reaps),
  sigterm    waits to be sent SIGTERM (what meson's timeout sends; the
             handler reaps and exits 128+15),
  sigkill    waits to be sent SIGKILL (no code runs: the leader dies by
             PR_SET_PDEATHSIG; its own children are its business, so only
             the leader is asserted).
For each mode: the harness exits as described and every asserted pid is
gone (polled with a deadline, zombies count as gone).
"""
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_lib import spawn  # noqa: E402


def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def child(mode):
    # a parent that waited in vain asks where this process is (SIGUSR1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    p = spawn(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grand = int(p.stdout.readline())
    print(p.pid, grand, flush=True)
    if mode == "exception":
        raise RuntimeError("deliberate")
    if mode == "exit":
        sys.exit(3)
    # Wait for the signal in short sleeps: CPython runs a Python signal
    # handler only back in its eval loop, and a signal that lands after the
    # check and before a blocking call begins (here: one 300 s sleep) waits
    # for that call to end; a harness's own waits are short polls like these.
    for _ in range(3000):
        time.sleep(0.1)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    bad = 0
    for mode, want_rc, check_grand in (("exception", 1, True), ("exit", 3, True),
                                       ("sigterm", 128 + 15, True), ("sigkill", -9, False)):
        err = tempfile.TemporaryFile(mode="w+")
        h = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", mode],
                             stdout=subprocess.PIPE, stderr=err, text=True,
                             start_new_session=True)
        try:
            leader, grand = map(int, h.stdout.readline().split())
            if mode == "sigterm":
                h.send_signal(signal.SIGTERM)
            elif mode == "sigkill":
                h.kill()
            try:
                rc = h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # where it is stuck: its threads' stacks (faulthandler), then its stderr
                h.send_signal(signal.SIGUSR1)
                try:
                    h.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                err.seek(0)
                print("%s: the harness did not exit within 30 s; its stderr:\n%s" %
                      (mode, err.read()[-4000:]))
                raise
            pids = [leader, grand] if check_grand else [leader]
            deadline = time.monotonic() + 15
            while not all(gone(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [p for p in pids if not gone(p)]
            ok = rc == want_rc and not left
            print("%-9s harness exit %d (want %d), left running: %s -> %s" % (
                mode, rc, want_rc, left, "ok" if ok else "FAIL"))
            bad += not ok
        finally:
            err.close()
            try:
                os.killpg(h.pid, signal.SIGKILL)
            except OSError:
                pass
            for p in (locals().get("leader"), locals().get("grand")):
                if p and not gone(p):
                    os.kill(p, signal.SIGKILL)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
