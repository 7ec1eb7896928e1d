"""Kubernetes manifests -> WorkloadSpec (broker/api/manifests.py), issue 14 part 1.

The nginx Deployment and the `pi` Job are the Kubernetes documentation's examples, unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from broker.api import manifests
from broker.domain import ClusterWeight, Resources, WorkloadKind
from broker.errors import SpecError
from broker.store.mapping import spec_from_json, spec_to_json

NGINX = yaml.safe_load("""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx-deployment
  labels:
    app: nginx
spec:
  replicas: 3
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.14.2
        ports:
        - containerPort: 80
""")

PI = yaml.safe_load("""
apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  template:
    spec:
      containers:
      - name: pi
        image: perl:5.34.0
        command: ["perl",  "-Mbignum=bpi", "-wle", "print bpi(2000)"]
      restartPolicy: Never
  backoffLimit: 4
""")

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "nginx"},
           "spec": {"selector": {"app": "nginx"}, "ports": [{"port": 80}]}}
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
          "stringData": {"password": "hunter2"}}
POLICY = {"apiVersion": "skyfed.io/v1", "kind": "PlacementPolicy",
          "metadata": {"name": "nginx"},
          "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "nginx-deployment"}],
                   "placement": {"clusterAffinity": {"clusterNames": ["a", "b"],
                                                     "labelSelector": {"matchLabels":
                                                                       {"tier": "prod"}}},
                                 "spreadConstraints": [{"spreadByField": "cluster",
                                                        "minGroups": 2}]},
                   "userRegion": "frankfurt", "latencySloMs": 40, "spot": False,
                   "budgetUsdPerHour": 5, "priority": 10}}


def _duration(res: Resources, n: int) -> float:
    return 1234.0


def convert(*docs: Any) -> Any:
    return manifests.convert(list(docs), duration_of=_duration)


def test_nginx_deployment_unchanged_is_a_service_with_default_requests() -> None:
    spec = convert(NGINX)
    assert spec.name == "nginx-deployment"
    assert spec.kind is WorkloadKind.SERVICE
    assert spec.replicas == 3
    assert spec.image == "nginx:1.14.2"
    assert spec.resources == Resources(0.1, 0.125, 0)  # 100m / 128Mi
    assert spec.latency_slo_ms is None
    assert spec.user_region is None
    assert spec.native is not None
    assert spec.native.defaulted == ("containers[0].resources.requests.cpu=100m",
                                     "containers[0].resources.requests.memory=128Mi")
    assert spec.native.workload["spec"]["template"]["spec"]["containers"][0]["ports"] == [
        {"containerPort": 80}]
    assert spec_from_json(spec_to_json(spec)) == spec


def test_pi_job_unchanged_is_batch_with_predicted_duration() -> None:
    spec = convert(PI)
    assert spec.kind is WorkloadKind.BATCH
    assert spec.replicas == 1
    assert spec.duration_s == 1234.0
    assert spec.native is not None
    assert "durationS=1234 (duration predictor)" in spec.native.defaulted


def test_requests_limits_and_init_containers_sum_like_the_scheduler() -> None:
    d = copy.deepcopy(NGINX)
    pod = d["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi",
                                                      "nvidia.com/gpu": 1}}
    pod["containers"].append({"name": "side", "image": "envoy",
                              "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}})
    pod["initContainers"] = [{"name": "init", "image": "busybox",
                              "resources": {"requests": {"cpu": "4", "memory": "1Mi"}}}]
    pod["nodeSelector"] = {"nvidia.com/gpu.product": "A100", "disk": "ssd",
                           "kubernetes.io/os": "linux"}
    pod["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey":
                                         "topology.kubernetes.io/zone",
                                         "whenUnsatisfiable": "DoNotSchedule"}]
    spec = convert(d)
    assert spec.resources == Resources(4.0, 1.5, 1)  # init container's 4 cpu dominates
    assert spec.gpu_model == "A100"
    assert dict(spec.affinity) == {"disk": "ssd"}
    assert spec.tolerations[0].operator == "Exists"
    assert spec.spread is not None
    assert spec.spread.topology == "zone"
    assert spec.spread.min_domains == 2
    assert spec.native is not None
    assert spec.native.defaulted == ()


def test_policy_and_companions() -> None:
    spec = convert(NGINX, SERVICE, SECRET, POLICY)
    assert spec.cluster_names == ("a", "b")
    assert dict(spec.affinity) == {"tier": "prod"}
    assert spec.user_region == "frankfurt"
    assert spec.latency_slo_ms == 40
    assert spec.spot_ok is False
    assert spec.budget_usd_per_hour == 5
    assert spec.priority == 10
    assert spec.spread is not None
    assert spec.spread.min_domains == 2
    assert spec.native is not None
    assert [c["kind"] for c in spec.native.companions] == ["Service", "Secret"]


def test_annotations_are_the_shortcut() -> None:
    d = copy.deepcopy(PI)
    d["metadata"]["annotations"] = {"skyfed.io/kind": "train", "skyfed.io/duration-s": "60",
                                    "skyfed.io/latency-slo-ms": "25",
                                    "skyfed.io/user-region": "tokyo", "other/x": "kept"}
    spec = convert(d)
    assert spec.kind is WorkloadKind.TRAIN
    assert spec.duration_s == 60
    assert spec.latency_slo_ms == 25
    assert spec.user_region == "tokyo"


def _with(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    target = d
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return d


C0 = ("spec", "template", "spec", "containers", 0)
WEIGHTS = {"staticWeightList": [
    {"targetCluster": {"clusterNames": ["a"]}, "weight": 3},
    {"targetCluster": {"labelSelector": {"matchLabels": {"tier": "prod"}}, "exclude": ["c"]},
     "weight": 1}]}


def _weighted(entries: list[Any] | None) -> dict[str, Any]:
    placement = {"replicaSplit": "weighted"}
    if entries is not None:
        placement["weightPreference"] = {"staticWeightList": entries}  # type: ignore[assignment]
    return _with(POLICY, ("spec", "placement"), placement)


@pytest.mark.parametrize(("docs", "loc"), [
    ([NGINX, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}],
     ("body", 1, "kind")),
    ([_with(NGINX, (*C0, "image"), "")], ("body", 0, *C0, "image")),
    ([_with(NGINX, C0, {"name": "x"})], ("body", 0, *C0, "image")),
    ([_with(NGINX, (*C0, "resources"), {"requests": {"amd.com/gpu": 1}})],
     ("body", 0, *C0, "resources", "requests", "amd.com/gpu")),
    ([_with(NGINX, (*C0, "resources"), {"requests": {"cpu": "lots"}})],
     ("body", 0, *C0, "resources", "requests", "cpu")),
    ([_with(NGINX, ("spec", "replicas"), 0)], ("body", 0, "spec", "replicas")),
    ([_with(NGINX, ("metadata", "annotations"), {"skyfed.io/bogus": "1"})],
     ("body", 0, "metadata", "annotations", "skyfed.io/bogus")),
    ([_with(NGINX, ("metadata", "annotations"), {"skyfed.io/latency-slo-ms": "-5"})],
     ("body", 0, "metadata", "annotations", "skyfed.io/latency-slo-ms")),
    ([NGINX, _with(POLICY, ("spec", "resourceSelectors"), [{"kind": "Job"}])],
     ("body", 1, "spec", "resourceSelectors")),
    ([NGINX, _with(POLICY, ("spec", "placement", "weightPreference"), WEIGHTS)],
     ("body", 1, "spec", "placement", "weightPreference")),
    *[([NGINX, _weighted([{"targetCluster": {"clusterNames": ["a"]}, "weight": bad}])],
       ("body", 1, "spec", "placement", "weightPreference", "staticWeightList", 0, "weight"))
      for bad in (0, -1, 10_001, 1.5, True, "NaN", None)],
    ([NGINX, _weighted([{"targetCluster": {"clusterNames": ["a\tb"]}, "weight": 1}])],
     ("body", 1, "spec", "placement", "weightPreference", "staticWeightList", 0,
      "targetCluster", "clusterNames", 0)),
    ([NGINX, _with(POLICY, ("spec", "placement", "clusterAffinity", "clusterNames"),
                   ["a", ""])],
     ("body", 1, "spec", "placement", "clusterAffinity", "clusterNames", 1)),
    ([NGINX, _with(POLICY, ("spec", "placement", "clusterAffinity", "clusterNames"),
                   ["a\tb"])],
     ("body", 1, "spec", "placement", "clusterAffinity", "clusterNames", 0)),
    ([NGINX, _weighted([{"targetCluster": {"names": ["a"]}, "weight": 1}])],
     ("body", 1, "spec", "placement", "weightPreference", "staticWeightList", 0,
      "targetCluster", "names")),
    ([NGINX, _weighted([{"targetCluster": {}, "weight": 1}] * 101)],
     ("body", 1, "spec", "placement", "weightPreference", "staticWeightList")),
    ([NGINX, _with(POLICY, ("spec", "typo"), 1)], ("body", 1, "spec", "typo")),
    ([NGINX, NGINX], ("body", 1, "kind")),
    ([SERVICE], ("body",)),
    ([_with(NGINX, ("spec", "template", "spec", "affinity"), {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}]}}})],
     ("body", 0, "spec", "template", "spec", "affinity", "nodeAffinity",
      "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0,
      "matchExpressions", 0, "operator")),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(
        docs: list[Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(SpecError) as err:
        convert(*docs)
    assert err.value.loc == loc


def test_node_affinity_in_and_not_in_map_to_cluster_labels() -> None:
    d = _with(NGINX, ("spec", "template", "spec", "affinity"), {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["eu"]},
                                  {"key": "tier", "operator": "NotIn", "values": ["dev"]}]}]}}})
    spec = convert(d)
    assert dict(spec.affinity) == {"zone": "eu"}
    assert dict(spec.anti_affinity) == {"tier": "dev"}


def test_a_weighted_policy_carries_its_static_weights_into_the_spec() -> None:
    spec = convert(NGINX, _with(_weighted(None), ("spec", "placement", "weightPreference"),
                                WEIGHTS))
    assert spec.replica_weights == (
        ClusterWeight(weight=3, cluster_names=("a",)),
        ClusterWeight(weight=1, exclude=("c",), match_labels={"tier": "prod"}))
    assert spec_from_json(spec_to_json(spec)) == spec
    assert manifests.weighted_cluster_names([NGINX, _weighted(WEIGHTS["staticWeightList"])]) \
        == [("a", ("body", 1, "spec", "placement", "weightPreference", "staticWeightList", 0,
                   "targetCluster", "clusterNames", 0))]


def test_weighted_without_a_list_weighs_every_cluster_1_as_karmada() -> None:
    assert convert(NGINX, _weighted(None)).replica_weights == (ClusterWeight(weight=1),)
    assert convert(NGINX, _weighted([])).replica_weights == (ClusterWeight(weight=1),)
    assert convert(NGINX, POLICY).replica_weights == ()
