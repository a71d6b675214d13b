"""monitoring_test.py - the Prometheus scrape config and the Grafana dashboard
of deploy/ (issue 11 item 4) against the real thing.

1. `promtool check config deploy/prometheus/prometheus.yml` passes, and its
   targets are exactly 127.0.0.1:<metrics_port> of every node of
   deploy/local/cluster.yaml (which `kvrail cluster nodes` still loads) plus
   the frontend's 127.0.0.1:8000.
2. deploy/grafana/kvrail.json is JSON with panels whose every target has a
   PromQL expression; `promtool check rules` parses all of them (written as
   recording rules, Grafana's $variables replaced by plain values).
3. A real 1 prefill + 1 decode cluster with metrics ports and a
   kvrail-frontend serves a small load (through the router and through the
   frontend); the test scrapes every process's /metrics and checks that
   every metric name any dashboard expression reads is a series some
   process exposes (`up` aside: Prometheus makes that one).  A renamed
   metric breaks this test, not a dashboard in production.
Needs promtool (Debian `prometheus`; tools/install-deps.sh --test): exits
77 without it.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_lib as cl  # noqa: E402
from cluster_lib import check  # noqa: E402
import metrics_test as mt  # noqa: E402  (add_ports, scrape, parse, wait_for, http_get)

IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool", "inf", "nan"}


def metric_names(expr):
    """The metric names a PromQL expression reads: identifiers that are not
    functions or aggregations (followed by '('), label names or values
    (inside {...} or by/without (...)), ranges, numbers, keywords or Grafana
    variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)
    names = set()
    for m in IDENT.finditer(e):
        w = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or w.lower() in KEYWORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue
        names.add(w)
    return names


def role_selectors(expr):
    """(metric, role) for every selector that pins role="..."."""
    return {(m.group(1), r.group(1))
            for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)
            for r in re.finditer(r'\brole="([^"]*)"', m.group(2))}


def load_targets(path):
    import yaml
    with open(path) as f:
        y = yaml.safe_load(f)
    out = {}
    for sc in y["scrape_configs"]:
        for st in sc.get("static_configs", []):
            for t in st["targets"]:
                out[t] = sc["job_name"]
    return out


def main():
    ap = argparse.ArgumentParser()
    cl.add_bin_args(ap)
    ap.add_argument("--frontend", required=True)
    ap.add_argument("--source-root", required=True)
    args = ap.parse_args()
    if not shutil.which("promtool"):
        print("SKIP: promtool not installed (tools/install-deps.sh --test installs the Debian "
              "package prometheus)")
        return cl.SKIP
    root = args.source_root
    prom_yml = os.path.join(root, "deploy/prometheus/prometheus.yml")
    dash_json = os.path.join(root, "deploy/grafana/kvrail.json")
    local_yaml = os.path.join(root, "deploy/local/cluster.yaml")

    # 1. the scrape config
    r = subprocess.run(["promtool", "check", "config", prom_yml], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "promtool check config: %s%s" % (r.stdout, r.stderr))
    r = subprocess.run([args.kvrail, "cluster", "nodes", local_yaml], capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 0, "deploy/local/cluster.yaml does not load: %s" % r.stderr)
    import yaml
    with open(local_yaml) as f:
        nodes = yaml.safe_load(f)["nodes"]
    want = {"127.0.0.1:%d" % n["metrics_port"] for n in nodes if n.get("metrics_port")}
    check(len(want) == len(nodes), "every node of deploy/local/cluster.yaml needs a metrics_port: "
          "%s" % nodes)
    want.add("127.0.0.1:8000")
    got = load_targets(prom_yml)
    check(set(got) == want, "prometheus.yml targets %s, cluster.yaml + frontend give %s"
          % (sorted(got), sorted(want)))
    print("ok promtool check config; targets %s match deploy/local/cluster.yaml + frontend"
          % sorted(got))

    # 2. the dashboard's expressions parse
    with open(dash_json) as f:
        dash = json.load(f)
    exprs = []
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        check(p.get("targets"), "panel %r has no targets" % p.get("title"))
        for t in p["targets"]:
            check(t.get("expr"), "panel %r: a target without expr" % p["title"])
            exprs.append((p["title"], t["expr"]))
    wd = cl.workdir("kvr-monitoring-")
    rules = os.path.join(wd, "dashboard.rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (_, e) in enumerate(exprs):
            e = e.replace("$__rate_interval", "1m").replace("$model", ".*")
            f.write("      - record: kvrail_dashboard_%d\n        expr: %s\n" % (i, json.dumps(e)))
    r = subprocess.run(["promtool", "check", "rules", rules], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "promtool check rules on the dashboard's expressions: %s%s"
          % (r.stdout, r.stderr))
    used, pinned = {}, {}
    for title, e in exprs:
        for n in metric_names(e):
            used.setdefault(n, title)
        for nr in role_selectors(e):
            pinned.setdefault(nr, title)
    print("ok %d panels, %d expressions parse (promtool check rules), %d metric names"
          % (sum(1 for p in dash["panels"] if p["type"] != "row"), len(exprs), len(used)))

    # 3. a running cluster serves every name the dashboard reads
    bins = cl.Bins(args)
    model = cl.make_model(bins, wd)
    c = cl.Cluster(bins, wd, model, n_prefill=1, n_decode=1, local_prefill_tokens=8)
    ports = {n: cl.free_port() for n in ("router", "prefill0", "decode0")}
    mt.add_ports(c.config, ports)
    fport = cl.free_port()
    try:
        c.start()
        c._start("frontend", [args.frontend, "--config", c.config, "--listen",
                              "127.0.0.1:%d" % fport])
        ports["frontend"] = fport
        prompts = [(list(range(5, 60)), 6), (list(range(9, 13)), 4)]
        rc, outs, log = c.loadgen(prompts)
        check(rc == 0 and len(outs) == 2, "kvrail-loadgen exit %d: %s" % (rc, log))
        mt.wait_for("frontend /ready", lambda: (mt.http_get(fport, "/ready")[0] == 200,
                                                mt.http_get(fport, "/ready")))
        conn = http.client.HTTPConnection("127.0.0.1", fport, timeout=60)
        body = json.dumps({"model": os.path.basename(model), "prompt": list(range(5, 40)),
                           "max_tokens": 4})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        check(resp.status == 200, "frontend completion: %d %s" % (resp.status, text))

        def router_counted():
            ms = mt.parse(mt.scrape(ports["router"]))
            n = sum(v for (name, _), v in ms.items() if name == "kvrail_router_requests_total")
            return n >= 3, "router requests_total %s" % n
        mt.wait_for("the router's metrics to count 3 requests", router_counted)
        served, served_roles = set(), set()
        for n, p in ports.items():
            for line in mt.scrape(p).splitlines():
                if line and not line.startswith("#"):
                    name = IDENT.match(line).group(0)
                    served.add(name)
                    r = re.search(r'\brole="([^"]*)"', line)
                    if r:
                        served_roles.add((name, r.group(1)))
        served.add("up")
        missing = {n: t for n, t in used.items() if n not in served}
        check(not missing, "the dashboard reads metrics no process serves: %s" % missing)
        missing = {"%s{role=%s}" % nr: t for nr, t in pinned.items() if nr not in served_roles}
        check(not missing, "the dashboard reads series of a role that does not serve them: %s"
              % missing)
        print("ok every metric the dashboard reads (%d) is served by router, prefill0, decode0 "
              "or the frontend (%d series names)" % (len(used), len(served)))
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    cl.run_main(main)
