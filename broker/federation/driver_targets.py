"""Cluster registration -> `DriverTarget`: which driver kind, which options, validated.

Why separate from drivers.py: this is pure parsing (the registration's attrs, plus the
shipped catalog for pools that give no node size), so it is tested without a store, and a
mistake in a registration is reported here once, as a `DriverConfigError` naming the
cluster and the attr. docs/clusters.md lists every attr; drivers.py builds and keeps the
drivers.

Kind: `attrs.driver`, else "kubernetes" when attrs has a kubeconfig / in_cluster /
kubernetes, else "edge" for provider edge, else "simulated" (so a fresh install dispatches
somewhere). Kubernetes reads files or the service account of the broker host: only
`TRUSTED_TENANTS` may register one, or an admin's or operator's federation-wide registration
(`ClusterRecord.shared`: operators are who registers the federation's clusters).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.domain import Cluster, Pool
from broker.errors import ConfigError
from providers.base import Interconnect
from providers.catalog import Catalog
from providers.errors import ProviderError
from providers.simulated import SimPool

if TYPE_CHECKING:
    from broker.store import ClusterRecord

KINDS = ("kubernetes", "simulated", "edge")
DEFAULT_NAMESPACE = "skyfed"
TRUSTED_TENANTS = frozenset({"admin"})
_K8S_SHORTHAND = ("kubeconfig", "context", "namespace", "in_cluster")
_K8S_EXTRA = ("max_concurrency", "timeout_s", "watch_timeout_s", "job_backoff_limit")
_K8S_FLAGS = ("create_namespace",)  # true/false in attrs.kubernetes
_SIM_KEYS = ("startup_s", "seed", "boot_s", "prewarm_s", "error_rate")
_EDGE_KEYS = ("site", "command_timeout_s")
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])([A-Z])")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class DriverConfigError(ConfigError):
    """A registration that cannot become a driver; names the cluster and what is wrong."""

    def __init__(self, cluster: str, problem: str) -> None:
        super().__init__(f"cluster {cluster!r}: {problem}")
        self.cluster = cluster
        self.problem = problem


@dataclass(frozen=True, slots=True)
class DriverTarget:
    """What one registration asks for, validated; equal fingerprints mean "reuse the driver"."""

    name: str
    kind: str
    tenant: str
    options: Mapping[str, Any] = field(default_factory=dict)
    pools: tuple[SimPool, ...] = ()

    @property
    def fingerprint(self) -> str:
        blob = json.dumps({"kind": self.kind, "options": self.options,
                           "pools": [_pool_key(p) for p in self.pools]},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def _pool_key(p: SimPool) -> list[Any]:
    # Not the node count: the actuator scales a pool through its driver, and the registry
    # must not rebuild (and so forget) a simulated cluster because its pool grew.
    return [p.name, p.cpu_per_node, p.memory_gib_per_node, p.gpu_per_node, p.gpu_model,
            str(p.interconnect), sorted(p.labels.items()), list(p.taints), p.instance_type]


# ---- registration -> target (no I/O except the catalog file) ------------------------------
def driver_kind(rec: ClusterRecord) -> str:
    """The driver kind a registration asks for (see the module docstring for the rules)."""
    attrs = _snake(rec.attrs)
    explicit = attrs.get("driver")
    if explicit is not None:
        if not isinstance(explicit, str) or explicit not in KINDS:
            raise DriverConfigError(rec.cluster.name, f"unknown driver {explicit!r} in "
                                    f"attrs.driver (known: {', '.join(KINDS)})")
        return explicit
    if any(attrs.get(k) for k in ("kubeconfig", "in_cluster", "kubernetes")):
        return "kubernetes"
    return "edge" if rec.cluster.provider == "edge" else "simulated"


def target_for(rec: ClusterRecord, *, catalog: Callable[[], Catalog] = Catalog.load,
               trusted_tenants: frozenset[str] | None = TRUSTED_TENANTS) -> DriverTarget:
    """Parse and validate one registration; raises DriverConfigError naming what is wrong."""
    name, kind, attrs = rec.cluster.name, driver_kind(rec), _snake(rec.attrs)
    if kind == "kubernetes":
        if trusted_tenants is not None and rec.tenant not in trusted_tenants \
                and not rec.shared:
            raise DriverConfigError(name, f"tenant {rec.tenant!r} may not register a kubernetes "
                                    "driver (it reads a kubeconfig or service account on the "
                                    "broker host); ask an admin or operator to register it")
        return DriverTarget(name=name, kind=kind, tenant=rec.tenant,
                            options=_kubernetes_options(name, attrs))
    pools = tuple(_sim_pool(rec.cluster, p, catalog, full=kind == "edge")
                  for p in rec.cluster.pools)
    if kind == "edge":
        return DriverTarget(name=name, kind=kind, tenant=rec.tenant,
                            options=_edge_options(name, attrs), pools=pools)
    sim = attrs.get("simulated", {})
    if not isinstance(sim, Mapping):
        raise DriverConfigError(name, f"attrs.simulated must be an object, got {sim!r}")
    sim = _snake(sim)
    _refuse_unknown(name, "attrs.simulated", sim, _SIM_KEYS)
    options = {"startup_s": _number(name, "attrs.simulated.startup_s", sim.get("startup_s", 0.0)),
               "seed": int(_number(name, "attrs.simulated.seed", sim.get("seed", 0))),
               "boot_s": _number(name, "attrs.simulated.boot_s", sim.get("boot_s", 0.0)),
               "prewarm_s": _number(name, "attrs.simulated.prewarm_s",
                                    sim.get("prewarm_s", 0.0)),
               # share of provider calls that fail (half 429, half 5xx): the chaos bench
               "error_rate": _number(name, "attrs.simulated.error_rate",
                                     sim.get("error_rate", 0.0))}
    if not 0.0 <= options["error_rate"] <= 1.0:
        raise DriverConfigError(name, "attrs.simulated.error_rate must be within 0..1, got "
                                f"{options['error_rate']}")
    return DriverTarget(name=name, kind=kind, tenant=rec.tenant, options=options, pools=pools)


def _kubernetes_options(name: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    nested = attrs.get("kubernetes") or {}
    if not isinstance(nested, Mapping):
        raise DriverConfigError(name, f"attrs.kubernetes must be an object, got {nested!r}")
    nested = _snake(nested)
    _refuse_unknown(name, "attrs.kubernetes", nested,
                    _K8S_SHORTHAND + _K8S_EXTRA + _K8S_FLAGS)
    merged = {k: attrs[k] for k in _K8S_SHORTHAND if attrs.get(k) is not None} | dict(nested)
    opts: dict[str, Any] = {"namespace": merged.get("namespace", DEFAULT_NAMESPACE),
                            "in_cluster": merged.get("in_cluster", False)}
    for key in ("kubeconfig", "context"):
        value = merged.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise DriverConfigError(name, f"attrs.{key} must be a non-empty string, got {value!r}")
        opts[key] = value
    if opts["kubeconfig"] is not None:
        opts["kubeconfig"] = os.path.expanduser(opts["kubeconfig"])
    if not isinstance(opts["in_cluster"], bool):
        raise DriverConfigError(name, f"attrs.in_cluster must be true or false, "
                                f"got {opts['in_cluster']!r}")
    ns = opts["namespace"]
    if not isinstance(ns, str) or not _NAMESPACE_RE.match(ns):
        raise DriverConfigError(name, f"attrs.namespace {ns!r} is not a valid namespace name")
    for key in _K8S_EXTRA:
        if key in merged:
            value = _number(name, f"attrs.kubernetes.{key}", merged[key])
            if value == 0 and key != "job_backoff_limit":
                raise DriverConfigError(name, f"attrs.kubernetes.{key} must be > 0")
            opts[key] = value if key.endswith("_s") else int(value)
    for key in _K8S_FLAGS:
        if key in merged:
            if not isinstance(merged[key], bool):
                raise DriverConfigError(name, f"attrs.kubernetes.{key} must be true or false, "
                                        f"got {merged[key]!r}")
            opts[key] = merged[key]
    return opts


def _edge_options(name: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    edge = attrs.get("edge") or {}
    if not isinstance(edge, Mapping):
        raise DriverConfigError(name, f"attrs.edge must be an object, got {edge!r}")
    edge = _snake(edge)
    _refuse_unknown(name, "attrs.edge", edge, _EDGE_KEYS)
    site = edge.get("site", name)
    if not isinstance(site, str) or not site:
        raise DriverConfigError(name, f"attrs.edge.site must be a site name, got {site!r}")
    timeout_s = _number(name, "attrs.edge.command_timeout_s", edge.get("command_timeout_s", 5.0))
    if timeout_s == 0:
        raise DriverConfigError(name, "attrs.edge.command_timeout_s must be > 0")
    return {"site": site, "command_timeout_s": timeout_s}


def _snake(given: Mapping[str, Any]) -> dict[str, Any]:
    """The API speaks camelCase (`inCluster`, `timeoutS`): accept it next to snake_case."""
    return {_CAMEL_RE.sub(r"_\1", str(k)).lower(): v for k, v in given.items()}


def _refuse_unknown(name: str, where: str, given: Mapping[str, Any],
                    known: Sequence[str]) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise DriverConfigError(name, f"unknown key(s) in {where}: {', '.join(unknown)} "
                                f"(known: {', '.join(known)})")


def _number(name: str, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise DriverConfigError(name, f"{where} must be a number >= 0, got {value!r}")
    return float(value)


def _sim_pool(cluster: Cluster, pool: Pool, catalog: Callable[[], Catalog], *,
              full: bool = False) -> SimPool:
    """A simulated pool of the registered node count (the actuator scales it up to
    max_nodes), or at `max(nodes, max_nodes)` when `full` (an edge site's fixed hardware);
    node shape from the pool, else from the catalog."""
    cpu, mem, gpu = pool.node.cpu, pool.node.memory_gib, pool.node.gpu
    gpu_model, interconnect = pool.gpu_model, pool.interconnect
    if cpu <= 0 or mem <= 0:
        try:
            offer = catalog().offer(cluster.provider, cluster.region, pool.instance_type)
        except ProviderError as exc:
            raise DriverConfigError(cluster.name, f"pool {pool.name!r} gives no node size and "
                                    f"the catalog has none for it: {exc}") from exc
        cpu, mem, gpu = offer.vcpu, offer.memory_gib, offer.gpu_count
        gpu_model = gpu_model or offer.gpu_model
        if interconnect is Interconnect.NONE:
            interconnect = offer.interconnect
    return SimPool(name=pool.name, nodes=max(pool.nodes, pool.max_nodes) if full else pool.nodes,
                   cpu_per_node=cpu,
                   memory_gib_per_node=mem, gpu_per_node=gpu, gpu_model=gpu_model,
                   interconnect=interconnect, labels=dict(cluster.labels),
                   taints=(*cluster.taints, *pool.taints), instance_type=pool.instance_type)
