"""THE policy observation: FederationSnapshot -> GraphObs, for the live broker and the twin. Pure.

Both shells call `observe(snapshot)` on the snapshot they hand the planner (the live one from
broker/federation/snapshot.py, the twin's from broker/sim/snapshot.py), so a feature means
the same thing in training and in production. Node features (policy.NODE_FEATURES, order and
names are the checkpoint format), one row per cluster, each scaled to roughly [0, 1]:

- free_cpu_frac, free_gpu_frac: 1 - used / provisioned over the cluster's pools (`Pool.used`,
  `Pool.nodes` x `Pool.node`); 1 (cpu) / 0 (gpu) where nothing is provisioned;
- price_usd_per_vcpu_hour: mean of node price / vCPUs over non-spot pools / PRICE_SCALE;
- spot_discount: 1 - mean spot price per vCPU / mean on-demand price per vCPU (0 without);
- reclaim_rate_per_hour: sum of the pools' spot reclaim rates;
- queue_frac: replicas placed but not running yet / replicas placed (`Pool.replicas_*`);
- recent_demand: sum of the pools' demand EWMA (`FederationSnapshot.demand`) / DEMAND_SCALE;
- healthy; is_edge (fixed hardware: edge or on-prem, network.FIXED_PROVIDERS);
- booting_frac: nodes booting (`NodeState.booting`) / nodes;
- idle_node_frac: ready nodes with nothing on them (no vCPU allocated, every GPU free) /
  nodes (what the idle timeout and the warm pool act on);
- spot_capacity_frac: provisioned vCPUs in spot pools / provisioned vCPUs;
- forecast_cpu_frac, forecast_gpu_frac: the forecast growth over the next window W (the
  pools' growth rates x W, `growth_rates`) / provisioned vCPUs (GPUs), capped at FORECAST_CAP.

Pool rows (policy.POOL_FEATURES), one per scalable pool (decisions.fixed_pool is not: an
edge site's hardware is never scaled), in cluster then pool order, with their cluster's row
index (`GraphObs.pool_cluster`); what the per-pool actions (idle timeout, warm pool, spot
bias) act on:

- free_cpu_frac, free_gpu_frac, price_usd_per_vcpu_hour, reclaim_rate_per_hour: as the
  cluster's, for this pool alone; is_spot; is_gpu (GPUs per node > 0);
- node_vcpu_log: log1p(vCPUs per node) / NODE_VCPU_LOG_SCALE (a node's size: 8 vCPUs 0.44,
  96 vCPUs 0.91);
- nodes_of_max: nodes / max_nodes (room left to grow);
- booting_frac, idle_node_frac: as the cluster's, for this pool;
- idle_age_frac: the mean time its idle nodes have been idle (`NodeState.idle_since_s`) /
  action_space.IDLE_TIMEOUT_MAX_S, capped at 1 (0 without idle nodes): how close they are
  to a timer;
- forecast_frac: the pool's forecast growth over W in its bottleneck unit (GPUs on GPU
  pools, else vCPUs) / what it provisions (/ one node when it has none), capped at
  FORECAST_CAP.

The forecast is the planner's own (`growth_rates`): each pool's net rate, its demand EWMA
minus its release EWMA (`decisions.forecast_rate`, what the node-prewarm rule extrapolates),
growth only, so a pool whose work ends as fast as it arrives forecasts nothing, as the
prewarm rule sees it. `recent_demand` stays the arrivals alone. Before 2026-12-07 the
forecasts were arrivals alone (`net_forecast=False`), the features es3 was trained on; the
checkpoint metadata records which (`observation.net_forecast`, action_space.fixed_weights).

Demand forecasts are on the caller's own time scale: W = `forecast_window_s`, the time the
policy's action stands (the twin passes its decision interval; the live broker the same
default), so a 1-hour scenario and a 1-day one are both forecast over what the next action
governs rather than over a fixed clock.

Edges: each cluster receives from its K_NEIGHBOURS nearest clusters by RTT
(`snapshot.rtt_ms` between cluster names, else the coordinate estimate, else 1000 ms), with
features RTT / 100 ms and throughput (`snapshot.bandwidth_gbps`, else
network.THROUGHPUT_FALLBACK_GBPS) / 10 Gbit/s. Batch features: log1p of the pending
replicas, vCPUs and GPUs, the latency-sensitive and training shares, time of day (sin, cos),
log1p of the federation's forecast growth in vCPUs and GPUs over W, and log1p(W / 60 s).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from broker.domain import Cluster, FederationSnapshot, Pool, PricingModel, WorkloadKind
from broker.placement.action_space import IDLE_TIMEOUT_MAX_S, OBSERVE_NET_FORECAST
from broker.placement.decisions import DecisionConfig, fixed_pool, forecast_rate
from broker.placement.network import THROUGHPUT_FALLBACK_GBPS, is_fixed
from broker.placement.policy import EDGE_FEATURES, NODE_FEATURES, POOL_FEATURES, GraphObs
from providers.geo import estimate_rtt_ms

PRICE_SCALE_USD_PER_VCPU_HOUR = 0.1
DEMAND_SCALE_CPU_PER_S = 0.05
K_NEIGHBOURS = 4
UNKNOWN_RTT_MS = 1000.0
FORECAST_WINDOW_S = 300.0
FORECAST_CAP = 4.0
NODE_VCPU_LOG_SCALE = 5.0
_NET = DecisionConfig(net_forecast=True)
_ARRIVALS = DecisionConfig(net_forecast=False)


def node_features(c: Cluster, forecast_window_s: float,
                  demand: Mapping[tuple[str, str], tuple[float, float]],
                  growth: Mapping[tuple[str, str], tuple[float, float]]) -> list[float]:
    """One cluster's row of NODE_FEATURES (see the module docstring); `demand`: the
    snapshot's per-pool demand rates (FederationSnapshot.demand); `growth`: each pool's
    forecast growth rate (`growth_rates`)."""
    rates = [demand.get((c.name, p.name), (0.0, 0.0)) for p in c.pools]
    grows = [growth.get((c.name, p.name), (0.0, 0.0)) for p in c.pools]
    cpu_prov = sum(p.nodes * p.node.cpu for p in c.pools)
    cpu_used = sum(p.used.cpu for p in c.pools)
    gpu_prov = sum(p.nodes * p.node.gpu for p in c.pools)
    gpu_used = sum(p.used.gpu for p in c.pools)
    od = [p.price_usd_per_hour / max(p.node.cpu, 1.0) for p in c.pools
          if p.pricing is not PricingModel.SPOT]
    spot = [p.price_usd_per_hour / max(p.node.cpu, 1.0) for p in c.pools
            if p.pricing is PricingModel.SPOT]
    od_mean = sum(od) / len(od) if od else 0.0
    discount = 1.0 - (sum(spot) / len(spot)) / od_mean if spot and od_mean > 0 else 0.0
    placed = sum(p.replicas_placed for p in c.pools)
    starting = sum(p.replicas_starting for p in c.pools)
    nodes = sum(p.nodes for p in c.pools)
    booting = sum(1 for p in c.pools for n in p.node_states if n.booting)
    idle = sum(1 for p in c.pools for n in p.node_states
               if not n.booting and n.cpu_allocated <= 1e-9 and n.gpu_free >= p.node.gpu)
    spot_cpu = sum(p.nodes * p.node.cpu for p in c.pools if p.pricing is PricingModel.SPOT)
    fc_cpu = sum(r[0] for r in grows) * forecast_window_s
    fc_gpu = sum(r[1] for r in grows) * forecast_window_s
    return [
        1.0 - cpu_used / cpu_prov if cpu_prov else 1.0,
        1.0 - gpu_used / gpu_prov if gpu_prov else 0.0,
        od_mean / PRICE_SCALE_USD_PER_VCPU_HOUR,
        discount,
        sum(p.reclaim_rate_per_hour for p in c.pools),
        starting / placed if placed else 0.0,
        sum(r[0] for r in rates) / DEMAND_SCALE_CPU_PER_S,
        1.0 if c.healthy else 0.0,
        1.0 if is_fixed(c) else 0.0,
        booting / nodes if nodes else 0.0,
        idle / nodes if nodes else 0.0,
        spot_cpu / cpu_prov if cpu_prov else 0.0,
        min(FORECAST_CAP, fc_cpu / cpu_prov) if cpu_prov else min(FORECAST_CAP, fc_cpu),
        min(FORECAST_CAP, fc_gpu / gpu_prov) if gpu_prov else min(FORECAST_CAP, fc_gpu),
    ]


def pool_features(p: Pool, now_s: float, forecast_window_s: float = FORECAST_WINDOW_S,
                  rate: tuple[float, float] = (0.0, 0.0)) -> list[float]:
    """One pool's row of POOL_FEATURES (see the module docstring); `rate`: its forecast
    growth rates (`growth_rates`), vCPU/s and GPU/s."""
    cpu_prov, gpu_prov = p.nodes * p.node.cpu, p.nodes * p.node.gpu
    idle = [n for n in p.node_states if not n.booting and n.cpu_allocated <= 1e-9
            and n.gpu_free >= p.node.gpu]
    ages = [min(1.0, max(0.0, now_s - n.idle_since_s) / IDLE_TIMEOUT_MAX_S)
            for n in idle if n.idle_since_s is not None]
    gpu = p.node.gpu > 0
    unit = p.node.gpu if gpu else p.node.cpu
    forecast = (rate[1] if gpu else rate[0]) * forecast_window_s
    have = gpu_prov if gpu else cpu_prov
    return [
        1.0 - p.used.cpu / cpu_prov if cpu_prov else 1.0,
        1.0 - p.used.gpu / gpu_prov if gpu_prov else 0.0,
        p.price_usd_per_hour / max(p.node.cpu, 1.0) / PRICE_SCALE_USD_PER_VCPU_HOUR,
        1.0 if p.pricing is PricingModel.SPOT else 0.0,
        p.reclaim_rate_per_hour,
        1.0 if gpu else 0.0,
        math.log1p(max(0.0, p.node.cpu)) / NODE_VCPU_LOG_SCALE,
        p.nodes / p.max_nodes if p.max_nodes > 0 else 0.0,
        sum(1 for n in p.node_states if n.booting) / p.nodes if p.nodes else 0.0,
        len(idle) / p.nodes if p.nodes else 0.0,
        sum(ages) / len(ages) if ages else 0.0,
        min(FORECAST_CAP, forecast / (have if have > 0 else max(unit, 1e-9))),
    ]


def _rtt(snapshot: FederationSnapshot, a: Cluster, b: Cluster) -> float:
    ms = snapshot.rtt_ms.get((a.name, b.name), snapshot.rtt_ms.get((b.name, a.name)))
    if ms is None and None not in (a.lat, a.lon, b.lat, b.lon):
        ms = estimate_rtt_ms(a.lat, a.lon, b.lat, b.lon)  # type: ignore[arg-type]
    return UNKNOWN_RTT_MS if ms is None else float(ms)


def edges(snapshot: FederationSnapshot, k_neighbours: int = K_NEIGHBOURS
          ) -> tuple[np.ndarray, np.ndarray]:
    """(edge_index [2, E], edge_x [E, EDGE_FEATURES]): each cluster from its nearest ones."""
    clusters = snapshot.clusters
    src: list[int] = []
    dst: list[int] = []
    feats: list[tuple[float, float]] = []
    for i, a in enumerate(clusters):
        near = sorted((_rtt(snapshot, a, b), j) for j, b in enumerate(clusters) if j != i)
        for ms, j in near[:k_neighbours]:
            gbps = snapshot.bandwidth_gbps.get((clusters[j].name, a.name),
                                               THROUGHPUT_FALLBACK_GBPS)
            src.append(j)
            dst.append(i)
            feats.append((ms / 100.0, gbps / 10.0))
    return (np.asarray([src, dst], dtype=np.int64).reshape(2, len(src)),
            np.asarray(feats, dtype=np.float32).reshape(len(src), len(EDGE_FEATURES)))


def growth_rates(snapshot: FederationSnapshot, *, net: bool = True
                 ) -> dict[tuple[str, str], tuple[float, float]]:
    """(cluster, pool) -> the (vCPU/s, GPU/s) growth the forecast features extrapolate: the
    planner's own forecast rate (`decisions.forecast_rate`: demand EWMA minus release EWMA
    with `net`, else demand alone), growth only (negative parts count 0, as the look-ahead
    scale-in and the drain floor count them)."""
    cfg = _NET if net else _ARRIVALS
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for c in snapshot.clusters:
        for p in c.pools:
            cpu, gpu = forecast_rate(snapshot, cfg, c.name, p.name)
            out[c.name, p.name] = (max(0.0, cpu), max(0.0, gpu))
    return out


def batch_features(snapshot: FederationSnapshot, forecast_window_s: float,
                   growth: Mapping[tuple[str, str], tuple[float, float]]) -> list[float]:
    """BATCH_FEATURES of `snapshot`'s pending batch; `growth`: `growth_rates`."""
    pend = snapshot.pending
    rates = list(growth.values())
    day = 2 * math.pi * (snapshot.now_s % 86400.0) / 86400.0
    n = len(pend)
    return [
        math.log1p(sum(w.spec.replicas for w in pend)),
        math.log1p(sum(w.spec.replicas * w.spec.resources.cpu for w in pend)),
        math.log1p(sum(w.spec.replicas * w.spec.resources.gpu for w in pend)),
        sum(1 for w in pend if w.spec.latency_slo_ms is not None) / n if n else 0.0,
        sum(1 for w in pend if w.spec.kind == WorkloadKind.TRAIN) / n if n else 0.0,
        math.sin(day), math.cos(day),
        math.log1p(sum(r[0] for r in rates) * forecast_window_s),
        math.log1p(sum(r[1] for r in rates) * forecast_window_s),
        math.log1p(forecast_window_s / 60.0),
    ]


def observe(snapshot: FederationSnapshot, *, k_neighbours: int = K_NEIGHBOURS,
            forecast_window_s: float = FORECAST_WINDOW_S,
            net_forecast: bool = OBSERVE_NET_FORECAST) -> GraphObs:
    """The policy's observation of `snapshot` (see the module docstring); `net_forecast`:
    forecast columns of net growth (the default) or, for a model trained on them, arrivals
    alone (policy.ActorCritic.net_forecast_observed)."""
    clusters = snapshot.clusters
    window = max(0.0, forecast_window_s)
    growth = growth_rates(snapshot, net=net_forecast)
    edge_index, edge_x = edges(snapshot, k_neighbours)
    node_x = np.asarray([node_features(c, window, snapshot.demand, growth)
                         for c in clusters], dtype=np.float32)
    pools = [(i, c, p) for i, c in enumerate(clusters) for p in c.pools
             if not fixed_pool(c, p)]
    pool_x = np.asarray([pool_features(p, snapshot.now_s, window, growth[c.name, p.name])
                         for _, c, p in pools], dtype=np.float32)
    return GraphObs(names=tuple(c.name for c in clusters),
                    node_x=node_x.reshape(len(clusters), len(NODE_FEATURES)),
                    edge_index=edge_index, edge_x=edge_x,
                    batch_x=np.asarray(batch_features(snapshot, window, growth),
                                       dtype=np.float32),
                    pools=tuple((c.name, p.name) for _, c, p in pools),
                    pool_x=pool_x.reshape(len(pools), len(POOL_FEATURES)),
                    pool_cluster=np.asarray([i for i, _, _ in pools], dtype=np.int64))
