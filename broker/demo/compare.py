"""The demo's honest comparison: LP vs greedy vs traditional on the same batch.

Why call the planner directly: the live broker only runs one policy, and a
saving is only meaningful against the other policies on exactly the same
snapshot (same clusters, same free capacity, same prices, same batch).

`live_comparison` takes that snapshot from the placement loop itself: the epoch that
solved the demo's batch (`PlacementLoop.solved`, kept in memory as the loop solved it:
the merged snapshot with what the drivers reported, the policy's action). The `lp` row is
the plan that epoch wrote, not a re-solve; greedy and traditional are solved on the same
snapshot under the same action and planner configuration. Only when no such epoch is
there (the loop is not running, or the batch was split over epochs) does
`resolved_comparison` re-solve all three on a snapshot built from the registrations alone
(`demo_snapshot`: no observed nodes, registered spot reclaim rates, fixed weights), and its
title and note say so: that `lp` row may differ from the live placements (seen before
this distinction: the live loop put checkout-eu at edge-paris, the re-solve at gcp-euw4,
because the live snapshot held the simulated drivers' nodes and their observed reclaim
rates). Edge sites are registered as clusters with provider `edge` and one fixed pool
priced at the site's amortised cost, so they are options like any other.

What is compared, per policy: USD/hour of what was placed (compute at list
prices), one-off egress for moving input data, the objective the planner
minimises (cost + latency penalty + egress + new-node charges + unplaced penalty),
workloads left
unplaced and latency SLOs missed. Greedy may look cheaper per hour when it
places less or ignores latency; the table shows all columns so nobody has to
take a single number on trust.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from broker.demo.federation import DemoFederation
from broker.domain import FederationSnapshot, Placement, PolicyAction, Workload
from broker.federation.placement_loop import SolvedEpoch
from broker.placement.network import batch_maps, cluster_pairs
from broker.placement.planner import EpochPlan, PlannerConfig, plan_epoch
from broker.placement.snapshot import Member, MergeInputs, SiteMember, merge
from providers.catalog import Catalog

POLICIES = ("lp", "greedy", "traditional")


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    usd_per_hour: float
    objective: float
    placed: int
    unplaced: int
    slo_missed: int
    decide_ms: float
    status: str
    where: Mapping[str, str] = field(default_factory=dict)  # workload id -> cluster(s)


def demo_snapshot(fed: DemoFederation, workloads: Sequence[Workload] | None = None,
                  now_s: float = 0.0, catalog: Catalog | None = None) -> FederationSnapshot:
    """The snapshot the live placement loop merges for this batch (placement/snapshot.py):
    the registered clusters and edge sites, the pending batch, and the catalog's network
    maps for it; no named user regions (the live loop has none configured in the demo)."""
    cat = catalog or Catalog.load()
    pending = tuple(workloads if workloads is not None else fed.domain_workloads(now_s))
    clusters = fed.clusters + fed.site_clusters
    rtt, egress = batch_maps(cat, clusters, pending)
    pair_rtt, gbps = cluster_pairs(clusters, cat)
    return merge(MergeInputs(
        now_s=now_s, members=tuple(Member(c, registered_s=now_s) for c in fed.clusters),
        sites=tuple(SiteMember(s, registered_s=now_s) for s in fed.domain_sites),
        pending=pending, user_rtt_ms=rtt, egress_usd_per_gb=egress, cluster_rtt_ms=pair_rtt,
        bandwidth_gbps=gbps))


def _slo_missed(plan: EpochPlan, snapshot: FederationSnapshot) -> int:
    slo = {w.id: w.spec.latency_slo_ms for w in snapshot.pending}
    missed = 0
    for p in plan.placements:
        bound = slo.get(p.workload_id)
        if bound is not None and p.rtt_ms is not None and p.rtt_ms > bound + 1e-6:
            missed += 1
    return missed


def result_of(policy: str, plan: EpochPlan, snapshot: FederationSnapshot) -> PolicyResult:
    """One row of the comparison: what `plan` (of `snapshot.pending`) places and costs."""
    return PolicyResult(
        policy=policy,
        usd_per_hour=sum(p.cost_usd_per_hour for p in plan.placements),
        objective=plan.stats.objective,
        placed=sum(1 for p in plan.placements if p.placed_replicas > 0),
        unplaced=len(plan.unplaced), slo_missed=_slo_missed(plan, snapshot),
        decide_ms=1000.0 * (plan.stats.build_s + plan.stats.solve_s),
        status=plan.stats.status,
        where={p.workload_id: "+".join(sorted({a.cluster for a in p.assignments}))
               for p in plan.placements})


def compare_policies(snapshot: FederationSnapshot, config: PlannerConfig | None = None,
                     action: PolicyAction | None = None,
                     policies: Sequence[str] = POLICIES,
                     solved: Mapping[str, EpochPlan] | None = None) -> dict[str, PolicyResult]:
    """Every policy on the same snapshot; pure apart from the planner's timers. A policy in
    `solved` is not solved again: its row is that plan (the live loop's own)."""
    cfg = config or PlannerConfig()
    act = action or PolicyAction()
    given = solved or {}
    return {policy: result_of(policy, given[policy] if policy in given else
                              plan_epoch(snapshot, act, cfg, policy=policy), snapshot)
            for policy in policies}


@dataclass(frozen=True, slots=True)
class Comparison:
    """What the demo compares, and a title and a note that say which it is."""

    snapshot: FederationSnapshot
    action: PolicyAction
    config: PlannerConfig
    solved: Mapping[str, EpochPlan]  # policy -> the plan it ran (not re-solved)
    title: str
    note: str
    placed_by: str = ""  # what steered the live plan ("" when not the live plan)

    @property
    def live(self) -> bool:
        return bool(self.solved)

    def results(self) -> dict[str, PolicyResult]:
        return compare_policies(self.snapshot, self.config, self.action, solved=self.solved)


def batch_epoch(epochs: Sequence[SolvedEpoch], ids: Collection[str]) -> SolvedEpoch | None:
    """The newest epoch that solved every one of `ids` (placed or left unplaced each):
    the batch was one LP, so the baselines can be run on exactly its snapshot."""
    want = set(ids)
    for e in reversed(epochs):
        solved = {p.workload_id for p in e.plan.placements} | set(e.plan.unplaced)
        if want and want <= solved:
            return e
    return None


def live_comparison(epoch: SolvedEpoch, config: PlannerConfig, policy: str) -> Comparison:
    """The live loop's own plan of `epoch` as the `lp` row; the baselines on its snapshot."""
    return Comparison(
        snapshot=epoch.snapshot, action=epoch.action, config=config,
        solved={"lp": epoch.plan},
        title="Same batch, same snapshot: the live plan (LP) vs the baselines",
        note=(f"lp = the plan the placement loop wrote in its epoch {epoch.tick} (policy "
              f"{policy}, action from the {epoch.source} policy); greedy and traditional "
              "solved on that epoch's snapshot with the same action"),
        placed_by=f"policy {policy}, action from the {epoch.source} policy")


def resolved_comparison(fed: DemoFederation, config: PlannerConfig, action: PolicyAction,
                        why: str) -> Comparison:
    """All three re-solved on the registrations (`demo_snapshot`), saying why and that
    this `lp` is not the live plan."""
    return Comparison(
        snapshot=demo_snapshot(fed), action=action, config=config, solved={},
        title="Same batch, re-solved: LP vs the baselines (not the live plan)",
        note=(f"all three re-solved on the registered federation ({why}): no observed nodes, "
              "fixed weights, so lp may place a workload elsewhere than the live broker"))


def saving_frac(results: Mapping[str, PolicyResult], baseline: str,
                field: str = "objective") -> float | None:
    """(baseline - lp) / baseline for `field`; None when either is missing or zero."""
    lp, base = results.get("lp"), results.get(baseline)
    if lp is None or base is None:
        return None
    b, v = getattr(base, field), getattr(lp, field)
    return None if b <= 0 else (b - v) / b


def placements_by_workload(plan_placements: Sequence[Placement]) -> dict[str, Placement]:
    return {p.workload_id: p for p in plan_placements}


def differences(results: Mapping[str, PolicyResult], policy: str,
                names: Mapping[str, str]) -> list[str]:
    """`workload: lp cluster -> policy's cluster` for every workload they place apart."""
    lp, other = results.get("lp"), results.get(policy)
    if lp is None or other is None:
        return []
    out = []
    for wid in sorted(set(lp.where) | set(other.where), key=lambda i: names.get(i, i)):
        a, b = lp.where.get(wid, "unplaced"), other.where.get(wid, "unplaced")
        if a != b:
            out.append(f"{names.get(wid, wid)}: {b} (LP: {a})")
    return out
