"""Kubernetes manifests -> a skyfed WorkloadSpec: submit the YAML users already have.

A request is one multi-document body holding exactly one workload object (`apps/v1`
Deployment or StatefulSet -> `service`; `batch/v1` Job -> `batch`), any `v1` Services,
ConfigMaps, Secrets and PersistentVolumeClaims that go with it, and at most one
`skyfed.io/v1 PlacementPolicy` (placement_policy.py) that selects the workload. Anything
else is refused with the document's index and field (`["body", 2, "kind"]`).

What maps onto the placement model (the rest travels untouched to the member cluster,
whose own scheduler enforces it):

- `spec.replicas` (a Job's `spec.parallelism`) -> replicas;
- the sum of the containers' requests (else their limits; an init container counts when
  larger) -> per-replica cpu, memory and `nvidia.com/gpu`;
- a container without a cpu / memory request -> 100m / 128Mi (`DEFAULT_CPU`,
  `DEFAULT_MEMORY`, as a LimitRange would set them), listed in the status's `defaulted`;
- `nodeSelector`: `nvidia.com/gpu.product` -> GPU model; `kubernetes.io/os|arch|hostname`
  -> left to the member; any other key -> cluster affinity (the member cluster must carry
  that label);
- `tolerations` -> tolerations of cluster taints;
- `affinity.nodeAffinity.requiredDuringScheduling...`: one term of `In` / `NotIn` with one
  value each -> cluster affinity / anti-affinity (pod affinity and preferences: the member);
- `topologySpreadConstraints` with `DoNotSchedule` on `topology.kubernetes.io/zone|region`
  -> spread over at least `minDomains` (default min(replicas, 2)); others: the member;
- `skyfed.io/*` annotations and the PlacementPolicy -> user region, latency SLO, spot,
  budget, priority, run time, allowed clusters, and `replicaSplit: weighted` with its static
  weight list -> replica_weights (Karmada's division, broker/placement/weighted.py).

Refused, naming the field: an unknown kind, a container without an image, a resource other
than cpu, memory, ephemeral-storage and `nvidia.com/gpu`, node affinity that is not one
`In`/`NotIn` term, an unknown `skyfed.io/` annotation. A Job's run time is the
`skyfed.io/duration-s` annotation, else the caller's estimate (the duration predictor's).

The numbers are validated by the same model as the skyfed `Workload` kind
(schemas.WorkloadSpecIn), with errors mapped back to the manifest field they came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from broker.api.placement_policy import ANNOTATION_PREFIX, ANNOTATIONS, PlacementPolicyIn
from broker.api.schemas import NAME_RE, WorkloadIn, parse_cpu, parse_memory_gib
from broker.domain import ClusterWeight, NativeObjects, Resources, WorkloadSpec
from broker.errors import SpecError
from broker.limits import check_json
from broker.store.workloads import is_workload_id

Loc = tuple[str | int, ...]
WORKLOAD_KINDS = {("apps/v1", "Deployment"): "service", ("apps/v1", "StatefulSet"): "service",
                  ("batch/v1", "Job"): "batch"}
COMPANION_KINDS = {("v1", "Service"), ("v1", "ConfigMap"), ("v1", "Secret"),
                   ("v1", "PersistentVolumeClaim")}
POLICY_KIND = ("skyfed.io/v1", "PlacementPolicy")
DEFAULT_CPU = "100m"
DEFAULT_MEMORY = "128Mi"
GPU = "nvidia.com/gpu"
_RESOURCES = {"cpu", "memory", "ephemeral-storage", GPU}
_MEMBER_NODE_KEYS = {"kubernetes.io/os", "kubernetes.io/arch", "kubernetes.io/hostname"}
_SPREAD_KEYS = {"topology.kubernetes.io/zone": "zone", "topology.kubernetes.io/region": "region"}
_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                  "selfLink", "namespace", "ownerReferences")
# (resources, replicas) -> the expected run time of a Job in seconds.
DurationOf = Callable[[Resources, int], float]


def is_skyfed_workload(doc: Any) -> bool:
    return isinstance(doc, Mapping) and doc.get("apiVersion") == "skyfed.io/v1" \
        and doc.get("kind") == "Workload"


def _map(v: Any, loc: Loc) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise SpecError("must be a mapping", loc=loc)
    return v


def _list(v: Any, loc: Loc) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise SpecError("must be a list", loc=loc)
    return v


def _name(doc: Mapping[str, Any], loc: Loc) -> str:
    import re

    name = _map(doc.get("metadata"), (*loc, "metadata")).get("name")
    if not isinstance(name, str) or not re.match(NAME_RE, name) or is_workload_id(name):
        raise SpecError("metadata.name is required: a DNS-1123 name, not like an id "
                        "('w-' and 16 hex digits)", loc=(*loc, "metadata", "name"))
    return name


def _clean(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The object as the member should get it: without status and server-set metadata."""
    meta = {k: v for k, v in dict(doc.get("metadata") or {}).items() if k not in _SERVER_FIELDS}
    return {**{k: v for k, v in doc.items() if k != "status"}, "metadata": meta}


@dataclasses.dataclass
class _Built:
    """The skyfed Workload body being built, and where each of its fields came from."""

    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    origin: dict[str, Loc] = dataclasses.field(default_factory=dict)
    defaulted: list[str] = dataclasses.field(default_factory=list)

    def set(self, key: str, value: Any, loc: Loc) -> None:
        self.spec[key] = value
        self.origin[key] = loc

    def merge(self, key: str, values: Mapping[str, Any], loc: Loc) -> None:
        self.spec[key] = {**self.spec.get(key, {}), **values}
        self.origin[key] = loc


def _quantity(parse: Callable[[Any], Any], v: Any, loc: Loc) -> float:
    try:
        out = parse(v)
    except ValueError as e:
        raise SpecError(str(e), loc=loc) from None
    if isinstance(out, bool) or not isinstance(out, int | float):
        raise SpecError(f"{v!r} is not a quantity", loc=loc)
    return float(out)


def _container_requests(c: Mapping[str, Any], loc: Loc, built: _Built,
                        path: str) -> tuple[float, float, int]:
    res = _map(c.get("resources"), (*loc, "resources"))
    req = dict(_map(res.get("limits"), (*loc, "resources", "limits")))
    req.update(_map(res.get("requests"), (*loc, "resources", "requests")))
    where = "requests" if "requests" in res else "limits"
    for key in req:
        if key not in _RESOURCES:
            raise SpecError(f"resource {key!r} cannot be placed (known: cpu, memory, "
                            f"ephemeral-storage, {GPU})", loc=(*loc, "resources", where, key))
    if "cpu" not in req:
        built.defaulted.append(f"{path}.resources.requests.cpu={DEFAULT_CPU}")
    if "memory" not in req:
        built.defaulted.append(f"{path}.resources.requests.memory={DEFAULT_MEMORY}")
    cpu = _quantity(parse_cpu, req.get("cpu", DEFAULT_CPU), (*loc, "resources", where, "cpu"))
    mem = _quantity(parse_memory_gib, req.get("memory", DEFAULT_MEMORY),
                    (*loc, "resources", where, "memory"))
    gpu_raw = req.get(GPU, 0)
    try:
        gpu = int(str(gpu_raw))
    except ValueError:
        raise SpecError(f"{GPU} must be a whole number of GPUs",
                        loc=(*loc, "resources", where, GPU)) from None
    return cpu, mem, gpu


def _resources(pod: Mapping[str, Any], loc: Loc, built: _Built) -> None:
    containers = _list(pod.get("containers"), (*loc, "containers"))
    if not containers:
        raise SpecError("a pod template needs at least one container", loc=(*loc, "containers"))
    total = [0.0, 0.0, 0]
    for j, c in enumerate(containers):
        cloc = (*loc, "containers", j)
        c = _map(c, cloc)
        image = c.get("image")
        if not isinstance(image, str) or not image.strip():
            raise SpecError("every container needs an image", loc=(*cloc, "image"))
        cpu, mem, gpu = _container_requests(c, cloc, built, f"containers[{j}]")
        total = [total[0] + cpu, total[1] + mem, int(total[2]) + gpu]
    for j, c in enumerate(_list(pod.get("initContainers"), (*loc, "initContainers"))):
        cloc = (*loc, "initContainers", j)
        c = _map(c, cloc)
        if not isinstance(c.get("image"), str) or not c["image"].strip():
            raise SpecError("every container needs an image", loc=(*cloc, "image"))
        scratch = _Built()  # an init container's defaults never raise the pod's request
        cpu, mem, gpu = _container_requests(c, cloc, scratch, f"initContainers[{j}]")
        total = [max(total[0], cpu), max(total[1], mem), max(int(total[2]), gpu)]
    first = _map(containers[0], (*loc, "containers", 0))
    built.set("image", first["image"], (*loc, "containers", 0, "image"))
    built.set("resources", {"cpu": round(total[0], 3), "memory": total[1], "gpu": int(total[2])},
              (*loc, "containers", 0, "resources"))


def _node_selector(pod: Mapping[str, Any], loc: Loc, built: _Built) -> None:
    sel = _map(pod.get("nodeSelector"), (*loc, "nodeSelector"))
    affinity: dict[str, Any] = {}
    for key, value in sel.items():
        if key == "nvidia.com/gpu.product":
            built.spec["resources"] = {**built.spec["resources"], "gpuModel": value}
        elif key not in _MEMBER_NODE_KEYS:
            affinity[key] = value
    if affinity:
        built.merge("affinity", affinity, (*loc, "nodeSelector"))


def _node_affinity(pod: Mapping[str, Any], loc: Loc, built: _Built) -> None:
    aloc = (*loc, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    node = _map(_map(pod.get("affinity"), (*loc, "affinity")).get("nodeAffinity"), aloc[:-1])
    required = _map(node.get("requiredDuringSchedulingIgnoredDuringExecution"), aloc)
    terms = _list(required.get("nodeSelectorTerms"), (*aloc, "nodeSelectorTerms"))
    if not terms:
        return
    if len(terms) > 1:
        raise SpecError("only one nodeSelectorTerm can be placed (terms are ORed)",
                        loc=(*aloc, "nodeSelectorTerms", 1))
    tloc = (*aloc, "nodeSelectorTerms", 0)
    term = _map(terms[0], tloc)
    for key in term:
        if key != "matchExpressions":
            raise SpecError(f"{key} cannot be placed; use matchExpressions", loc=(*tloc, key))
    for k, e in enumerate(_list(term.get("matchExpressions"), (*tloc, "matchExpressions"))):
        eloc = (*tloc, "matchExpressions", k)
        e = _map(e, eloc)
        values = _list(e.get("values"), (*eloc, "values"))
        op, label = e.get("operator"), e.get("key")
        if op not in ("In", "NotIn") or len(values) != 1 or not isinstance(label, str):
            raise SpecError("only In / NotIn with one value can be placed", loc=(*eloc,
                                                                                "operator"))
        if label in _MEMBER_NODE_KEYS:
            continue
        built.merge("affinity" if op == "In" else "antiAffinity", {label: values[0]}, eloc)


def _spread(pod: Mapping[str, Any], loc: Loc, built: _Built, replicas: int) -> None:
    for k, c in enumerate(_list(pod.get("topologySpreadConstraints"),
                                (*loc, "topologySpreadConstraints"))):
        cloc = (*loc, "topologySpreadConstraints", k)
        c = _map(c, cloc)
        topology = _SPREAD_KEYS.get(str(c.get("topologyKey")))
        if topology is None or c.get("whenUnsatisfiable", "DoNotSchedule") != "DoNotSchedule":
            continue  # within one cluster (hostname) or a preference: the member's scheduler
        if "spread" in built.spec:
            raise SpecError("only one zone/region spread constraint can be placed", loc=cloc)
        built.set("spread", {"topology": topology,
                             "minDomains": c.get("minDomains", min(max(replicas, 1), 2))},
                  cloc)


def _annotations(doc: Mapping[str, Any], loc: Loc, built: _Built) -> None:
    aloc = (*loc, "metadata", "annotations")
    for key, value in _map(_map(doc.get("metadata"), loc).get("annotations"), aloc).items():
        if not isinstance(key, str) or not key.startswith(ANNOTATION_PREFIX):
            continue
        short = key[len(ANNOTATION_PREFIX):]
        if short not in ANNOTATIONS:
            raise SpecError(f"unknown annotation {key!r} (known: "
                            + ", ".join(ANNOTATION_PREFIX + a for a in ANNOTATIONS) + ")",
                            loc=(*aloc, key))
        built.set(ANNOTATIONS[short], value, (*aloc, key))


def _policy(doc: Mapping[str, Any], i: int) -> PlacementPolicyIn:
    try:
        return PlacementPolicyIn.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        raise SpecError(err["msg"], loc=("body", i, *err["loc"])) from None


def _workload_fields(doc: Mapping[str, Any], i: int, kind: str, built: _Built) -> None:
    loc: Loc = ("body", i)
    spec = _map(doc.get("spec"), (*loc, "spec"))
    tloc = (*loc, "spec", "template")
    pod = _map(_map(spec.get("template"), tloc).get("spec"), (*tloc, "spec"))
    rkey = "parallelism" if kind == "Job" else "replicas"
    replicas = spec.get(rkey, 1)
    built.set("kind", WORKLOAD_KINDS[(str(doc["apiVersion"]), kind)], (*loc, "kind"))
    built.set("replicas", replicas, (*loc, "spec", rkey))
    labels = _map(_map(doc.get("metadata"), loc).get("labels"), (*loc, "metadata", "labels"))
    built.set("_labels", dict(labels), (*loc, "metadata", "labels"))
    _resources(pod, (*tloc, "spec"), built)
    _node_selector(pod, (*tloc, "spec"), built)
    _node_affinity(pod, (*tloc, "spec"), built)
    _spread(pod, (*tloc, "spec"), built, replicas if isinstance(replicas, int) else 1)
    tolerations = []
    for k, t in enumerate(_list(pod.get("tolerations"), (*tloc, "spec", "tolerations"))):
        t = _map(t, (*tloc, "spec", "tolerations", k))
        tolerations.append({f: t[f] for f in ("key", "operator", "value", "effect") if f in t})
    if tolerations:
        built.set("tolerations", tolerations, (*tloc, "spec", "tolerations"))
    _annotations(doc, loc, built)


def _validate(name: str, built: _Built) -> WorkloadSpec:
    labels = built.spec.pop("_labels", {})
    body = {"apiVersion": "skyfed.io/v1", "kind": "Workload",
            "metadata": {"name": name, "labels": labels}, "spec": built.spec}
    built.origin["metadata"] = built.origin.get("_labels", ("body",))
    try:
        return WorkloadIn.model_validate(body).to_domain()
    except ValidationError as e:
        err = e.errors()[0]
        where = [str(x) for x in err["loc"]]
        key = where[1] if len(where) > 1 and where[0] == "spec" else where[0]
        loc = built.origin.get(key, ("body",))
        raise SpecError(f"{'.'.join(where[1:]) or key}: {err['msg']}", loc=loc) from None


def gpu_loc(docs: Sequence[Any]) -> Loc:
    """Where the first GPU request of the request's workload is (for an error naming it)."""
    for i, doc in enumerate(docs):
        if not isinstance(doc, Mapping) or (doc.get("apiVersion"), doc.get("kind")) \
                not in WORKLOAD_KINDS:
            continue
        pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for j, c in enumerate(pod.get("containers") or []):
            res = (c or {}).get("resources") or {}
            for where in ("requests", "limits"):
                if GPU in (res.get(where) or {}):
                    return ("body", i, "spec", "template", "spec", "containers", j,
                            "resources", where, GPU)
    return ("body",)


def weighted_cluster_names(docs: Sequence[Any]) -> list[tuple[str, Loc]]:
    """Cluster names of the request's static weight list with their location (for an error
    naming the one the tenant has no member for). Call after `convert` accepted `docs`."""
    out: list[tuple[str, Loc]] = []
    for i, doc in enumerate(docs):
        if isinstance(doc, Mapping) and (doc.get("apiVersion"), doc.get("kind")) == POLICY_KIND:
            out += [(name, ("body", i, "spec", *where))
                    for name, where in _policy(doc, i).weighted_cluster_names()]
    return out


def _classify(docs: Sequence[Any]) -> tuple[int, list[int], list[int]]:
    """(index of the workload, indexes of companions, indexes of policies)."""
    workload: int | None = None
    companions: list[int] = []
    policies: list[int] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            raise SpecError("every document must be a mapping", loc=("body", i))
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in WORKLOAD_KINDS:
            if workload is not None:
                raise SpecError("one workload (Deployment, StatefulSet or Job) per request",
                                loc=("body", i, "kind"))
            workload = i
        elif key in COMPANION_KINDS:
            companions.append(i)
        elif key == POLICY_KIND:
            policies.append(i)
        else:
            raise SpecError(
                f"kind {key[1]!r} (apiVersion {key[0]!r}) is not accepted: send an apps/v1 "
                "Deployment or StatefulSet or a batch/v1 Job, with v1 Services, ConfigMaps, "
                "Secrets, PersistentVolumeClaims and a skyfed.io/v1 PlacementPolicy",
                loc=("body", i, "kind"))
    if workload is None:
        raise SpecError("no Deployment, StatefulSet or Job in the request", loc=("body",))
    return workload, companions, policies


def convert(docs: Sequence[Any], *, duration_of: DurationOf) -> WorkloadSpec:
    """The WorkloadSpec of one request's Kubernetes documents (see the module docstring);
    SpecError naming the document and field of the first thing that cannot be honoured."""
    try:
        check_json(list(docs))
    except ValueError as e:
        raise SpecError(str(e), loc=("body",)) from None
    w, companion_ix, policy_ix = _classify(docs)
    doc = docs[w]
    kind = str(doc["kind"])
    name = _name(doc, ("body", w))
    built = _Built()
    _workload_fields(doc, w, kind, built)
    labels = dict(built.spec.get("_labels", {}))
    cluster_names: tuple[str, ...] = ()
    replica_weights: tuple[ClusterWeight, ...] = ()
    for i in policy_ix:
        policy = _policy(docs[i], i)
        if not any(s.selects(str(doc["apiVersion"]), kind, name, labels)
                   for s in policy.spec.resource_selectors):
            raise SpecError(f"selects nothing in this request (the workload is {kind} "
                            f"{name!r})", loc=("body", i, "spec", "resourceSelectors"))
        placement = policy.spec.placement
        if placement.weight_preference is not None and placement.replica_split != "weighted":
            raise SpecError("weightPreference is only honoured with replicaSplit: weighted",
                            loc=("body", i, "spec", "placement", "weightPreference"))
        replica_weights = policy.replica_weights()
        for key, value in policy.spec_fields().items():
            if isinstance(value, dict) and key != "spread":
                built.merge(key, value, ("body", i, "spec", "placement"))
            else:
                built.set(key, value, ("body", i, "spec"))
        cluster_names = policy.cluster_names()
    companions = []
    for i in companion_ix:
        _name(docs[i], ("body", i))
        companions.append(_clean(docs[i]))
    spec = _validate(name, built)
    if spec.duration_s is None and kind == "Job":
        estimate = round(duration_of(spec.resources, spec.replicas), 3)
        spec = dataclasses.replace(spec, duration_s=estimate)
        built.defaulted.append(f"durationS={estimate:g} (duration predictor)")
    return dataclasses.replace(spec, cluster_names=cluster_names,
                               replica_weights=replica_weights, native=NativeObjects(
        kind=kind, workload=_clean(doc), companions=tuple(companions),
        defaulted=tuple(built.defaulted)))
