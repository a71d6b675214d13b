"""mini_kustomize.py - the part of Kustomize that deploy/k8s uses, for
machines without kubectl (Debian 12 has no kubectl package).

Supports: resources (files and directories), components (Component with
JSON6902 `patches` whose target names kind and a name regex), a
configMapGenerator (files, behavior create/replace, the name suffixed with a
hash of the data and every configMap volume renamed to match), `replicas`,
`labels` (pairs added to every object's metadata.labels) and `images`
(newName/newTag).  Anything else in a kustomization.yaml is an error, so a
feature added to deploy/k8s without support here fails the test instead of
being ignored.  k8s_test.py checks that this renders what `kubectl
kustomize` renders wherever kubectl is installed.
"""
import copy
import hashlib
import json
import os
import re

import yaml

KNOWN = {"apiVersion", "kind", "resources", "components", "configMapGenerator", "replicas",
         "labels", "images", "patches"}


class Error(Exception):
    pass


def _load_kust(d):
    p = os.path.join(d, "kustomization.yaml")
    with open(p) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KNOWN
    if unknown:
        raise Error("%s: keys this renderer does not implement: %s" % (p, sorted(unknown)))
    return k


def _ptr(path):
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def _json6902(obj, ops):
    for op in ops:
        if op["op"] not in ("add", "replace"):
            raise Error("patch op %s not implemented" % op["op"])
        keys = _ptr(op["path"])
        cur = obj
        for k in keys[:-1]:
            cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
        last = keys[-1]
        if isinstance(cur, list):
            if last == "-":
                cur.append(op["value"])
            else:
                cur.insert(int(last), op["value"]) if op["op"] == "add" else \
                    cur.__setitem__(int(last), op["value"])
        else:
            cur[last] = copy.deepcopy(op["value"])


def _apply_patches(objs, patches):
    for p in patches or []:
        t = p["target"]
        ops = yaml.safe_load(p["patch"])
        for o in objs:
            if o["kind"] == t.get("kind", o["kind"]) and \
                    re.fullmatch(t.get("name", ".*"), o["metadata"]["name"]):
                _json6902(o, ops)


def _cm_hash(cm):
    data = json.dumps({"kind": "ConfigMap", "name": cm["metadata"]["name"], "data": cm["data"]},
                      sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:10]


def _build(d):
    k = _load_kust(d)
    objs, gens = [], {}
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(d, r))
        if os.path.isdir(p):
            sub, subgens = _build(p)
            objs += sub
            gens.update(subgens)
        else:
            with open(p) as f:
                objs += [o for o in yaml.safe_load_all(f) if o]
    for c in k.get("components", []):
        ck = _load_kust(os.path.join(d, c))
        if ck.get("kind") != "Component":
            raise Error("%s is not a Component" % c)
        _apply_patches(objs, ck.get("patches"))
    _apply_patches(objs, k.get("patches"))
    for g in k.get("configMapGenerator", []):
        data = {}
        for f in g.get("files", []):
            with open(os.path.join(d, f)) as fh:
                data[os.path.basename(f)] = fh.read()
        beh = g.get("behavior", "create")
        if beh == "replace":
            if g["name"] not in gens:
                raise Error("configMapGenerator %s: nothing to replace" % g["name"])
        elif beh != "create":
            raise Error("configMapGenerator behavior %s not implemented" % beh)
        gens[g["name"]] = {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": g["name"]}, "data": data}
    for r in k.get("replicas", []):
        hit = [o for o in objs if o["metadata"]["name"] == r["name"] and o["kind"] in (
            "Deployment", "StatefulSet", "ReplicaSet", "ReplicationController")]
        if not hit:
            raise Error("replicas: no object %s" % r["name"])
        for o in hit:
            o["spec"]["replicas"] = r["count"]
    for lb in k.get("labels", []):
        for o in objs + list(gens.values()):
            o["metadata"].setdefault("labels", {}).update(lb["pairs"])
    for im in k.get("images", []):
        for o in objs:
            for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                name, _, tag = c["image"].partition(":")
                if name == im["name"]:
                    c["image"] = "%s:%s" % (im.get("newName", name), im.get("newTag", tag))
    return objs, gens


def render(d):
    """The objects `kubectl kustomize d` would print (ConfigMaps first)."""
    objs, gens = _build(d)
    names = {}
    for n, cm in gens.items():
        cm["metadata"]["name"] = "%s-%s" % (n, _cm_hash(cm))
        names[n] = cm["metadata"]["name"]
    for o in objs:
        for v in o.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] in names:
                v["configMap"]["name"] = names[v["configMap"]["name"]]
    return list(gens.values()) + objs
