"""KubernetesDriver over real HTTP against kmock's Kubernetes emulator.

kmock gaps worked around here (FACTS.md): the emulator only knows `watch=true` while
kubernetes<37 sends `watch=True` (normalised by `_Emulator`), adds no status (tests write the
status a controller would), and ignores label selectors (the driver re-checks labels).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes import client

from providers.base import (
    ApplySpec,
    Capability,
    ClusterDriver,
    Interconnect,
    PrewarmData,
    PrewarmSpec,
    WorkloadPhase,
)
from providers.errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
    ThrottledError,
    TransientError,
)
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from providers.kubernetes_prewarm import copy_name, prepull_name
from tests.contract.k8s_emulator import Emulator
from tests.contract.rbac import calls_of, denied

NS = "team-a"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
NODES = kmock.resource("", "v1", "nodes")
DEP_RES = kmock.resource("apps", "v1", "deployments")


@pytest.fixture
async def k8s() -> AsyncIterator[tuple[Any, KubernetesDriver]]:
    async with Emulator() as k, kmock.Server(k) as srv:
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            k.resources.load_bundled()
        cfg = client.Configuration(host=str(srv.url))
        api = client.ApiClient(configuration=cfg)
        drv = KubernetesDriver("edge-1", KubernetesOptions(namespace=NS, timeout_s=5,
                                                           watch_timeout_s=0.5),
                               api_client=api)
        try:
            yield k, drv
        finally:
            await asyncio.to_thread(api.close)
        # Every call the test made, a real API server would allow to deploy/member-rbac.yaml's
        # service account (docs/operations.md): none would be a 403.
        assert denied(calls_of(k), namespace=NS) == []


def spec(wid: str = "w-1", **kw: Any) -> ApplySpec:
    base: dict[str, Any] = {"workload_id": wid, "tenant": "acme", "name": "web",
                            "kind": "service", "image": "nginx:1.27", "replicas": 2, "cpu": 0.5,
                            "memory_gib": 1.0, "pool": "gpu-a100", "gpu": 1,
                            "labels": {"skyfed.io/cluster": "edge-1"}}
    base.update(kw)
    return ApplySpec(**base)


def _reqs(k: Any, method: str, path: str | None = None) -> list[Any]:
    view = k[f"{method} {path}"] if path else k[method]
    return list(view)


def _obj(k: Any, res: Any, name: str) -> dict[str, Any]:
    return dict(k.objects[res, NS, name].raw)


async def test_is_a_cluster_driver(k8s: tuple[Any, KubernetesDriver]) -> None:
    assert isinstance(k8s[1], ClusterDriver)


async def test_apply_renders_deployment_and_is_idempotent(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    await drv.apply(spec=spec())
    await drv.apply(spec=spec())
    body = _obj(k, DEP_RES, "skyfed-w-1")
    pod = body["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "500m", "memory": "1024Mi", "nvidia.com/gpu": "1"}
    assert pod["nodeSelector"] == {"skyfed.io/pool": "gpu-a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert body["metadata"]["labels"]["skyfed.io/workload-id"] == "w-1"
    assert body["metadata"]["labels"]["skyfed.io/tenant"] == "acme"
    # A move to another pool rolls out new pods first: never below the ready replicas.
    assert body["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    [created] = _reqs(k, "patch")  # server-side apply creates it; the same spec: no write
    assert created.headers["Content-Type"].startswith("application/apply-patch+yaml")
    assert created.params["fieldManager"] == "skyfed"
    assert not _reqs(k, "post")
    await drv.apply(spec=spec(replicas=5))
    assert len(_reqs(k, "patch")) == 2
    assert _obj(k, DEP_RES, "skyfed-w-1")["spec"]["replicas"] == 5


async def test_job_for_batch_and_status_from_object(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    await drv.apply(spec=spec("train-7", kind="train", replicas=1, gpu=8))
    st = await drv.status(workload_id="train-7")
    assert st.phase is WorkloadPhase.PENDING
    jobs = kmock.resource("batch", "v1", "jobs")
    k.objects[jobs, NS, "skyfed-train-7"].patch({"status": {"active": 1}})
    assert (await drv.status(workload_id="train-7")).phase is WorkloadPhase.RUNNING
    k.objects[jobs, NS, "skyfed-train-7"].patch(
        {"status": {"active": 0, "succeeded": 1,
                    "conditions": [{"type": "Complete", "status": "True"}]}})
    assert (await drv.status(workload_id="train-7")).phase is WorkloadPhase.SUCCEEDED
    # a changed Job is replaced (its template is immutable), not patched
    await drv.apply(spec=spec("train-7", kind="train", replicas=1, gpu=4))
    assert len(_reqs(k, "patch", f"{JOBS}/skyfed-train-7")) == 2  # applied, re-applied
    assert _reqs(k, "delete")  # ... after deleting the old one
    job = _obj(k, jobs, "skyfed-train-7")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == "4"


async def test_delete_twice_and_unknown_status(k8s: tuple[Any, KubernetesDriver]) -> None:
    _, drv = k8s
    await drv.apply(spec=spec())
    await drv.delete(workload_id="w-1")
    await drv.delete(workload_id="w-1")  # 404 is fine
    with pytest.raises(NotFoundError, match="w-1"):
        await drv.status(workload_id="w-1")


async def test_list_status_reads_running_replicas(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    await drv.apply(spec=spec("a"))
    await drv.apply(spec=spec("b", kind="batch", replicas=3, gpu=0, pool=""))
    k.objects[DEP_RES, NS, "skyfed-a"].patch({"status": {"readyReplicas": 2}})
    got = {s.workload_id: s for s in await drv.list_status()}
    assert got["a"].phase is WorkloadPhase.RUNNING
    assert got["a"].ready_replicas == 2
    assert got["b"].phase is WorkloadPhase.PENDING
    assert got["b"].desired_replicas == 3


async def test_injected_409_429_and_5xx(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    k[f"patch {DEPLOYMENTS}/skyfed-w-1"][:1] << 429
    with pytest.raises(ThrottledError):
        await drv.apply(spec=spec())
    await drv.apply(spec=spec())  # the retry applies it
    assert _obj(k, DEP_RES, "skyfed-w-1")["spec"]["replicas"] == 2
    seen = len(_reqs(k, "get", f"{DEPLOYMENTS}/skyfed-w-1"))  # slices count past requests too
    k[f"get {DEPLOYMENTS}/skyfed-w-1"][seen:seen + 1] << 503
    with pytest.raises(TransientError) as err:
        await drv.status(workload_id="w-1")
    assert err.value.retryable
    assert (await drv.status(workload_id="w-1")).desired_replicas == 2


async def test_watch_relists_after_410(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    await drv.apply(spec=spec("a"))
    k[f"get {DEPLOYMENTS}", kmock.params(watch="true")][:1] << 410
    stop = asyncio.Event()
    seen: list[tuple[str, int]] = []

    async def consume() -> None:
        async for st in drv.watch(stop=stop):
            seen.append((st.workload_id, st.ready_replicas))
            if st.ready_replicas == 2:
                stop.set()

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    await drv.apply(spec=spec("a", replicas=3))
    k.objects[DEP_RES, NS, "skyfed-a"].patch({"status": {"readyReplicas": 2}})
    await drv.apply(spec=spec("a", replicas=4))  # emits a MODIFIED with the status
    await asyncio.wait_for(task, timeout=15)
    assert ("a", 0) in seen
    assert ("a", 2) in seen
    lists = [r for r in _reqs(k, "get", DEPLOYMENTS) if "watch" not in r.params]
    assert len(lists) >= 2  # listed again after the 410


async def test_inventory_from_nodes(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    k.objects[NODES, None, "gpu-node-1"] = {
        "metadata": {"name": "gpu-node-1", "labels": {
            "skyfed.io/pool": "gpu-a100", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "skyfed.io/gpu-interconnect": "nvlink-full"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}],
                 "providerID": "gce://proj-1/europe-west4-a/gke-gpu-a100-7f3c"},
        "status": {"allocatable": {"cpu": "95500m", "memory": "1100Gi", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }
    k.objects[kmock.resource("", "v1", "pods"), "x", "p1"] = {
        "metadata": {"name": "p1", "namespace": "x"},
        "spec": {"nodeName": "gpu-node-1", "containers": [
            {"name": "c", "image": "x",
             "resources": {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Running"},
    }
    (node,) = await drv.inventory()
    assert node.pool == "gpu-a100"
    assert node.allocatable_cpu == pytest.approx(95.5)
    assert node.allocatable_gpu == 8
    assert node.used_gpu == 2
    assert node.used_cpu == 2
    assert node.allocatable_memory_gib == pytest.approx(1100)
    assert node.topology.interconnect is Interconnect.NVLINK_FULL
    assert node.topology.gpu_model == "NVIDIA-A100-SXM4-80GB"
    assert node.taints == ("nvidia.com/gpu=present:NoSchedule",)
    # The machine as its cloud names it: what a scale-in through a node group terminates.
    assert node.provider_id == "gce://proj-1/europe-west4-a/gke-gpu-a100-7f3c"
    assert node.instance == "gke-gpu-a100-7f3c"


async def test_inventory_reads_a_large_pod_list_page_by_page(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    """A cluster of thousands of pods: the pod list is read LIST_PAGE at a time, following
    `continue` tokens as client-go's pager does; before, one unpaged list of every pod in
    the cluster each poll, deserialised into the client's models."""
    from providers.kubernetes import LIST_PAGE

    k, drv = k8s
    k.objects[NODES, None, "n1"] = {
        "metadata": {"name": "n1", "labels": {"skyfed.io/pool": "cpu"}},
        "status": {"allocatable": {"cpu": "5000", "memory": "4000Gi"}}}
    n_pods = 2 * LIST_PAGE + 7
    pods = [{"metadata": {"name": f"p{i}", "namespace": "x"},
             "spec": {"nodeName": "n1", "containers": [
                 {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]},
             "status": {"phase": "Running"}} for i in range(n_pods)]
    asked: list[tuple[str, str]] = []

    def page(request: Any) -> dict[str, Any]:  # the API server's paging, by offset tokens
        limit, token = int(request.params["limit"]), request.params.get("continue", "")
        asked.append((request.params["limit"], token))
        start = int(token.removeprefix("at-")) if token else 0
        end = min(n_pods, start + limit)
        return {"kind": "PodList", "items": pods[start:end],
                "metadata": {"continue": f"at-{end}" if end < n_pods else ""}}

    k["get /api/v1/pods"] << page
    (node,) = await drv.inventory()
    assert node.used_cpu == n_pods  # every page counted, none twice
    assert asked == [(str(LIST_PAGE), ""), (str(LIST_PAGE), f"at-{LIST_PAGE}"),
                     (str(LIST_PAGE), f"at-{2 * LIST_PAGE}")]


async def test_an_expired_continue_token_fails_the_poll_as_transient(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    """The API server answers 410 Gone to a continue token older than its compaction window
    (client-go's pager then lists again from the start): the inventory poll fails as a
    TransientError, which the loop retries on its next round, and counts no partial list;
    the next poll lists from the start."""
    from providers.kubernetes import LIST_PAGE

    k, drv = k8s
    k.objects[NODES, None, "n1"] = {
        "metadata": {"name": "n1", "labels": {"skyfed.io/pool": "cpu"}},
        "status": {"allocatable": {"cpu": "5000", "memory": "4000Gi"}}}
    pods = [{"metadata": {"name": f"p{i}", "namespace": "x"},
             "spec": {"nodeName": "n1", "containers": [
                 {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]},
             "status": {"phase": "Running"}} for i in range(LIST_PAGE + 1)]
    asked: list[str] = []
    expired = {"at-500"}

    def page(request: Any) -> Any:  # every answer sets its status (kmock keeps the last one)
        token = request.params.get("continue", "")
        asked.append(token)
        if token in expired:
            return kmock.Response(status=410, payload={
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                "code": 410, "message": "The provided continue parameter is too old"})
        start = int(token.removeprefix("at-")) if token else 0
        end = min(len(pods), start + LIST_PAGE)
        return kmock.Response(status=200, payload={
            "kind": "PodList", "items": pods[start:end],
            "metadata": {"continue": f"at-{end}" if end < len(pods) else ""}})

    k["get /api/v1/pods"] << page
    with pytest.raises(TransientError, match="resource version gone"):
        await drv.inventory()
    assert asked == ["", "at-500"]
    expired.clear()
    (node,) = await drv.inventory()
    assert node.used_cpu == LIST_PAGE + 1  # both pages, none twice
    assert asked == ["", "at-500", "", "at-500"]


def test_malformed_kubeconfig_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig.yaml"
    bad.write_text("apiVersion: v1\nclusters: [this is: not valid\n")
    with pytest.raises(ConfigError, match=r"kubeconfig\.yaml"):
        KubernetesDriver("c", KubernetesOptions(kubeconfig=str(bad)))
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        KubernetesDriver("c", KubernetesOptions(kubeconfig=str(tmp_path / "missing.yaml")))


async def test_metrics_api_usage(k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    k["get /apis/metrics.k8s.io/v1beta1/nodes"] << {"kind": "NodeMetricsList", "items": [
        {"metadata": {"name": "n1"}, "usage": {"cpu": "1500m", "memory": "2Gi"}},
        {"metadata": {"name": "n2"}, "usage": {"cpu": "250000000n", "memory": "512Mi"}}]}
    k[f"get /apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods"] << {"items": [
        {"metadata": {"name": "p", "namespace": NS},
         "containers": [{"usage": {"cpu": "100m", "memory": "256Mi"}},
                        {"usage": {"cpu": "50m", "memory": "256Mi"}}]}]}
    assert await drv.node_usage() == {"n1": (1.5, 2.0), "n2": (0.25, 0.5)}
    (usage,) = (await drv.pod_usage()).values()
    assert usage[0] == pytest.approx(0.15)
    assert usage[1] == pytest.approx(0.5)


DS_RES = kmock.resource("apps", "v1", "daemonsets")
JOB_RES = kmock.resource("batch", "v1", "jobs")
_DS_READY = {"currentNumberScheduled": 2, "desiredNumberScheduled": 2, "numberMisscheduled": 0,
             "numberReady": 2}


def _prewarm_spec() -> PrewarmSpec:
    return PrewarmSpec(key="prewarm:edge-1/gpu-a100/w-9", pool="gpu-a100",
                       images=("nvcr.io/nvidia/pytorch:24.05-py3", "busybox:1.36"),
                       data=(PrewarmData(url="https://data.example/shard-0.tar",
                                         sha256="ab" * 32, size_gb=40),),
                       labels={"skyfed.io/workload": "w-9"})


async def test_prewarm_server_side_applies_a_prepull_daemonset_and_a_copy_job(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    assert Capability.PREWARM in drv.capabilities
    spec = _prewarm_spec()
    await drv.prewarm(spec=spec)
    await drv.prewarm(spec=spec)  # idempotent: the same objects, applied again
    patches = _reqs(k, "patch")
    assert len(patches) == 4
    assert all(r.headers["Content-Type"] == "application/apply-patch+yaml" for r in patches)
    assert all(r.params["fieldManager"] == "skyfed" for r in patches)
    ds = _obj(k, DS_RES, prepull_name(spec.key))
    pod = ds["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["initContainers"]] == list(spec.images)
    assert pod["nodeSelector"] == {"skyfed.io/pool": "gpu-a100"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    job = _obj(k, JOB_RES, copy_name(spec.key, 0))
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["URL"] == "https://data.example/shard-0.tar"
    assert env["SHA"] == "ab" * 32
    assert job["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == \
        "/var/lib/skyfed/cache"
    # Not done until the DaemonSet's pods are ready on every node and the Job succeeded.
    assert await drv.prewarm_done(key=spec.key) is False
    k.objects[DS_RES, NS, prepull_name(spec.key)].patch({"status": _DS_READY})
    assert await drv.prewarm_done(key=spec.key) is False
    k.objects[JOB_RES, NS, copy_name(spec.key, 0)].patch({"status": {"succeeded": 1}})
    assert await drv.prewarm_done(key=spec.key) is True
    with pytest.raises(NotFoundError):
        await drv.prewarm_done(key="never-applied")


async def test_a_prewarm_deletes_the_prewarm_daemonsets_that_expired(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    """Each prewarm DaemonSet keeps a pause pod on every node of its pool; one per image set,
    never deleted, they filled the nodes' pod limit. Those created more than
    `prewarm_keep_s` ago go at the next prewarm; the fresh one, the one being applied and
    objects skyfed did not make stay. A copy Job carries ttlSecondsAfterFinished."""
    import datetime

    from providers.kubernetes_prewarm import (
        APPLIED_ANNOTATION,
        COPY_TTL_S,
        MANAGED,
        PREWARM_LABEL,
        key_label,
    )

    k, drv = k8s
    now = datetime.datetime.now(datetime.UTC)

    def ds(name: str, age_s: float, labels: dict[str, str]) -> None:
        created = (now - datetime.timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        k.objects[DS_RES, NS, name] = {
            "metadata": {"name": name, "namespace": NS, "labels": labels,
                         "creationTimestamp": created},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}}}}

    spec = _prewarm_spec()
    ds("skyfed-prepull-old", 7200, {**MANAGED, PREWARM_LABEL: "aaaa"})
    ds("skyfed-prepull-fresh", 600, {**MANAGED, PREWARM_LABEL: "bbbb"})
    ds("someone-elses", 7200, {PREWARM_LABEL: "cccc"})  # not managed by skyfed
    ds("skyfed-prepull-again", 7200, {**MANAGED, PREWARM_LABEL: "dddd"})  # applied again:
    k.objects[DS_RES, NS, "skyfed-prepull-again"].patch({"metadata": {"annotations": {
        APPLIED_ANNOTATION: f"{now.timestamp() - 60:.0f}"}}})  # fresh, though created long ago
    ds(prepull_name(spec.key), 7200, {**MANAGED, PREWARM_LABEL: key_label(spec.key)})
    await drv.prewarm(spec=spec)
    deleted = [r.url.path.rsplit("/", 1)[-1] for r in _reqs(k, "delete")]
    assert deleted == ["skyfed-prepull-old"]
    job = _obj(k, JOB_RES, copy_name(spec.key, 0))
    assert job["spec"]["ttlSecondsAfterFinished"] == COPY_TTL_S
    # This prewarm's own DaemonSet now records its apply, so it expires from now on.
    own = _obj(k, DS_RES, prepull_name(spec.key))
    assert abs(float(own["metadata"]["annotations"][APPLIED_ANNOTATION]) - now.timestamp()) < 60


async def test_namespace_is_created_first_when_allowed(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    # kmock has no namespaces endpoint (FACTS.md): answer the apply as the API server would.
    k[f"patch /api/v1/namespaces/{NS}"] << {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": NS}}
    allowed = KubernetesDriver("edge-1", KubernetesOptions(namespace=NS, timeout_s=5,
                                                           create_namespace=True),
                               api_client=drv._api)
    await allowed.apply(spec=spec())
    await allowed.apply(spec=spec("w-2"))
    [created] = _reqs(k, "patch", f"/api/v1/namespaces/{NS}")  # once per driver
    assert created.headers["Content-Type"].startswith("application/apply-patch+yaml")
    assert _reqs(k, "patch")[0] is created  # before any object in it
    await drv.apply(spec=spec("w-3"))  # not allowed: never touches namespaces
    assert len(_reqs(k, "patch", f"/api/v1/namespaces/{NS}")) == 1


async def test_companions_are_applied_and_a_name_of_another_workload_is_a_conflict(
        k8s: tuple[Any, KubernetesDriver]) -> None:
    k, drv = k8s
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
           "spec": {"ports": [{"port": 80}]}}
    await drv.apply(spec=spec("w-1", companions=(svc,)))
    services = kmock.resource("", "v1", "services")
    assert dict(k.objects[services, NS, "web"].raw)["metadata"]["labels"][
        "skyfed.io/workload-id"] == "w-1"
    await drv.apply(spec=spec("w-1", companions=(svc,)))  # its own: applied again
    with pytest.raises(ConflictError, match="another workload"):
        await drv.apply(spec=spec("w-2", companions=(svc,)))
    assert (DEP_RES, NS, "skyfed-w-2") not in k.objects  # nothing of w-2 was applied
    await drv.delete(workload_id="w-1")
    assert k.objects[services, NS, "web"].deleted
