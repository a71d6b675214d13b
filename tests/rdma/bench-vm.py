#!/usr/bin/env python3
"""bench-vm.py BUILD - the verbs benchmark, run inside the rdma test VM by

    tests/rdma/vm.py --build-dir BUILD --guest $PWD/tests/rdma/guest.sh --cwd $PWD --mode bench

kvrail-bench --backend verbs beside perftest's ib_write_bw on the same
soft-RoCE device (rxe_lo, GID 1 = ::ffff:127.0.0.1), the same message sizes,
one message per post and the same number of messages in flight (ib_write_bw
-t DEPTH, kvrail-bench --depth DEPTH), interleaved size by size, REPS times;
best of each and the ratio per size.  Then the CPU cost per posted
descriptor: kvrail-bench's post time per descriptor (p50) with 1, 16 and 256
descriptors per post.

kvrail-bench runs as one process (--role local: initiator and target engines
in one thread).  With --role target the bench's target loop polls without
sleeping and takes one of the VM's two vCPUs from the kernel's rxe work;
ib_write_bw's server sleeps during the test.  One polling thread on each side
of the comparison is the like-for-like setup.

Under TCG the numbers are functional, not fast (tens of MB/s): the ratio is
what counts.  (tools/bench-transfer --verbs does the same on a machine with a
NIC; inside the loaded VM its 1 s start-up wait for ib_write_bw's server was
too short, so this script retries the client until the server listens.)
"""
import json
import os
import socket
import subprocess
import sys
import time

DEV, GID = "rxe_lo", "1"
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
REPS = int(os.environ.get("KVR_BENCH_REPS", "3"))
DEPTH = os.environ.get("KVR_BENCH_DEPTH", "64")
BYTES = int(os.environ.get("KVR_BENCH_BYTES", str(128 << 20)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ib_write_bw(size):
    """MB/s (1e6) of ib_write_bw at one size, or None."""
    n = max(200, min(20000, BYTES // size))
    port = free_port()
    base = ["ib_write_bw", "-d", DEV, "-x", GID, "-s", str(size), "-n", str(n), "-F",
            "-t", DEPTH, "--report_gbits", "-p", str(port)]
    srv = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(30):
            time.sleep(1)
            r = subprocess.run(base + ["127.0.0.1"], capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                for line in r.stdout.splitlines():
                    f = line.split()
                    if len(f) >= 4 and f[0] == str(size) and f[1].isdigit():
                        return float(f[3]) * 1e3 / 8.0
                return None
            if "Couldn't connect" not in r.stdout + r.stderr:
                sys.stderr.write(r.stdout[-500:] + r.stderr[-500:])
                return None
        return None
    finally:
        srv.kill()
        srv.wait()


def kvrail(bench, sizes, batch, duration=2.0):
    """kvrail-bench rows {size: row} (one process, --role local)."""
    r = subprocess.run([bench, "--role", "local", "--backend", "verbs", "--devices", DEV,
                        "--pool-size", "128M", "--sizes", ",".join(str(s) for s in sizes),
                        "--batch", str(batch), "--depth", DEPTH, "--duration", str(duration),
                        "--json", "--quiet"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.stderr.write("kvrail-bench failed: " + r.stderr[-800:])
        return {}
    doc = json.loads(r.stdout)
    return {row["block_size"]: row for row in doc.get("rows", []) if "error" not in row}


def bench_transfer(bench):
    """The project's side-by-side tool, as it runs on a machine with a NIC."""
    argv = [sys.executable, "tools/bench-transfer", "--verbs", DEV, "--gid-index", GID,
            "--bench", bench, "--sizes", "64K,256K,1M,4M", "--reps", "2", "--duration", "1",
            "--bytes", "128M", "--pool-size", "128M", "--depth", DEPTH, "--no-hot",
            "--timeout", "300"]
    print("$ " + " ".join(argv[1:]), flush=True)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1500)
    print(r.stdout, flush=True)
    if r.returncode != 0:
        print("bench-transfer exit %d: %s" % (r.returncode, r.stderr[-1500:]), flush=True)


def main():
    build = sys.argv[1]
    bench = os.path.join(build, "tools", "bench", "kvrail-bench")
    if os.path.exists("tools/bench-transfer"):
        bench_transfer(bench)
    peer = {s: [] for s in SIZES}
    kv = {s: [] for s in SIZES}
    for rep in range(REPS):
        print("repetition %d/%d" % (rep + 1, REPS), flush=True)
        for s in SIZES:  # interleaved: the machine's load drifts
            v = ib_write_bw(s)
            if v:
                peer[s].append(v)
            rows = kvrail(bench, [s], 1)
            if s in rows:
                kv[s].append(rows[s]["gbps"] * 1e3)
    print("\nverbs on %s (soft-RoCE, qemu TCG), one message per post, %s in flight, best of %d" %
          (DEV, DEPTH, REPS))
    print("%8s %24s %24s %7s" % ("size", "ib_write_bw MB/s", "kvrail-bench MB/s", "ratio"))
    print("%8s %24s %24s %7s" % ("", "best (min-max)", "best (min-max)", "best"))

    def cell(v):
        return "%.1f (%.1f-%.1f)" % (max(v), min(v), max(v)) if v else "-"

    for s in SIZES:
        p = max(peer[s]) if peer[s] else None
        k = max(kv[s]) if kv[s] else None
        print("%7dK %24s %24s %7s" % (s >> 10, cell(peer[s]), cell(kv[s]),
                                      "%.2f" % (k / p) if p and k else "-"))
    print("\nCPU per posted descriptor (kvrail-bench post time / descriptors, p50), 4 KiB")
    print("%6s %12s %10s" % ("batch", "us/desc", "MB/s"))
    for b in (1, 16, 256):
        rows = kvrail(bench, [4096], b, 1.0)
        if 4096 in rows:
            r = rows[4096]
            print("%6d %12.3f %10.1f" % (b, r.get("post_ns_per_desc_p50", float("nan")) / 1e3, r["gbps"] * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
