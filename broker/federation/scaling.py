"""How a pool grows and shrinks: through its cluster's driver, a declared cloud node group, or
not at all. The actuator's `scale` decisions go this way; the placement loop asks `can_scale`
so the planner never orders nodes a pool cannot get.

A pool scales, in this order of preference:

1. through the **node-pool hook the cluster declares** in its registration,
   `attrs.scaling = {"account": NAME, "groups": {POOL: GROUP}}`: the provider account `NAME`
   (from `[sync] accounts_file`, docs/providers.md) grows cloud node group `GROUP` (default:
   the pool's name) with `CloudProvider.scale_pool`, in the cluster's region and with the
   pool's instance type, and removes named machines with `CloudProvider.remove_nodes`.
   `{"enabled": false}` declares that it must not scale.
2. through its **driver**, when the driver declares `Capability.SCALE_POOL` and implements
   `providers.base.PoolScalingDriver` (the simulated driver; a cluster-autoscaler-style
   driver would too);
3. otherwise it **cannot scale**: the decision is refused with the reason, and `can_scale` is
   False so the snapshot shows the pool at `max_nodes == nodes`.

Ordered nodes count as the pool's until they appear in the driver's inventory
(`observed_nodes`), like the kube-scheduler's assumed pods: see placement/commitments.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.domain import PricingModel
from broker.store import ClusterRecord
from providers.base import (
    Capability,
    CloudProvider,
    ClusterDriver,
    NodeInventory,
    PoolScalingDriver,
)
from providers.cloud import SKYFED_CLUSTER_LABEL
from providers.errors import ProviderError


@dataclass(frozen=True, slots=True)
class ScaleRoute:
    """Where a scale decision for one pool goes. `how`: driver | account | refused."""

    how: str
    reason: str = ""
    account: str = ""
    group: str = ""


def _hook(rec: ClusterRecord) -> Mapping[str, Any] | None:
    raw = rec.attrs.get("scaling")
    return raw if isinstance(raw, Mapping) else None


def scale_route(rec: ClusterRecord, pool: str, *, drivers: Mapping[str, ClusterDriver],
                accounts: Mapping[str, CloudProvider]) -> ScaleRoute:
    """The way `pool` of `rec`'s cluster scales (see the module docstring)."""
    name = rec.cluster.name
    if pool not in {p.name for p in rec.cluster.pools}:
        return ScaleRoute("refused", f"cluster {name!r} has no pool {pool!r}")
    hook = _hook(rec)
    if hook is not None:
        if hook.get("enabled", True) is False:
            return ScaleRoute("refused", f"cluster {name!r} declares attrs.scaling.enabled "
                                         "= false")
        account = hook.get("account")
        groups = hook.get("groups") or {}
        group = groups.get(pool, pool) if isinstance(groups, Mapping) else pool
        if not isinstance(account, str) or not account:
            return ScaleRoute("refused", f"cluster {name!r}: attrs.scaling needs an account")
        provider = accounts.get(account)
        if provider is None:
            return ScaleRoute("refused", f"cluster {name!r}: scaling account {account!r} is not "
                                         "configured ([sync] accounts_file)")
        if Capability.SCALE_POOL not in provider.capabilities:
            return ScaleRoute("refused", f"account {account!r} ({provider.name}) cannot scale "
                                         "node groups")
        return ScaleRoute("account", account=account, group=str(group))
    driver = drivers.get(name)
    if driver is None:
        return ScaleRoute("refused", f"cluster {name!r} has no driver")
    if Capability.SCALE_POOL in driver.capabilities and isinstance(driver, PoolScalingDriver):
        return ScaleRoute("driver")
    return ScaleRoute("refused", f"cluster {name!r} cannot scale pool {pool!r}: its driver has "
                                 "no node-pool ability and the registration declares no "
                                 "node-pool hook (attrs.scaling.account)")


def scalable_pools(records: Sequence[ClusterRecord], *,
                   drivers: Mapping[str, ClusterDriver],
                   accounts: Mapping[str, CloudProvider]) -> set[tuple[str, str]]:
    """(cluster, pool) of every pool that can scale: the planner's view of `max_nodes`."""
    return {(r.cluster.name, p.name) for r in records for p in r.cluster.pools
            if scale_route(r, p.name, drivers=drivers, accounts=accounts).how != "refused"}


async def set_nodes(route: ScaleRoute, rec: ClusterRecord, pool: str, nodes: int, *,
                    drivers: Mapping[str, ClusterDriver],
                    accounts: Mapping[str, CloudProvider], order: str = "") -> int:
    """Grow `pool` to `nodes` (ordered nodes included); returns the count. A driver's pool
    shrinks to it by empty nodes only; a cloud node group never shrinks here. `order`: the
    order's idempotency key for a cloud node group (CloudProvider.scale_pool)."""
    if route.how == "account":
        spec = next(p for p in rec.cluster.pools if p.name == pool)
        return await accounts[route.account].scale_pool(
            region=rec.cluster.region, pool=route.group, instance_type=spec.instance_type,
            nodes=nodes, labels={SKYFED_CLUSTER_LABEL: rec.cluster.name},
            spot=spec.pricing is PricingModel.SPOT, order=order)
    driver = drivers[rec.cluster.name]
    if route.how != "driver" or not isinstance(driver, PoolScalingDriver):
        raise ProviderError(route.reason or "cannot scale", provider="skyfed")
    return await driver.scale_pool(pool=pool, nodes=nodes)


async def remove_nodes(route: ScaleRoute, rec: ClusterRecord, pool: str,
                       names: Sequence[str], *,
                       drivers: Mapping[str, ClusterDriver],
                       accounts: Mapping[str, CloudProvider],
                       inventory: Sequence[NodeInventory] | None = None) -> int:
    """Remove exactly the nodes `names` and return the pool's count. A driver removes them
    (empty ones only). A cloud node group terminates their machines, each named as its
    cloud knows it (`NodeInventory.instance` from the driver's `inventory`, which the caller
    has read: the tail of the node's providerID; a node it does not list goes by its own
    name), as the Cluster Autoscaler's DeleteNodes does, so a node the planner did not name,
    which may run work, never goes in its place."""
    if route.how == "account":
        known = {n.name: n.instance for n in inventory or ()}
        return await accounts[route.account].remove_nodes(
            region=rec.cluster.region, pool=route.group,
            nodes=[known.get(name, name) for name in names],
            labels={SKYFED_CLUSTER_LABEL: rec.cluster.name})
    driver = drivers[rec.cluster.name]
    if route.how != "driver" or not isinstance(driver, PoolScalingDriver):
        raise ProviderError(route.reason or "cannot scale", provider="skyfed")
    return await driver.remove_nodes(pool=pool, nodes=list(names))


async def read_inventory(driver: ClusterDriver | None) -> list[NodeInventory] | None:
    """The driver's node inventory; None without a driver or when it cannot answer."""
    if driver is None:
        return None
    try:
        return await driver.inventory()
    except ProviderError:
        return None


async def observed_nodes(driver: ClusterDriver | None, pool: str) -> int | None:
    """Nodes of `pool` in the driver's inventory (joined, booted); None when unknown."""
    inventory = await read_inventory(driver)
    if inventory is None:
        return None
    return sum(1 for n in inventory if n.pool == pool)
