"""providers/kubernetes_native.py: what a submitted manifest becomes on one member cluster."""

from __future__ import annotations

from typing import Any

from providers.base import ApplySpec
from providers.kubernetes_objects import HASH_ANNOTATION, render

LABELS = {"app": "db"}


def _spec(manifest: dict[str, Any], **kw: Any) -> ApplySpec:
    base: dict[str, Any] = {"workload_id": "w-0123456789abcdef", "tenant": "acme",
                            "name": "db", "kind": "service", "image": "pg", "replicas": 3,
                            "cpu": 1.0, "memory_gib": 1.0, "pool": "a", "manifest": manifest}
    base.update(kw)
    return ApplySpec(**base)


STATEFUL = {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "labels": LABELS,
                         "annotations": {"skyfed.io/latency-slo-ms": "20"}},
            "spec": {"serviceName": "db", "replicas": 1,
                     "selector": {"matchLabels": LABELS},
                     "template": {"metadata": {"labels": LABELS}, "spec": {
                         "containers": [{"name": "pg", "image": "postgres:17"}],
                         "affinity": {"nodeAffinity": {
                             "requiredDuringSchedulingIgnoredDuringExecution": {
                                 "nodeSelectorTerms": [{"matchExpressions": [
                                     {"key": "kubernetes.io/arch", "operator": "In",
                                      "values": ["amd64"]}]}]}}}}}}}


def test_statefulset_keeps_the_users_object_with_this_clusters_replicas_and_pools() -> None:
    body = render(_spec(STATEFUL, pool_replicas={"a": 2, "b": 1}), namespace="ns")
    assert body["kind"] == "StatefulSet"
    assert body["metadata"]["name"] == "skyfed-w-0123456789abcdef"
    assert "skyfed.io/latency-slo-ms" not in body["metadata"]["annotations"]
    assert HASH_ANNOTATION in body["metadata"]["annotations"]
    assert body["spec"]["replicas"] == 3
    assert body["spec"]["serviceName"] == "db"
    assert body["spec"]["selector"]["matchLabels"] == {
        "app": "db", "skyfed.io/workload-id": "w-0123456789abcdef"}
    [term] = body["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [  # the user's expression kept, the pools added
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "skyfed.io/pool", "operator": "In", "values": ["a", "b"]}]
    assert STATEFUL["spec"]["replicas"] == 1  # the stored manifest is not changed


def test_job_parallelism_and_completions_follow_this_clusters_share() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "render"},
           "spec": {"parallelism": 4, "completions": 8, "template": {"spec": {
               "containers": [{"name": "r", "image": "blender"}],
               "restartPolicy": "Never"}}}}
    body = render(_spec(job, kind="batch", replicas=2), namespace="ns")
    assert (body["spec"]["parallelism"], body["spec"]["completions"]) == (2, 4)
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"skyfed.io/pool": "a"}
    same = render(_spec(job, kind="batch", replicas=2), namespace="ns")
    assert same["metadata"]["annotations"] == body["metadata"]["annotations"]  # stable hash
