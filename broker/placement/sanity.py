"""Is a cluster fit to plan with? A pure check of every number the planner reads.

The API refuses absurd values (`broker/limits.py`), but the store may hold rows
written by older versions, by `skyfed db` tools, or values merged in from drivers
and sync. One cluster priced at `Infinity` once made the LP raise OverflowError
on every epoch, so no tenant's workload was placed. The placement loop therefore
passes what it read through `partition` first: a cluster with a non-finite or
out-of-range number is that cluster's problem (it is left out, with the reason,
and the loop records an event, `broker/federation/quarantine.py`); every other
cluster is planned as usual.

The ranges are the API's (`broker.limits`), so a value the API accepts always
passes here, and pool usage may be anything finite and non-negative up to what
the largest pool could hold. Sizes, prices and quotas must also be either 0 or
at least the API's resolution (a millicore, a byte, a millionth of a dollar):
the planner divides by them, and `5e-324` CPUs overflowed its bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from broker import limits as lim
from broker.domain import Cluster

__all__ = ["cluster_problems", "partition"]

_USED_CPU_MAX = lim.CPU_MAX * lim.NODES_MAX
_USED_MEMORY_MAX = lim.MEMORY_GIB_MAX * lim.NODES_MAX
_USED_GPU_MAX = lim.GPU_MAX * lim.NODES_MAX


_NO_DEMAND: Mapping[tuple[str, str], tuple[float, float]] = MappingProxyType({})
_GIB_BYTE = 1.0 / 1024**3
_USD = 1e-6


def _out_of_range(value: object, lo: float, hi: float, tiny: float) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return not lo <= value <= hi or 0 < abs(value) < tiny


def cluster_problems(c: Cluster, demand: Mapping[tuple[str, str], tuple[float, float]]
                     = _NO_DEMAND,
                     freed: Mapping[tuple[str, str], tuple[float, float]] = _NO_DEMAND
                     ) -> list[str]:
    """Every number of `c` the planner reads that is not finite or not in range (`demand`
    and `freed`: the snapshot's demand and release rates, FederationSnapshot.demand and
    .freed, of which `c`'s pools are read)."""
    checks: list[tuple[str, object, float, float, float]] = [
        ("quotaVcpu", c.quota_vcpu, 0.0, lim.QUOTA_VCPU_MAX, 1e-3),
        ("quotaGpu", c.quota_gpu, 0.0, lim.QUOTA_GPU_MAX, 1e-3),
        ("lat", c.lat, -90.0, 90.0, 0.0), ("lon", c.lon, -180.0, 180.0, 0.0)]
    for p in c.pools:
        at = f"pools[{p.name}]."
        checks += [
            (at + "node.cpu", p.node.cpu, 0.0, lim.CPU_MAX, 1e-3),
            (at + "node.memory", p.node.memory_gib, 0.0, lim.MEMORY_GIB_MAX, _GIB_BYTE),
            (at + "node.gpu", p.node.gpu, 0, lim.GPU_MAX, 1),
            (at + "nodes", p.nodes, 0, lim.NODES_MAX, 1),
            (at + "maxNodes", p.max_nodes, 0, lim.NODES_MAX, 1),
            (at + "priceUsdPerHour", p.price_usd_per_hour, 0.0, lim.PRICE_USD_PER_HOUR_MAX,
             _USD),
            (at + "reclaimRatePerHour", p.reclaim_rate_per_hour, 0.0,
             lim.RECLAIM_RATE_PER_HOUR_MAX, _USD),
            (at + "used.cpu", p.used.cpu, 0.0, _USED_CPU_MAX, 0.0),
            (at + "used.memory", p.used.memory_gib, 0.0, _USED_MEMORY_MAX, 0.0),
            (at + "used.gpu", p.used.gpu, 0, _USED_GPU_MAX, 0.0),
            (at + "largestFreeGpuSet", p.largest_free_gpu_set, 0, lim.GPU_MAX, 0.0)]
        if (rates := demand.get((c.name, p.name))) is not None:
            checks += [(at + "demandCpuPerS", rates[0], 0.0, _USED_CPU_MAX, 0.0),
                       (at + "demandGpuPerS", rates[1], 0.0, _USED_GPU_MAX, 0.0)]
        if (rates := freed.get((c.name, p.name))) is not None:
            checks += [(at + "freedCpuPerS", rates[0], 0.0, _USED_CPU_MAX, 0.0),
                       (at + "freedGpuPerS", rates[1], 0.0, _USED_GPU_MAX, 0.0)]
    return [f"{name}={value!r} is not 0 or a finite number in [{max(lo, tiny):g}, {hi:g}]"
            for name, value, lo, hi, tiny in checks
            if value is not None and _out_of_range(value, lo, hi, tiny)]


def partition(clusters: Iterable[Cluster],
              demand: Mapping[tuple[str, str], tuple[float, float]] = _NO_DEMAND,
              freed: Mapping[tuple[str, str], tuple[float, float]] = _NO_DEMAND
              ) -> tuple[list[Cluster], dict[str, str]]:
    """(clusters fit to plan with, {name: why not} for the rest), order kept."""
    good: list[Cluster] = []
    bad: dict[str, str] = {}
    for c in clusters:
        problems = cluster_problems(c, demand, freed)
        if problems:
            bad[c.name] = "; ".join(problems[:5])
        else:
            good.append(c)
    return good, bad
