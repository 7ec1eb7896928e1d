"""The live loop's Prometheus metrics (default registry, served on /metrics).

Labels never carry tenant or cluster names (a later issue locks /metrics down), only
bounded vocabularies: decision kinds, outcomes, who failed over.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PLACEMENT_EPOCH = Histogram(
    "skyfed_placement_epoch_seconds",
    "One placement epoch: snapshot, policy, solve and the write of its decisions",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
PENDING = Gauge("skyfed_pending_workloads", "Workloads waiting for the placement loop")
DECISIONS = Counter(
    "skyfed_decisions_total",
    "Decisions recorded by the placement loop, by kind (placement, scale, scale_in, prewarm, "
    "migration, retry)", ["kind"])
ACTUATIONS = Counter(
    "skyfed_actuations_total",
    "Decisions the actuator finished, by kind and final state (done, refused, failed, "
    "superseded)", ["kind", "state"])
FAILOVERS = Counter(
    "skyfed_failovers_total",
    "Workloads moved off a failed place: by the reconciler (cluster) or the edge hub (site)",
    ["by"])
LEADER_EPOCH = Gauge(
    "skyfed_leader_epoch",
    "The fencing epoch this replica leads under while it is the elected leader (it runs the "
    "loops); 0 while it is not (broker/federation/leader.py)")

# Export every series from the start (at 0), so dashboards and alerts see them before the
# first event.
for _kind in ("placement", "scale", "scale_in", "prewarm", "migration", "retry", "preemption"):
    DECISIONS.labels(_kind)
for _by in ("reconciler", "edge_hub"):
    FAILOVERS.labels(_by)
