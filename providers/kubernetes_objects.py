"""Kubernetes objects as plain dicts, without the SDK: what skyfed writes and how it reads.

- `render`: an `ApplySpec` -> the Deployment (services) or Job (batch, train) manifest,
  annotated with the hash of its own spec (`HASH_ANNOTATION`) so applying twice is a no-op;
- `status_of` / `deployment_status` / `job_status`: an object's status -> `DriverStatus`;
- `node_inventory` / `requested_by_node`: Nodes and running Pods -> `NodeInventory`
  (allocatable, requested, GPU labels of NVIDIA GPU feature discovery, taints, readiness);
- `quantity`: Kubernetes quantities ("500m", "2Gi") -> float.

Pure functions over the JSON the API server returns (`sanitize_for_serialization`), so
they are tested without a cluster; `providers/kubernetes.py` makes the calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from providers.base import (
    ApplySpec,
    DriverStatus,
    Interconnect,
    NodeInventory,
    NodeTopology,
    WorkloadPhase,
)
from providers.kubernetes_native import place_in_pools, render_native

POOL_LABEL = "skyfed.io/pool"
ID_LABEL = "skyfed.io/workload-id"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
HASH_ANNOTATION = "skyfed.io/spec-hash"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def dns_name(workload_id: str) -> str:
    """The object name of a workload: a DNS-1123 label, kept unique when truncated."""
    name = re.sub(r"[^a-z0-9-]", "-", f"skyfed-{workload_id}".lower()).strip("-")
    if len(name) > 63:  # keep it unique when truncated
        digest = hashlib.sha256(workload_id.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}"
    return name


def label_value(v: str) -> str:
    """`v` as a valid label value (allowed characters, at most 63, alphanumeric ends)."""
    v = re.sub(r"[^A-Za-z0-9_.-]", "-", v)[:63]
    return v.strip("-_.")


def quantity(q: str | int | float | None) -> float:
    """Kubernetes quantity -> float (cpu in cores, memory in bytes)."""
    if q is None:
        return 0.0
    s = str(q).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    return float(s)


def own_labels(spec: ApplySpec) -> dict[str, str]:
    """The labels that mark an object as skyfed's, of which workload and tenant."""
    return {ID_LABEL: label_value(spec.workload_id), "skyfed.io/tenant": label_value(spec.tenant),
            "skyfed.io/kind": spec.kind, MANAGED_LABEL: "skyfed"}


def with_hash(body: dict[str, Any]) -> dict[str, Any]:
    """`body` annotated with the hash of everything but its metadata (HASH_ANNOTATION)."""
    rest = {k: v for k, v in body.items() if k != "metadata"}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]
    meta = body.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), HASH_ANNOTATION: digest}
    return body


def render(spec: ApplySpec, *, namespace: str, backoff_limit: int = 3) -> dict[str, Any]:
    """The workload object for `spec` (plain dict, annotated with its own hash): the user's
    manifest when there is one (kubernetes_native.py), else a Deployment (services) or Job."""
    name = dns_name(spec.workload_id)
    if spec.manifest is not None:
        return with_hash(render_native(spec, name=name, namespace=namespace,
                                       labels=own_labels(spec)))
    labels = {**{k: label_value(v) for k, v in spec.labels.items()}, **own_labels(spec)}
    res: dict[str, str] = {"cpu": f"{round(spec.cpu * 1000)}m",
                           "memory": f"{round(spec.memory_gib * 1024)}Mi"}
    if spec.gpu:
        res[GPU_RESOURCE] = str(spec.gpu)
    selector = {k: v for k, v in spec.node_selector.items() if k != POOL_LABEL}
    tolerations = [dict(t) for t in spec.tolerations]
    if spec.gpu and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    container: dict[str, Any] = {
        "name": "main", "image": spec.image,
        "resources": {"requests": res, "limits": dict(res)},
        "env": [{"name": k, "value": v} for k, v in sorted(spec.env.items())],
    }
    if spec.command:
        container["command"] = list(spec.command)
    pod_spec: dict[str, Any] = {"containers": [container], "nodeSelector": selector,
                                "tolerations": tolerations}
    place_in_pools(pod_spec, spec.pools())
    template = {"metadata": {"labels": labels}, "spec": pod_spec}
    if spec.kind == "service":
        body: dict[str, Any] = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "spec": {"replicas": spec.replicas, "selector": {"matchLabels": {ID_LABEL:
                                                                             labels[ID_LABEL]}},
                     # A changed spec (a move to another pool) rolls out without ever
                     # going below the desired ready replicas: new pods first.
                     "strategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                     "template": template},
        }
    else:
        pod_spec["restartPolicy"] = "Never"
        body = {
            "apiVersion": "batch/v1", "kind": "Job",
            "spec": {"parallelism": spec.replicas, "completions": spec.replicas,
                     "backoffLimit": backoff_limit, "template": template},
        }
    body["metadata"] = {"name": name, "namespace": namespace, "labels": labels}
    return with_hash(body)


def deployment_status(wid: str, obj: Mapping[str, Any]) -> DriverStatus:
    desired = int((obj.get("spec") or {}).get("replicas") or 0)
    st = obj.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    failure = conds.get("ReplicaFailure")
    if failure and failure.get("status") == "True":
        return DriverStatus(workload_id=wid, phase=WorkloadPhase.FAILED, ready_replicas=ready,
                            desired_replicas=desired, message=str(failure.get("message", "")))
    phase = WorkloadPhase.RUNNING if desired and ready >= desired else WorkloadPhase.PENDING
    return DriverStatus(workload_id=wid, phase=phase, ready_replicas=ready,
                        desired_replicas=desired)


def job_status(wid: str, obj: Mapping[str, Any]) -> DriverStatus:
    spec = obj.get("spec") or {}
    desired = int(spec.get("completions") or spec.get("parallelism") or 1)
    st = obj.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or [] if c.get("status") == "True"}
    active, succeeded = int(st.get("active") or 0), int(st.get("succeeded") or 0)
    if "Failed" in conds:
        phase, msg = WorkloadPhase.FAILED, str(conds["Failed"].get("message", ""))
    elif "Complete" in conds or succeeded >= desired:
        phase, msg = WorkloadPhase.SUCCEEDED, ""
    elif active:
        phase, msg = WorkloadPhase.RUNNING, ""
    else:
        phase, msg = WorkloadPhase.PENDING, ""
    return DriverStatus(workload_id=wid, phase=phase, ready_replicas=active,
                        desired_replicas=desired, message=msg)


def status_of(obj: Mapping[str, Any]) -> DriverStatus | None:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(MANAGED_LABEL) != "skyfed" or ID_LABEL not in labels:
        return None
    wid = str(labels[ID_LABEL])
    if obj.get("kind") == "Job" or "completions" in (obj.get("spec") or {}):
        return job_status(wid, obj)
    return deployment_status(wid, obj)


# Phases of a pod that holds its node's resources: bound and not terminated. The
# kube-scheduler counts a Pending pod bound to a node (pulling its image) against the node,
# and a node where one is starting is not empty (the Cluster Autoscaler's view too).
ACTIVE_PHASES = ("Pending", "Running")
# The same, as a field selector for listing pods (a `!=` term per terminal phase).
ACTIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


def _active(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase", "Running") in ACTIVE_PHASES


def requested_by_node(pods: list[dict[str, Any]]
                      ) -> dict[str, tuple[float, float, float, int]]:
    """Node name -> (cpu, memory GiB, GPUs) requested by the pods bound to it and not
    terminated (ACTIVE_PHASES), and how many of those pods the broker manages (its
    workloads' replicas)."""
    used: dict[str, list[float]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _active(pod):
            continue
        acc = used.setdefault(node, [0.0, 0.0, 0.0, 0.0])
        labels = (pod.get("metadata") or {}).get("labels") or {}
        acc[3] += 1.0 if labels.get(MANAGED_LABEL) == "skyfed" else 0.0
        for c in (pod.get("spec") or {}).get("containers") or []:
            req = ((c.get("resources") or {}).get("requests")) or {}
            acc[0] += quantity(req.get("cpu"))
            acc[1] += quantity(req.get("memory")) / 2**30
            acc[2] += quantity(req.get(GPU_RESOURCE))
    return {node: (acc[0], acc[1], acc[2], int(acc[3])) for node, acc in used.items()}


def workloads_by_node(pods: list[dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Node name -> ids of the broker-managed workloads with a pod bound there and not
    terminated (ACTIVE_PHASES: running, or starting)."""
    out: dict[str, dict[str, None]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if node and labels.get(MANAGED_LABEL) == "skyfed" and labels.get(ID_LABEL) and \
                _active(pod):
            out.setdefault(str(node), {})[str(labels[ID_LABEL])] = None
    return {node: tuple(ids) for node, ids in out.items()}


def node_inventory(n: Mapping[str, Any], used: tuple[float, float, float, int]
                   ) -> NodeInventory:
    """One Node object, the (cpu, memory GiB, GPUs) its active pods request and how many
    broker-managed pods are bound there (requested_by_node)."""
    meta, st = n.get("metadata") or {}, n.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    alloc = st.get("allocatable") or st.get("capacity") or {}
    gpus = int(quantity(alloc.get(GPU_RESOURCE)))
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    taints = tuple(
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect', '')}"
        for t in (n.get("spec") or {}).get("taints") or []
    )
    ic = Interconnect(labels.get("skyfed.io/gpu-interconnect",
                                 "pcie" if gpus else "none"))
    return NodeInventory(
        name=str(meta.get("name", "")), pool=labels.get(POOL_LABEL, ""),
        allocatable_cpu=quantity(alloc.get("cpu")),
        allocatable_memory_gib=round(quantity(alloc.get("memory")) / 2**30, 3),
        allocatable_gpu=gpus, used_cpu=round(used[0], 3),
        used_memory_gib=round(used[1], 3), used_gpu=int(used[2]), labels=labels,
        taints=taints,
        topology=NodeTopology(gpu_count=gpus, gpu_model=labels.get(GPU_PRODUCT_LABEL),
                              interconnect=ic),
        ready=conds.get("Ready", "True") == "True",
        unschedulable=bool((n.get("spec") or {}).get("unschedulable", False)),
        replicas=used[3], provider_id=_provider_id(n),
    )


def _provider_id(n: Mapping[str, Any]) -> str:
    """The node's `spec.providerID` (the cloud's id of its machine), or "" when it has none
    or it is not plain text of at most 512 characters."""
    raw = (n.get("spec") or {}).get("providerID")
    if not isinstance(raw, str) or len(raw) > 512 or not raw.isprintable():
        return ""
    return raw
