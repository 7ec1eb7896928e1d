"""The objects a workload submitted as Kubernetes manifests becomes on a member cluster.

Pure functions over plain dicts (like kubernetes_objects.py); providers/kubernetes.py applies
them with server-side apply (field manager `skyfed`).

- The workload object (Deployment, StatefulSet, Job) is the user's, with: skyfed's name
  (`skyfed-<workload id>`: one tenant's `nginx` never overwrites another's), skyfed's labels
  on the object, its selector and its pods; the replica count of this cluster
  (`spec.replicas`, a Job's `spec.parallelism`); and the pools of this cluster the placement
  chose: one pool is a `nodeSelector`, several are one required node-affinity term
  `skyfed.io/pool In [...]`, so a split within one cluster keeps every replica in one object.
- Companions (Service, ConfigMap, Secret, PersistentVolumeClaim) keep the user's names, so
  clients find the Service they know, and carry skyfed's labels (`skyfed.io/workload-id`:
  deleted with the workload).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from providers.base import ApplySpec

POOL_LABEL = "skyfed.io/pool"
# kind -> (api group version, plural) of what the driver applies
KINDS = {"Deployment": ("apps/v1", "deployments"), "StatefulSet": ("apps/v1", "statefulsets"),
         "Job": ("batch/v1", "jobs"), "Service": ("v1", "services"),
         "ConfigMap": ("v1", "configmaps"), "Secret": ("v1", "secrets"),
         "PersistentVolumeClaim": ("v1", "persistentvolumeclaims")}
COMPANION_KINDS = ("Service", "ConfigMap", "Secret", "PersistentVolumeClaim")


def place_in_pools(pod: dict[str, Any], pools: Mapping[str, int]) -> None:
    """Pin the pod template to the cluster's chosen pools (see the module docstring)."""
    names = sorted(p for p in pools if p)
    if len(names) == 1:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), POOL_LABEL: names[0]}
        return
    if not names:
        return
    term = {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": names}]}
    affinity = pod.setdefault("affinity", {})
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    # Terms are ORed: the pool expression goes into each of them.
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or []),
                                   *term["matchExpressions"]]} for t in terms]


def render_native(spec: ApplySpec, *, name: str, namespace: str,
                  labels: Mapping[str, str]) -> dict[str, Any]:
    """The user's workload object as this cluster gets it (see the module docstring)."""
    if spec.manifest is None:
        raise ValueError("render_native needs ApplySpec.manifest")
    body = copy.deepcopy(dict(spec.manifest))
    kind = str(body.get("kind"))
    meta = body.setdefault("metadata", {})
    meta.update(name=name, namespace=namespace,
                labels={**(meta.get("labels") or {}), **labels})
    meta.pop("annotations", None)  # skyfed.io/* placement hints are not the member's concern
    wspec = body.setdefault("spec", {})
    template = wspec.setdefault("template", {})
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    pod = template.setdefault("spec", {})
    place_in_pools(pod, spec.pools())
    if kind == "Job":
        given = wspec.get("parallelism") or 1
        if wspec.get("completions"):
            per_pod = float(wspec["completions"]) / float(given)
            wspec["completions"] = max(1, math.ceil(per_pod * spec.replicas))
        wspec["parallelism"] = spec.replicas
        return body
    wspec["replicas"] = spec.replicas
    selector = wspec.setdefault("selector", {})
    id_label = "skyfed.io/workload-id"
    selector["matchLabels"] = {**(selector.get("matchLabels") or {}),
                               id_label: labels[id_label]}
    if kind == "Deployment" and "strategy" not in wspec:
        # A move to another pool rolls out without going below the ready replicas.
        wspec["strategy"] = {"type": "RollingUpdate",
                             "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}}
    return body


def companion_bodies(spec: ApplySpec, *, namespace: str,
                     labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The companions of `spec`, in the member's namespace, labelled as skyfed's."""
    out = []
    for c in spec.companions:
        body = copy.deepcopy(dict(c))
        meta = body.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        out.append(body)
    # ConfigMaps, Secrets and claims first: the pods of the Service's workload mount them.
    return sorted(out, key=lambda b: b.get("kind") == "Service")
