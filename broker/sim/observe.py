"""Build the policy's GraphObs from the twin's state (the live loop builds the same from SQL).

Node features (broker/placement/policy.py NODE_FEATURES), each scaled to roughly [0, 1]:
free cpu / gpu fraction of provisioned (1 where none provisioned yet but the pool may grow),
mean on-demand price per vCPU-hour / PRICE_SCALE, spot discount (1 - spot/on-demand of the
cluster's spot pools, 0 without), spot reclaims per hour, the share of placed replicas still
waiting to run (queue), recent reserved cpu rate / DEMAND_SCALE, healthy, is_edge, and the
share of nodes still booting. Edges: each node to its K_NEIGHBOURS nearest by RTT, with
RTT / 100 ms and bandwidth / 10 Gbps.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np

from broker.domain import PolicyAction
from broker.placement.policy import (
    BATCH_FEATURES,
    EDGE_FEATURES,
    NODE_FEATURES,
    ActorCritic,
    GraphObs,
)
from broker.sim import physics
from providers.errors import ProviderError

if TYPE_CHECKING:
    from broker.sim.engine import Engine

PRICE_SCALE_USD_PER_VCPU_HOUR = 0.1
DEMAND_SCALE_CPU_PER_S = 0.05
K_NEIGHBOURS = 4


def build_edges(engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    names = list(engine.clusters)
    src: list[int] = []
    dst: list[int] = []
    feats: list[tuple[float, float]] = []
    for i, a in enumerate(names):
        rtts = sorted((engine.cluster_rtt_ms(a, b), j) for j, b in enumerate(names) if j != i)
        for rtt, j in rtts[:K_NEIGHBOURS]:
            ca, cb = engine.clusters[a].spec, engine.clusters[names[j]].spec
            gbps = physics.THROUGHPUT_FALLBACK_GBPS
            if engine.catalog is not None and not ca.fixed and not cb.fixed:
                with contextlib.suppress(ProviderError):
                    gbps = engine.catalog.throughput_gbps(cb.region_key, ca.region_key)
            src.append(j)
            dst.append(i)
            feats.append((rtt / 100.0, gbps / 10.0))
    if not src:
        return np.zeros((2, 0), dtype=np.int64), np.zeros((0, len(EDGE_FEATURES)),
                                                           dtype=np.float32)
    return (np.asarray([src, dst], dtype=np.int64), np.asarray(feats, dtype=np.float32))


def observe(engine: Engine, now_s: float, edges: tuple[np.ndarray, np.ndarray] | None = None
            ) -> GraphObs:
    """The GraphObs at `now_s` (pass cached `edges`: they only depend on the topology)."""
    names = tuple(engine.clusters)
    waiting: dict[str, int] = dict.fromkeys(names, 0)
    placed: dict[str, int] = dict.fromkeys(names, 0)
    for ws in engine.workloads.values():
        for g in ws.groups:
            placed[g.cluster] += g.count
            if not g.running:
                waiting[g.cluster] += g.count
    rows = []
    for name in names:
        c = engine.clusters[name]
        cpu_prov = sum(p.nodes * p.node.cpu for p in c.pools)
        cpu_used = sum(p.used_cpu for p in c.pools)
        gpu_prov = sum(p.nodes * p.node.gpu for p in c.pools)
        gpu_used = sum(p.used_gpu for p in c.pools)
        od = [p.price_usd_per_hour / max(p.node.cpu, 1.0) for p in c.pools if not p.spec.spot]
        spot = [p for p in c.pools if p.spec.spot]
        discount = 0.0
        if spot and od:
            discount = 1.0 - (sum(p.price_usd_per_hour / max(p.node.cpu, 1.0) for p in spot)
                              / len(spot)) / (sum(od) / len(od))
        nodes = sum(p.nodes for p in c.pools)
        booting = sum(1 for p in c.pools for n in p.node_list if n.ready_at > now_s)
        hours = max(now_s / 3600.0, 1.0)
        rows.append([
            1.0 - cpu_used / cpu_prov if cpu_prov else 1.0,
            1.0 - gpu_used / gpu_prov if gpu_prov else 0.0,
            (sum(od) / len(od) if od else 0.0) / PRICE_SCALE_USD_PER_VCPU_HOUR,
            discount,
            sum(p.reclaims for p in c.pools) / hours,
            waiting[name] / placed[name] if placed[name] else 0.0,
            sum(p.demand_cpu_per_s for p in c.pools) / DEMAND_SCALE_CPU_PER_S,
            1.0 if c.healthy(now_s) else 0.0,
            1.0 if c.spec.fixed else 0.0,
            booting / nodes if nodes else 0.0,
        ])
    pend = [engine.workloads[w] for w in engine.pending]
    reps = sum(ws.pending for ws in pend)
    day = 2 * math.pi * (now_s % 86400.0) / 86400.0
    batch = [
        math.log1p(reps), math.log1p(sum(ws.pending * ws.ev.cpu for ws in pend)),
        math.log1p(sum(ws.pending * ws.ev.gpu for ws in pend)),
        (sum(1 for ws in pend if ws.ev.latency_slo_ms is not None) / len(pend)) if pend else 0.0,
        (sum(1 for ws in pend if ws.ev.kind == "train") / len(pend)) if pend else 0.0,
        math.sin(day), math.cos(day),
    ]
    edge_index, edge_x = edges if edges is not None else build_edges(engine)
    node_x = np.asarray(rows, dtype=np.float32).reshape(len(names), len(NODE_FEATURES))
    return GraphObs(names=names, node_x=node_x, edge_index=edge_index, edge_x=edge_x,
                    batch_x=np.asarray(batch, dtype=np.float32).reshape(len(BATCH_FEATURES)))


class PolicyController:
    """Engine controller for `lp+rl`: observe -> policy mean action (deterministic)."""

    def __init__(self, model: ActorCritic) -> None:
        self.model = model
        self._edges: tuple[np.ndarray, np.ndarray] | None = None
        self.visited: list[GraphObs] = []

    def act(self, engine: Engine, now_s: float) -> PolicyAction:
        if self._edges is None:
            self._edges = build_edges(engine)
        obs = observe(engine, now_s, self._edges)
        self.visited.append(obs)
        return self.model.act(obs).action
