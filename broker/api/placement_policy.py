"""`skyfed.io/v1 PlacementPolicy`: where a Kubernetes workload may run, modelled on Karmada's
PropagationPolicy, and the `skyfed.io/*` annotations that say the same on the workload.

```yaml
apiVersion: skyfed.io/v1
kind: PlacementPolicy
metadata: {name: nginx}
spec:
  resourceSelectors:                 # which workload of the request it governs (all must match)
    - {apiVersion: apps/v1, kind: Deployment, name: nginx, labelSelector: {matchLabels: {}}}
  placement:
    clusterAffinity:                 # only these members / members with these labels
      clusterNames: [aws-use1, gcp-euw4]
      labelSelector: {matchLabels: {tier: prod}}
    spreadConstraints:               # at least minGroups clusters / zones / regions
      - {spreadByField: cluster, minGroups: 2, maxGroups: 3}
    replicaSplit: cost               # cost: the LP divides replicas; weighted: static weights
    weightPreference:                # only with replicaSplit: weighted (Karmada's field)
      staticWeightList:
        - {targetCluster: {clusterNames: [aws-use1]}, weight: 3}
        - {targetCluster: {labelSelector: {matchLabels: {tier: prod}}, exclude: [x]}, weight: 1}
  userRegion: frankfurt              # where the users are, and the RTT bound to them
  latencySloMs: 40
  spot: true                         # spot capacity allowed
  budgetUsdPerHour: 5
  priority: 100
```

Unknown fields are refused with their path, like every other request model (schemas.py).

`replicaSplit: weighted` is Karmada's `replicaScheduling: {replicaSchedulingType: Divided,
replicaDivisionPreference: Weighted, weightPreference: {staticWeightList: [...]}}`: each
entry's `targetCluster` (clusterNames, exclude, labelSelector.matchLabels) selects member
clusters and its `weight` (an integer from 1 to `REPLICA_WEIGHT_MAX`) is their share; the
planner divides the replicas as Karmada does (broker/placement/weighted.py). Without a
`weightPreference` (or with an empty list) every feasible cluster weighs 1, as in Karmada.
A `weightPreference` with `replicaSplit: cost` is refused (it would not be honoured), and so
is a cluster name the tenant has no such member for (routes.spec_of).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from broker import limits as lim
from broker.api.schemas import TEXT, Key, Labels, _Model
from broker.domain import ClusterWeight

ANNOTATION_PREFIX = "skyfed.io/"
# annotation (without the prefix) -> field of the skyfed Workload spec (schemas.WorkloadSpecIn)
ANNOTATIONS: dict[str, str] = {
    "kind": "kind", "user-region": "userRegion", "latency-slo-ms": "latencySloMs",
    "spot": "spotOk", "budget-usd-per-hour": "budgetUsdPerHour", "priority": "priority",
    "duration-s": "durationS", "image-gb": "imageGb",
}


class MatchLabelsIn(_Model):
    match_labels: Labels = Field(default_factory=dict)


class ResourceSelectorIn(_Model):
    api_version: str | None = Field(default=None, max_length=64, pattern=TEXT)
    kind: Literal["Deployment", "StatefulSet", "Job"]
    name: str | None = Field(default=None, max_length=253, pattern=TEXT)
    label_selector: MatchLabelsIn | None = None

    def selects(self, api_version: str, kind: str, name: str, labels: dict[str, str]) -> bool:
        if self.kind != kind or self.api_version not in (None, api_version):
            return False
        if self.name is not None and self.name != name:
            return False
        want = self.label_selector.match_labels if self.label_selector else {}
        return all(labels.get(k) == v for k, v in want.items())


class ClusterAffinityIn(_Model):
    cluster_names: list[Key] = Field(default_factory=list, max_length=1000)
    label_selector: MatchLabelsIn | None = None


class SpreadConstraintIn(_Model):
    spread_by_field: Literal["cluster", "zone", "region"] = "cluster"
    min_groups: int = Field(default=1, ge=1, le=1000)
    max_groups: int | None = Field(default=None, ge=1, le=1000)


# Karmada's StaticClusterWeight.Weight is an int64 >= 1; bounded here so a hostile weight
# cannot make the division's arithmetic inexact (weights x replicas stay far below 2^53).
REPLICA_WEIGHT_MAX = 10_000


class TargetClusterIn(_Model):
    cluster_names: list[Key] = Field(default_factory=list, max_length=1000)
    exclude: list[Key] = Field(default_factory=list, max_length=1000)
    label_selector: MatchLabelsIn | None = None


class StaticWeightIn(_Model):
    target_cluster: TargetClusterIn
    weight: int = Field(ge=1, le=REPLICA_WEIGHT_MAX)


class WeightPreferenceIn(_Model):
    static_weight_list: list[StaticWeightIn] = Field(default_factory=list, max_length=100)


class PlacementIn(_Model):
    cluster_affinity: ClusterAffinityIn | None = None
    spread_constraints: list[SpreadConstraintIn] = Field(default_factory=list, max_length=1)
    replica_split: Literal["cost", "weighted"] = "cost"
    weight_preference: WeightPreferenceIn | None = None


class PolicySpecIn(_Model):
    resource_selectors: list[ResourceSelectorIn] = Field(min_length=1, max_length=100)
    placement: PlacementIn = Field(default_factory=PlacementIn)
    user_region: str | None = Field(default=None, max_length=128, pattern=TEXT)
    latency_slo_ms: float | None = Field(default=None, gt=0, le=lim.LATENCY_SLO_MS_MAX)
    spot: bool | None = None
    budget_usd_per_hour: float | None = Field(default=None, ge=0,
                                              le=lim.BUDGET_USD_PER_HOUR_MAX)
    priority: int | None = Field(default=None, ge=-lim.PRIORITY_MAX, le=lim.PRIORITY_MAX)


class PolicyMetaIn(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=TEXT)
    namespace: str | None = Field(default=None, max_length=253, pattern=TEXT)
    labels: Labels = Field(default_factory=dict)
    annotations: dict[str, Any] = Field(default_factory=dict)


class PlacementPolicyIn(_Model):
    api_version: Literal["skyfed.io/v1"]
    kind: Literal["PlacementPolicy"]
    metadata: PolicyMetaIn
    spec: PolicySpecIn

    def spec_fields(self) -> dict[str, Any]:
        """The policy as fields of the skyfed Workload spec (those it sets)."""
        s, p = self.spec, self.spec.placement
        out: dict[str, Any] = {}
        for key, value in (("userRegion", s.user_region), ("latencySloMs", s.latency_slo_ms),
                           ("spotOk", s.spot), ("budgetUsdPerHour", s.budget_usd_per_hour),
                           ("priority", s.priority)):
            if value is not None:
                out[key] = value
        if p.cluster_affinity and p.cluster_affinity.label_selector:
            out["affinity"] = dict(p.cluster_affinity.label_selector.match_labels)
        if p.spread_constraints:
            c = p.spread_constraints[0]
            out["spread"] = {"topology": c.spread_by_field, "minDomains": c.min_groups,
                             "maxDomains": c.max_groups}
        return out

    def cluster_names(self) -> tuple[str, ...]:
        ca = self.spec.placement.cluster_affinity
        return tuple(ca.cluster_names) if ca else ()

    def replica_weights(self) -> tuple[ClusterWeight, ...]:
        """The static weight list as domain values; () for `replicaSplit: cost`. Weighted
        without a list: one entry matching every cluster, weight 1 (Karmada's default)."""
        p = self.spec.placement
        if p.replica_split != "weighted":
            return ()
        entries = p.weight_preference.static_weight_list if p.weight_preference else []
        if not entries:
            return (ClusterWeight(weight=1),)
        return tuple(ClusterWeight(
            weight=e.weight, cluster_names=tuple(e.target_cluster.cluster_names),
            exclude=tuple(e.target_cluster.exclude),
            match_labels=dict(e.target_cluster.label_selector.match_labels
                              if e.target_cluster.label_selector else {}))
            for e in entries)

    def weighted_cluster_names(self) -> list[tuple[str, tuple[str | int, ...]]]:
        """Every cluster named in the static weight list, with its path under `spec`."""
        p = self.spec.placement
        if p.weight_preference is None:
            return []
        return [(name, ("placement", "weightPreference", "staticWeightList", k,
                        "targetCluster", "clusterNames", j))
                for k, e in enumerate(p.weight_preference.static_weight_list)
                for j, name in enumerate(e.target_cluster.cluster_names)]
