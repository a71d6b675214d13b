#!/usr/bin/env python3
"""k8s_test.py - deploy/k8s rendered and validated offline.

Every overlay under deploy/k8s/overlays is rendered with `kubectl kustomize`
(where kubectl is installed; there the test also checks that
mini_kustomize.py renders the same objects, the ConfigMap hash aside; without
kubectl, mini_kustomize.py renders them) and every object validated against the Kubernetes OpenAPI schemas of the npm
package kubernetes-models (tests/deploy/k8s/validate.mjs; npm ci into the
build dir).  A control: the same validator must reject a copy with a
StatefulSet's replicas made a string.  Then what the schema cannot know:
the ConfigMap's cluster.yaml loads with kvrail's own strict loader (`kvrail
cluster nodes`); each StatefulSet kvrail-ROLE with R replicas matches exactly
the nodes kvrail-ROLE-0..R-1 of that role in the cluster file (pod names are
node names); the router Service's ports are the cluster file's endpoint
ports and the router runs the file's router node; every workload mounts the
generated ConfigMap and has liveness and readiness probes; selectors match
the pod labels; the frontend pods carry the Prometheus annotations; the xpyd
overlay requests nvidia.com/gpu and an rdma/ resource on every node.

usage: k8s_test.py --kvrail BIN --src DIR --work DIR
Exits 77 when node/npm or the npm registry are missing.
"""
import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from cluster_lib import Fail, check, reap_all, run  # noqa: E402

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml missing (tools/install-deps.sh installs it)")
    sys.exit(77)


def npm_modules(here, work):
    if not shutil.which("node") or not shutil.which("npm"):
        print("SKIP: node/npm not installed (tools/install-deps.sh --test installs nodejs npm)")
        sys.exit(77)
    os.makedirs(work, exist_ok=True)
    lock = os.path.join(here, "package-lock.json")
    stamp = os.path.join(work, ".installed-lock")
    mods = os.path.join(work, "node_modules")
    if os.path.exists(stamp) and open(stamp).read() == open(lock).read() \
            and os.path.exists(os.path.join(mods, "kubernetes-models", "package.json")):
        return mods
    shutil.copy(os.path.join(here, "package.json"), work)
    shutil.copy(lock, work)
    r = run(["npm", "ci", "--prefix", work, "--no-audit", "--no-fund", "--loglevel=error"],
            timeout=270)
    if r.returncode != 0:
        if run(["npm", "ping"], timeout=30).returncode != 0:
            print("SKIP: the npm registry cannot be reached (npm ping failed); "
                  "the schema check needs kubernetes-models")
            sys.exit(77)
        raise Fail("npm ci failed: %s" % r.stderr)
    shutil.copy(lock, stamp)
    return mods


def validate(here, mods, path):
    return run(["node", os.path.join(here, "validate.mjs"), "--modules", mods, path], timeout=120)


def workloads(objs):
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def check_overlay(name, objs, kvrail, tmp):
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    cms = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
        "kvrail-cluster")]
    check(len(cms) == 1, "%s: %d kvrail-cluster ConfigMaps" % (name, len(cms)))
    cm = cms[0]
    text = cm["data"]["cluster.yaml"]
    cf = os.path.join(tmp, name + ".cluster.yaml")
    with open(cf, "w") as f:
        f.write(text)
    r = run([kvrail, "cluster", "nodes", cf], timeout=30)
    check(r.returncode == 0, "%s: the ConfigMap's cluster.yaml does not load: %s" % (name, r.stderr))
    nodes = [line.split() for line in r.stdout.splitlines()]
    cluster = yaml.safe_load(text)
    for role in ("prefill", "decode"):
        ss = by.get(("StatefulSet", "kvrail-" + role))
        check(ss is not None, "%s: no StatefulSet kvrail-%s" % (name, role))
        want = ["kvrail-%s-%d" % (role, i) for i in range(ss["spec"].get("replicas", 1))]
        have = [n for n, rl, _ in nodes if rl == role]
        check(have == want, "%s: StatefulSet kvrail-%s makes pods %s but the cluster file has %s"
              " %s nodes" % (name, role, want, have, role))
        check(ss["spec"]["serviceName"] in {o["metadata"]["name"] for o in objs
                                            if o["kind"] == "Service"},
              "%s: StatefulSet %s's serviceName has no Service" % (name, role))
    routers = [n for n, rl, _ in nodes if rl == "router"]
    rd = by[("Deployment", "kvrail-router")]
    args = rd["spec"]["template"]["spec"]["containers"][0]["args"]
    check(args[args.index("--node") + 1] in routers, "%s: router runs %s, file has %s" % (
        name, args, routers))
    svc_ports = sorted(p["port"] for p in by[("Service", "kvrail-router")]["spec"]["ports"])
    file_ports = sorted(int(cluster["router"][k].rsplit(":", 1)[1]) for k in ("client", "node"))
    check(svc_ports == file_ports, "%s: router Service ports %s, cluster file %s" % (
        name, svc_ports, file_ports))
    check(cluster["router"]["client"].split("//")[1].split(":")[0] == "kvrail-router",
          "%s: router.client is not the router Service" % name)
    for w in workloads(objs):
        wn = "%s %s" % (w["kind"], w["metadata"]["name"])
        pod = w["spec"]["template"]
        check(w["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
              "%s: %s selector does not match its pod labels" % (name, wn))
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        check(vols.get("cluster", {}).get("configMap", {}).get("name") == cm["metadata"]["name"],
              "%s: %s does not mount ConfigMap %s" % (name, wn, cm["metadata"]["name"]))
        for c in pod["spec"]["containers"]:
            check("livenessProbe" in c and "readinessProbe" in c,
                  "%s: %s container %s lacks a probe" % (name, wn, c["name"]))
        if w["metadata"]["name"] == "kvrail-frontend":
            ann = pod["metadata"].get("annotations", {})
            check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port"),
                  "%s: frontend lacks Prometheus annotations" % name)
        if name == "xpyd" and w["kind"] == "StatefulSet":
            lim = pod["spec"]["containers"][0]["resources"]["limits"]
            check(lim.get("nvidia.com/gpu") == 1 and any(k.startswith("rdma/") for k in lim),
                  "%s: %s does not request a GPU and an RDMA device: %s" % (name, wn, lim))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvrail", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import mini_kustomize
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("kubectl not installed (Debian 12 has no package): rendering with mini_kustomize.py")
    kdir = os.path.join(here, "k8s")
    tmp = tempfile.mkdtemp(prefix="kvr-k8s-")
    try:
        mods = npm_modules(kdir, a.work)
        odir = os.path.join(a.src, "deploy", "k8s", "overlays")
        overlays = sorted(os.listdir(odir))
        check({"1p1d", "xpyd"} <= set(overlays), "overlays: %s" % overlays)
        for name in overlays:
            mini = mini_kustomize.render(os.path.join(odir, name))
            if kubectl:
                r = run([kubectl, "kustomize", os.path.join(odir, name)], timeout=60)
                check(r.returncode == 0, "kubectl kustomize %s: %s" % (name, r.stderr))
                objs = [o for o in yaml.safe_load_all(r.stdout) if o]
                unhash = lambda objs: sorted(re.sub(  # noqa: E731
                    r"kvrail-cluster-[a-z0-9]+", "kvrail-cluster-H", json.dumps(o, sort_keys=True))
                    for o in objs)
                check(unhash(objs) == unhash(mini),
                      "%s: mini_kustomize.py renders other objects than kubectl" % name)
            else:
                objs = mini
            out = os.path.join(tmp, name + ".yaml")
            with open(out, "w") as f:
                yaml.safe_dump_all(objs, f)
            v = validate(kdir, mods, out)
            check(v.returncode == 0, "%s: schema validation failed:\n%s%s" % (name, v.stdout,
                                                                             v.stderr))
            check_overlay(name, objs, a.kvrail, tmp)
            print("%s: %d objects rendered (%s), schema-valid, consistent with the cluster file" % (
                name, len(objs), "kubectl kustomize == mini_kustomize.py" if kubectl else
                "mini_kustomize.py"))
            if name == "1p1d":  # control: the validator rejects a broken copy
                bad = copy.deepcopy(objs)
                next(o for o in bad if o["kind"] == "StatefulSet")["spec"]["replicas"] = "two"
                bp = os.path.join(tmp, "bad.yaml")
                with open(bp, "w") as f:
                    yaml.safe_dump_all(bad, f)
                v = validate(kdir, mods, bp)
                check(v.returncode == 1 and "replicas" in v.stdout,
                      "the validator accepted replicas: two:\n%s" % v.stdout)
                print("control: replicas \"two\" rejected by the schema")
        return 0
    except (Fail, mini_kustomize.Error) as e:
        print("FAIL:", e)
        return 1
    finally:
        reap_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
