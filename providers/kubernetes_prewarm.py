"""Prewarm on a member Kubernetes cluster: a pre-pull DaemonSet and data-copy Jobs.

Why: a GPU job whose image (tens of GB) and input data are pulled only when it starts spends
minutes idle on an expensive node. The actuator prewarms a pool before the work lands there
(broker/federation/actuator.py, planner.Prewarm):

- images: one DaemonSet per prewarm key, on the pool's nodes (`nodeSelector
  skyfed.io/pool`, tolerating every taint), with one init container per image. Pulling the
  image is the point; each init container only runs `/bin/sh -c "exit 0"` (the pattern of
  JupyterHub's image puller; an image without a shell still gets pulled, then restarts, which
  the `ready` check reports as not done). A `pause` container keeps the pod, so nodes that join
  later pull too. Done when every scheduled pod is ready (`numberReady >=
  desiredNumberScheduled > 0`).
- data: one Job per data set that downloads its URL into the node's cache directory
  (`/var/lib/skyfed/cache`, a hostPath on one node of the pool) and checks the sha256 when one
  is given. Done when the Job succeeded.

Neither stays forever. A DaemonSet keeps a pause pod on every node of its pool, and one per
distinct image set would pile up until the nodes' pod limit (110 by default) is spent: each
prewarm deletes the prewarm DaemonSets of its namespace last applied (APPLIED_ANNOTATION,
else created) more than `KubernetesOptions.prewarm_keep_s` (default 1 h, twice the
actuator's prewarm timeout) ago, other than its own (`expired`); their images stay cached on
the nodes. A copy Job is deleted by Kubernetes' TTL controller `COPY_TTL_S` after it finishes
(`ttlSecondsAfterFinished`); its file stays in the cache directory.

Both are written with server-side apply (`PATCH`, `application/apply-patch+yaml`, field
manager `skyfed`, force), so applying the same key twice is the same as once, and named from
the key's hash, so every object name is valid whatever the key.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from providers.base import PrewarmData, PrewarmSpec

PREWARM_LABEL = "skyfed.io/prewarm"
POOL_LABEL = "skyfed.io/pool"
MANAGED = {"app.kubernetes.io/managed-by": "skyfed"}
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
FETCH_IMAGE = "curlimages/curl:8.11.1"
CACHE_DIR = "/var/lib/skyfed/cache"
FIELD_MANAGER = "skyfed"
COPY_TTL_S = 3600  # a finished copy Job is deleted this long after (ttlSecondsAfterFinished)
APPLIED_ANNOTATION = "skyfed.io/prewarm-applied-at"  # Unix seconds of the last apply
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
_FETCH = ('set -e; f="/cache/$NAME"; '
          'if [ -s "$f" ] && { [ -z "$SHA" ] || echo "$SHA  $f" | sha256sum -c -s -; }; '
          'then exit 0; fi; '
          'curl -fsSL --retry 5 -o "$f.part" "$URL"; '
          'if [ -n "$SHA" ]; then echo "$SHA  $f.part" | sha256sum -c -; fi; '
          'mv "$f.part" "$f"')


def key_label(key: str) -> str:
    """A label value for `key` (63 chars, alphanumeric ends): its sha256 prefix."""
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def prepull_name(key: str) -> str:
    return f"skyfed-prepull-{key_label(key)}"


def copy_name(key: str, index: int) -> str:
    return f"skyfed-copy-{key_label(key)}-{index}"


def _labels(spec: PrewarmSpec) -> dict[str, str]:
    clean = {k: re.sub(r"[^A-Za-z0-9_.-]", "-", v)[:63].strip("-_.")
             for k, v in spec.labels.items()}
    return {**clean, **MANAGED, PREWARM_LABEL: key_label(spec.key)}


def render_prepull(spec: PrewarmSpec, *, namespace: str,
                   applied_s: float | None = None) -> dict[str, Any]:
    """The pre-pull DaemonSet for `spec.images` on `spec.pool`'s nodes; `applied_s` (Unix
    seconds) is recorded as APPLIED_ANNOTATION, from which it expires (`expired`)."""
    labels = _labels(spec)
    init = [{"name": f"pull-{i}", "image": image, "command": ["/bin/sh", "-c", "exit 0"],
             "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}}}
            for i, image in enumerate(spec.images)]
    pod: dict[str, Any] = {
        "initContainers": init,
        "containers": [{"name": "pause", "image": PAUSE_IMAGE,
                        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}}}],
        "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
    }
    if spec.pool:
        pod["nodeSelector"] = {POOL_LABEL: spec.pool}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": prepull_name(spec.key), "namespace": namespace, "labels": labels,
                     **({"annotations": {APPLIED_ANNOTATION: f"{applied_s:.0f}"}}
                        if applied_s is not None else {})},
        "spec": {"selector": {"matchLabels": {PREWARM_LABEL: labels[PREWARM_LABEL]}},
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def _file_name(item: PrewarmData) -> str:
    name = item.name or item.sha256 or item.url.rstrip("/").rsplit("/", 1)[-1] or "data"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:200]


def render_copy(spec: PrewarmSpec, item: PrewarmData, index: int, *,
                namespace: str) -> dict[str, Any]:
    """The data-copy Job for one data set of `spec`, on a node of `spec.pool`."""
    labels = _labels(spec)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "tolerations": [{"operator": "Exists"}],
        "containers": [{
            "name": "copy", "image": FETCH_IMAGE, "command": ["/bin/sh", "-c", _FETCH],
            "env": [{"name": "URL", "value": item.url}, {"name": "SHA", "value": item.sha256},
                    {"name": "NAME", "value": _file_name(item)}],
            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        }],
        "volumes": [{"name": "cache",
                     "hostPath": {"path": CACHE_DIR, "type": "DirectoryOrCreate"}}],
    }
    if spec.pool:
        pod["nodeSelector"] = {POOL_LABEL: spec.pool}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": copy_name(spec.key, index), "namespace": namespace,
                     "labels": labels},
        "spec": {"backoffLimit": 4, "ttlSecondsAfterFinished": COPY_TTL_S,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def render_all(spec: PrewarmSpec, *, namespace: str,
               applied_s: float | None = None) -> list[dict[str, Any]]:
    """Every object a prewarm needs: the DaemonSet (if any image), then one Job per data set."""
    out = [render_prepull(spec, namespace=namespace, applied_s=applied_s)] \
        if spec.images else []
    out += [render_copy(spec, item, i, namespace=namespace)
            for i, item in enumerate(spec.data) if item.url]
    return out


def daemonset_ready(obj: Mapping[str, Any]) -> bool:
    st = obj.get("status") or {}
    desired = int(st.get("desiredNumberScheduled") or 0)
    return desired > 0 and int(st.get("numberReady") or 0) >= desired


def job_succeeded(obj: Mapping[str, Any]) -> bool:
    st = obj.get("status") or {}
    conds = {c.get("type") for c in st.get("conditions") or [] if c.get("status") == "True"}
    return "Complete" in conds or int(st.get("succeeded") or 0) >= 1


def expired(obj: Mapping[str, Any], *, now_s: float, keep_s: float) -> bool:
    """A prewarm object skyfed made (its labels) last applied more than `keep_s` before
    `now_s` (Unix seconds): APPLIED_ANNOTATION, else its creationTimestamp (a prewarm applied
    again for a new decision is as fresh as that decision). Unreadable times keep it."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if not labels.get(PREWARM_LABEL) or \
            labels.get("app.kubernetes.io/managed-by") != MANAGED["app.kubernetes.io/managed-by"]:
        return False
    applied = (meta.get("annotations") or {}).get(APPLIED_ANNOTATION)
    try:
        if applied is not None:
            at = float(applied)
        else:
            created = datetime.fromisoformat(str(meta.get("creationTimestamp")).replace(
                "Z", "+00:00"))
            if created.tzinfo is None:
                return False
            at = created.timestamp()
    except ValueError:
        return False
    return math.isfinite(at) and now_s - at > keep_s
