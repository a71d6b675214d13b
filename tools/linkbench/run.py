"""run.py - runs kvr-link-bench against real routers: one with auth: none
(both links over NULL) and one with auth: curve (both links over CURVE,
keys from kvrail keygen), one after the other.  The router answers PING
itself: no nodes are started (the file names one of each, as it must).

  python3 tools/linkbench/run.py --build BUILD [--rounds N] [--block N]

BUILD is a meson build directory (kvrail-router, kvrail, kvrail-mkmodel,
kvr-link-bench are taken from it).  Prints kvr-link-bench's tables.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import cluster_lib as cl  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--block", type=int, default=100)
    a = ap.parse_args()
    b = os.path.abspath(a.build)
    router = os.path.join(b, "router", "kvrail-router")
    kvrail = os.path.join(b, "tools", "kvrail", "kvrail")
    bench = os.path.join(b, "tools", "linkbench", "kvr-link-bench")
    wd = cl.workdir("kvr-linkbench-")
    model = os.path.join(wd, "model")
    r = cl.run([os.path.join(b, "tools", "mkmodel", "kvrail-mkmodel"), "--out", model],
               timeout=60)
    cl.check(r.returncode == 0, "kvrail-mkmodel: %s" % r.stderr)
    for auth in ("none", "curve"):
        d = os.path.join(wd, auth)
        os.makedirs(d)
        ep = "tcp://127.0.0.1:%d" % cl.free_port()
        cfg = os.path.join(d, "cluster.yaml")
        with open(cfg, "w") as f:
            f.write("cluster: bench\nmodel: %s\nblock_size: 16\nrouter:\n  client: %s\n"
                    "  node: tcp://127.0.0.1:%d\nnodes:\n  - name: router\n    role: router\n"
                    "  - name: prefill0\n    role: prefill\n"
                    "  - name: decode0\n    role: decode\n"
                    "auth: %s\n" % (model, ep, cl.free_port(), auth))
            if auth == "curve":
                f.write("keys: keys\n")
        env = dict(os.environ)
        env.pop("KVRAIL_ROUTER_KEY", None)
        env.pop("KVRAIL_CLIENT_KEY", None)
        if auth == "curve":
            r = cl.run([kvrail, "keygen", "--config", cfg, "--client", "bench"], timeout=30)
            cl.check(r.returncode == 0, "kvrail keygen: %s %s" % (r.stdout, r.stderr))
            env["KVRAIL_ROUTER_KEY"] = os.path.join(d, "keys", "router.pub")
            env["KVRAIL_CLIENT_KEY"] = os.path.join(d, "keys", "clients", "bench.key")
        p = cl.spawn([router, "--config", cfg, "--node", "router"],
                     stdout=open(os.path.join(d, "router.log"), "w"), stderr=subprocess.STDOUT)
        try:
            r = cl.run([bench, "--router", ep, "--rounds", str(a.rounds), "--block",
                        str(a.block)], timeout=600, env=env)
            print(r.stdout + r.stderr)
            cl.check(r.returncode == 0, "kvr-link-bench failed")
        finally:
            cl.stop_group(p)


if __name__ == "__main__":
    cl.run_main(main)
