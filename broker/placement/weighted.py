"""Static-weight replica division (`replicaSplit: weighted`), copied from Karmada. Pure.

A PlacementPolicy with `replicaSplit: weighted` fixes how many replicas each member cluster
gets; the LP (lp_rows.weighted_rows), the integer `Ledger` (ledger.Ledger.max_fit) and every
baseline (baselines.py) then hold those shares, and the cost model only picks the pools
inside each cluster. The division is Karmada's, as of karmada-io/karmada f8fdd02 (2026-08):

1. Candidates (`pkg/scheduler/core/assignment.go::assignByStaticWeightStrategy`): the
   clusters that passed the scheduler's filters. Here: the clusters where at least one pool
   passes every per-pair constraint (candidates.py's feasibility masks: health, resources,
   GPU, RTT, taints, affinity, clusterNames, tenancy). Capacity is not a filter: Karmada's
   static weights ignore free room (that is `dynamicWeight`).
2. Weights (`pkg/scheduler/core/division_algorithm.go::getStaticWeightInfoList`): a
   candidate's weight is the largest weight of the entries whose `targetCluster` matches it
   (domain.ClusterWeight.matches); candidates matching no entry get nothing. When no
   candidate matches any entry, every candidate gets weight 1 (an even split).
3. Division (`pkg/util/helper/binding.go::Dispenser.AllocateByWeight` ->
   `pkg/util/helper/webstermethod.go::AllocateWebsterSeats`): the Webster (Sainte-Lague)
   method: each replica in turn goes to the cluster with the highest weight / (2 seats + 1);
   ties go to the cluster with fewer replicas, then by name, ascending or descending as the
   parity of the FNV-1a hash of the workload's id says (`tieBreakerByUID`). So 10 replicas
   at 3:1 give 7 and 3 (7.5 : 2.5 rounded toward the smaller cluster), 9 at 1:2 give 3 and 6.

What happens when a weighted cluster cannot take its share, as in Karmada: a cluster that
fails a filter is not a candidate, so its weight is dropped and the replicas are divided over
the remaining candidates by their weights (a failed-over workload re-planned without its
cluster gets the whole split on the others). A candidate that has no room for its share
keeps the share: Karmada binds the replicas there and they wait Pending on the member; the
planner leaves them unplaced with a reason naming the cluster (explain.unplaced_reason),
never moving them to another cluster against the weights.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from broker.domain import Cluster, ClusterWeight, Workload

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def _fnv1a32(text: str) -> int:
    h = _FNV32_OFFSET
    for b in text.encode():
        h = ((h ^ b) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def webster(replicas: int, votes: Mapping[str, int], *, uid: str = "") -> dict[str, int]:
    """Karmada's AllocateWebsterSeats with tieBreakerByUID: cluster -> replicas.

    Every cluster of `votes` is in the answer (0 when it got none). `uid` (Karmada: the
    resource's UID; here the workload id) picks the name order of ties between clusters with
    equal priority and equal replicas: ascending when empty or its FNV-1a hash is even.
    """
    descending = bool(uid) and _fnv1a32(uid) & 1 == 1
    seats = dict.fromkeys(votes, 0)
    if not votes or replicas <= 0:
        return seats
    # heapq pops the smallest key: (-priority, replicas, name rank). The priority is the
    # float64 quotient Karmada compares, so ties are the same ties.
    names = sorted(votes, reverse=descending)
    rank = {n: k for k, n in enumerate(names)}

    def key(name: str) -> tuple[float, int, int]:
        return (-votes[name] / (2 * seats[name] + 1), seats[name], rank[name])

    heap = [(key(n), n) for n in votes]
    heapq.heapify(heap)
    for _ in range(replicas):
        _, name = heapq.heappop(heap)
        seats[name] += 1
        heapq.heappush(heap, (key(name), name))
    return seats


def cluster_weights(weights: Sequence[ClusterWeight],
                    candidates: Sequence[Cluster]) -> dict[str, int]:
    """Karmada's getStaticWeightInfoList: candidate -> weight (only those above 0)."""
    out: dict[str, int] = {}
    for c in candidates:
        w = max((e.weight for e in weights if e.matches(c)), default=0)
        if w > 0:
            out[c.name] = w
    if not out:
        out = {c.name: 1 for c in candidates}
    return out


def shares(workload: Workload, candidates: Sequence[Cluster]) -> dict[str, int]:
    """Replicas per candidate cluster of a weighted workload (only those above 0)."""
    votes = cluster_weights(workload.spec.replica_weights, candidates)
    split = webster(max(0, workload.spec.replicas), votes, uid=workload.id)
    return {c: n for c, n in split.items() if n > 0}


def targets(workloads: Sequence[Workload], option_clusters: Sequence[Cluster],
            feasible: npt.NDArray[np.bool_]
            ) -> tuple[tuple[Mapping[str, int], ...], npt.NDArray[np.bool_]]:
    """Per workload its fixed replicas per cluster ({}: split by cost), and the W x O mask
    of options in a cluster with a share (all True for a workload split by cost).

    `option_clusters[o]` is option o's cluster; `feasible[w, o]` says whether option o passes
    every per-pair constraint for workload w (a cluster with one such option is a candidate,
    step 1 of the module docstring).
    """
    names = np.array([c.name for c in option_clusters], dtype=object)
    unique = list({c.name: c for c in option_clusters}.values())
    mask = np.ones((len(workloads), len(option_clusters)), dtype=np.bool_)
    out: list[Mapping[str, int]] = []
    for i, w in enumerate(workloads):
        if not w.spec.replica_weights:
            out.append({})
            continue
        ok = set(names[feasible[i]].tolist()) if names.size else set()
        share = shares(w, [c for c in unique if c.name in ok])
        out.append(share)
        mask[i] = np.isin(names, list(share)) if names.size else mask[i]
    return tuple(out), mask
