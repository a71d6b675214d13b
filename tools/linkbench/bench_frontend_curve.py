"""bench_frontend_curve.py - tests/frontend/bench_frontend.py on an
`auth: curve` cluster, unchanged otherwise: its cluster file gets
`auth: curve` and `keys: keys`, `kvrail keygen` writes the keys, and
KVRAIL_ROUTER_KEY / KVRAIL_CLIENT_KEY are set for everything it starts
after (the frontends, both kvrail-loadgen clients); the nodes and the
router take theirs from the file.  Takes bench_frontend.py's arguments.

  python3 tools/linkbench/bench_frontend_curve.py --router B/router/kvrail-router ... \
      --frontend-args=--router-link=zmq --frontend-b-args=--router-link=direct
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "frontend"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
import cluster_lib as cl  # noqa: E402
import bench_frontend  # noqa: E402

_Cluster = cl.Cluster


class CurveCluster(_Cluster):
    def __init__(self, bins, workdir, model, **kw):
        kw["extra_yaml"] = kw.get("extra_yaml", "") + "auth: curve\nkeys: keys\n"
        _Cluster.__init__(self, bins, workdir, model, **kw)
        r = cl.run([bins.kvrail, "keygen", "--config", self.config, "--client", "bench"],
                   timeout=30)
        cl.check(r.returncode == 0, "kvrail keygen: %s %s" % (r.stdout, r.stderr))
        keys = os.path.join(workdir, "keys")
        os.environ["KVRAIL_ROUTER_KEY"] = os.path.join(keys, "router.pub")
        os.environ["KVRAIL_CLIENT_KEY"] = os.path.join(keys, "clients", "bench.key")
        print("auth: curve, keys in %s" % keys, flush=True)


def show_links_then_rmtree(path, *args, **kw):
    """Before the bench removes its folder: the links and the router's auth
    as the processes logged them (the proof that CURVE was on)."""
    for name in ("router.log", "frontend.log", "frontend-b.log"):
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    if "router link:" in line or "auth: curve" in line:
                        print("%s: %s" % (name, line.strip()[-120:]))
        except OSError:
            pass
    _rmtree(path, *args, **kw)


cl.Cluster = CurveCluster
bench_frontend.cl.Cluster = CurveCluster
_rmtree = bench_frontend.shutil.rmtree
bench_frontend.shutil.rmtree = show_links_then_rmtree
if __name__ == "__main__":
    sys.exit(bench_frontend.main())
