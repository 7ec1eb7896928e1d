"""Which broker workloads run on each node (the planner's node-loss input): the Kubernetes
driver reads it from the running pods' labels, the simulated driver from its replicas."""

from __future__ import annotations

from typing import Any

from providers.kubernetes_objects import ID_LABEL, MANAGED_LABEL, workloads_by_node
from tests.unit.test_providers_simulated import make, spec


def _pod(node: str, wid: str | None, *, phase: str = "Running",
         managed: bool = True) -> dict[str, Any]:
    labels = {MANAGED_LABEL: "skyfed" if managed else "helm"}
    if wid is not None:
        labels[ID_LABEL] = wid
    return {"metadata": {"labels": labels}, "spec": {"nodeName": node},
            "status": {"phase": phase}}


def test_kubernetes_pods_name_the_workloads_on_each_node() -> None:
    pods = [_pod("n1", "w-a"), _pod("n1", "w-a"), _pod("n1", "w-b"), _pod("n2", "w-c"),
            _pod("n2", "w-d", phase="Pending"), _pod("n3", "w-e", managed=False),
            _pod("n3", None)]
    assert workloads_by_node(pods) == {"n1": ("w-a", "w-b"), "n2": ("w-c",)}


async def test_the_simulated_driver_reports_the_workloads_on_each_node() -> None:
    d = make()
    await d.apply(spec=spec("w1", replicas=2, cpu=3))  # 3 of 4 vCPU: one replica per node
    await d.apply(spec=spec("w2", replicas=1, cpu=1))
    on = {n.name: set(n.workloads) for n in await d.inventory() if n.pool == "cpu"}
    assert sorted(len(ids) for ids in on.values()) == [1, 2]
    assert set().union(*on.values()) == {"w1", "w2"}
    assert all("w1" in ids for ids in on.values())
