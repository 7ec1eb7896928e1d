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
            _pod("n2", "w-d", phase="Succeeded"), _pod("n2", "w-f", phase="Failed"),
            _pod("n3", "w-e", managed=False), _pod("n3", None)]
    assert workloads_by_node(pods) == {"n1": ("w-a", "w-b"), "n2": ("w-c",)}


def test_a_pod_starting_on_a_node_holds_it() -> None:
    """Bound to a node and still pulling its image (phase Pending): the kube-scheduler counts
    its requests against the node, and the node is not empty. Before, the inventory counted
    running pods only, so such a node looked empty to the idle timer and to a scale-in."""
    from providers.kubernetes_objects import requested_by_node

    starting = _pod("n1", "w-gpu", phase="Pending")
    starting["spec"]["containers"] = [{"name": "c", "image": "x", "resources": {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}}]
    done = _pod("n2", "w-old", phase="Succeeded")
    done["spec"]["containers"] = starting["spec"]["containers"]
    assert workloads_by_node([starting, done]) == {"n1": ("w-gpu",)}
    assert requested_by_node([starting, done]) == {"n1": (8.0, 32.0, 1.0, 1)}


async def test_the_simulated_driver_reports_the_workloads_on_each_node() -> None:
    d = make()
    await d.apply(spec=spec("w1", replicas=2, cpu=3))  # 3 of 4 vCPU: one replica per node
    await d.apply(spec=spec("w2", replicas=1, cpu=1))
    on = {n.name: set(n.workloads) for n in await d.inventory() if n.pool == "cpu"}
    assert sorted(len(ids) for ids in on.values()) == [1, 2]
    assert set().union(*on.values()) == {"w1", "w2"}
    assert all("w1" in ids for ids in on.values())


def test_a_node_names_its_machine_by_its_provider_id_else_its_name() -> None:
    from providers.kubernetes_objects import node_inventory

    def node(provider_id: object) -> dict[str, Any]:
        spec = {} if provider_id is None else {"providerID": provider_id}
        return {"metadata": {"name": "ip-10-0-1-7.ec2.internal"}, "spec": spec, "status": {}}

    used = (0.0, 0.0, 0.0, 0)
    eks = node_inventory(node("aws:///us-east-1a/i-0abc123def4567890"), used)
    assert (eks.provider_id, eks.instance) == ("aws:///us-east-1a/i-0abc123def4567890",
                                               "i-0abc123def4567890")
    # No providerID (kind, a bare-metal cluster), or one that is not plain bounded text: the
    # node's own name, which EC2 matches against a private DNS name and GCE against a name.
    for bad in (None, "", "aws:///us-east-1a/i-0abc\n", "x" * 513, 7):
        inv = node_inventory(node(bad), used)
        assert (inv.provider_id, inv.instance) == ("", "ip-10-0-1-7.ec2.internal")
