"""`skyfed bench placement`: LP vs greedy vs traditional on generated batches.

Batches are generated from the real catalog (providers.catalog: on-demand and
spot prices, Skyplane-measured RTTs and egress prices, region coordinates), so
the objectives are in real USD. A size `WxO` means W pending workloads and O
options (pools). Capacity is sized so that the cheap pools cannot hold
everything ("contention"): that is where a batch optimiser and a one-at-a-time
greedy differ.

Reported per size (medians over `--repeats` for times): build_s (candidates +
matrix), solve_s, total_s_median (whole plan_epoch, decision records
included), objective, lp_bound, gap (fraction) of the last run (`objective_all` and
`default_path_gap_vs_proven_bound_all`: every run's; the time boxes can make runs of one
batch differ), greedy_objective,
traditional_objective, plus unplaced counts and placed-cost of each policy and
how much below greedy the LP lands. The lp rows run the default PlannerConfig,
the one the live broker and the twin use. Against the untimed reference
(`reference_bound`): `lp_bound_full` (the unpruned LP), `proven_bound` (the
dual bound of a MIP run for `--proven-mip-s` seconds, or the LP bound above
`--proven-max-workloads`) and `default_path_gap_vs_proven_bound`.

The sizes run under the garbage collector's settings of `skyfed serve`, whose placement
loop plans the live epochs (broker/heap.py: the start-up heap frozen, young collections
every 20,000 allocations): at the interpreter's defaults a full collection of the warm
process's heap (~150 ms at 1000x200) fell into every third or fourth plan, which the live
loop does not pay.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from broker.domain import (
    Cluster,
    DataSource,
    FederationSnapshot,
    Interconnect,
    PolicyAction,
    Pool,
    PricingModel,
    Resources,
    Tenant,
    Workload,
    WorkloadKind,
    WorkloadSpec,
)
from broker.heap import SERVE_YOUNG_THRESHOLD, run_heap
from broker.placement import lp, pricing
from broker.placement.baselines import greedy
from broker.placement.ledger import penalties, tenant_budgets
from broker.placement.planner import (
    EpochPlan,
    PlannerConfig,
    candidates,
    plan_epoch,
    solved_batch,
)
from broker.placement.snapshot import Member, MergeInputs, merge
from providers.base import Offer
from providers.catalog import Catalog

POOLS_PER_CLUSTER = 10
# Where proven_bound is the LP bound alone (above --proven-max-workloads), the reference
# seeds its columns from a sample of 1/REFERENCE_SAMPLE_DIV of the batch, REFERENCE_SEED_COLUMNS
# options per workload (pricing.seed), instead of the default path's 250 x 4. At 20000x2000
# (seed 1) pricing from the default path's columns added ~60,000-70,000 columns a round,
# each round dearer (30-100 s CPU), the LP 867,018 -> 853,943 after 7 rounds and 400 s CPU,
# and did not converge in 600 s; from a 2,500-workload sample with 8 columns each the first
# LP is 848,800 and pricing converges (847,899.88) in 11 rounds, ~535 s CPU in all.
REFERENCE_SAMPLE_DIV = 8
REFERENCE_SEED_COLUMNS = 8


def _pick_offers(catalog: Catalog, provider: str, region: str,
                 rng: random.Random) -> list[Offer]:
    offers = [o for o in catalog.offers(provider=provider, region=region)
              if o.price_usd_per_hour and o.vcpu >= 2]
    cpu = sorted((o for o in offers if o.gpu_count == 0 and 4 <= o.vcpu <= 64),
                 key=lambda o: o.price_usd_per_hour / o.vcpu)  # type: ignore[operator]
    gpu = [o for o in offers if o.gpu_count > 0 and o.gpu_model]
    picked = rng.sample(cpu[:40], min(7, len(cpu[:40])))
    picked += rng.sample(gpu, min(3, len(gpu)))
    return picked


def _pool(offer: Offer, rng: random.Random) -> Pool:
    spot = offer.spot_price_usd_per_hour is not None and rng.random() < 0.4
    price = offer.spot_price_usd_per_hour if spot else offer.price_usd_per_hour
    node = Resources(cpu=offer.vcpu, memory_gib=offer.memory_gib, gpu=offer.gpu_count)
    nodes = rng.randint(0, 3)
    used = node.scale(nodes * rng.uniform(0.2, 0.8)) if nodes else Resources()
    used = Resources(used.cpu, used.memory_gib, min(used.gpu, node.gpu * nodes))
    return Pool(
        name=f"{offer.instance_type}{'-spot' if spot else ''}",
        instance_type=offer.instance_type, node=node, nodes=nodes,
        max_nodes=nodes + (rng.randint(2, 8) if offer.gpu_count else rng.randint(4, 16)),
        price_usd_per_hour=float(price or 0.0),
        pricing=PricingModel.SPOT if spot else PricingModel.ON_DEMAND,
        gpu_model=offer.gpu_model, interconnect=offer.interconnect, used=used,
        reclaim_rate_per_hour=0.05 if spot else 0.0)


def generate(catalog: Catalog, n_workloads: int, n_options: int, *,
             seed: int = 1) -> FederationSnapshot:
    """A federation of ~n_options pools over real regions and a batch of n_workloads."""
    rng = random.Random(seed)
    regions = [r for p in ("aws", "gcp", "azure") for r in catalog.regions(p)
               if r.lat is not None and r.lon is not None]
    rng.shuffle(regions)
    clusters: list[Cluster] = []
    n_pools = 0
    # One cluster per region first; past ~1,360 options (136 regions x 10 pools) a second,
    # third ... cluster per region (as a federation with several clusters in a region has).
    for round_ in range(1 + n_options // max(1, POOLS_PER_CLUSTER * len(regions))):
        for r in regions:
            if n_pools >= n_options:
                break
            offers = _pick_offers(catalog, r.provider, r.name, rng)
            pools = tuple(_pool(o, rng) for o in offers[:n_options - n_pools])
            if not pools:
                continue
            n_pools += len(pools)
            clusters.append(Cluster(
                name=f"{r.provider}-{r.name}" + (f"-{round_ + 1}" if round_ else ""),
                provider=r.provider, region=r.name, pools=pools, lat=r.lat, lon=r.lon,
                quota_vcpu=float(rng.choice([1024, 4096])) if rng.random() < 0.5 else None))
    keys = [c.region_key for c in clusters]
    users = rng.sample(keys, min(8, len(keys)))
    data_at = rng.sample(keys, min(6, len(keys)))
    gpu_models = sorted({(p.gpu_model, p.node.gpu) for c in clusters for p in c.pools
                         if p.gpu_model})
    workloads = tuple(_workload(i, rng, users, data_at, gpu_models)
                      for i in range(n_workloads))
    rtt = {(u, k): catalog.rtt_ms(u, k)[0] for u in users for k in keys}
    egress = {(s, k): catalog.egress_usd_per_gb(s, k) for s in data_at for k in keys}
    # The one snapshot builder (placement/snapshot.py): the generated clusters are
    # registrations with nothing observed or synced yet.
    return merge(MergeInputs(
        now_s=0.0, members=tuple(Member(c) for c in clusters), pending=workloads,
        user_rtt_ms=rtt, tenants=tuple(Tenant(f"tenant-{t}") for t in range(5)),
        egress_usd_per_gb=egress))


def _workload(i: int, rng: random.Random, users: list[str], data_at: list[str],
              gpu_models: list[tuple[str, int]]) -> Workload:
    roll = rng.random()
    if roll < 0.55:
        cpu = rng.choice([0.5, 1, 2, 4])
        spec = WorkloadSpec(
            name=f"svc-{i}", kind=WorkloadKind.SERVICE, image="svc", replicas=rng.randint(1, 6),
            resources=Resources(cpu, cpu * rng.choice([2, 4]), 0),
            user_region=rng.choice(users),
            latency_slo_ms=rng.choice([40.0, 80.0, 150.0, None]), priority=rng.randint(0, 2))
    elif roll < 0.9 or not gpu_models:
        cpu = rng.choice([1, 2, 4, 8])
        spec = WorkloadSpec(
            name=f"batch-{i}", kind=WorkloadKind.BATCH, image="batch",
            replicas=rng.randint(1, 10), resources=Resources(cpu, cpu * 4, 0),
            duration_s=rng.uniform(0.5, 6) * 3600,
            data=(DataSource(rng.uniform(0, 200), rng.choice(data_at)),),
            priority=rng.randint(0, 1))
    else:
        model, per_node = rng.choice(gpu_models)
        gpus = rng.choice([g for g in (1, 2, 4, 8) if g <= per_node])
        spec = WorkloadSpec(
            name=f"train-{i}", kind=WorkloadKind.TRAIN, image="train", replicas=1,
            resources=Resources(4 * gpus, 16 * gpus, gpus), gpu_model=model,
            interconnect=Interconnect.NVLINK_FULL if gpus == 8 else Interconnect.NONE,
            duration_s=rng.uniform(1, 12) * 3600,
            data=(DataSource(rng.uniform(50, 500), rng.choice(data_at)),),
            priority=rng.randint(0, 2))
    return Workload(id=f"w{i}", tenant=f"tenant-{i % 5}", spec=spec, submitted_s=float(i))


def _unplaced_and_cost(plan: Any) -> tuple[int, float]:
    return len(plan.unplaced), sum(p.cost_usd_per_hour for p in plan.placements)


def _new_nodes(plan: Any, snap: FederationSnapshot) -> dict[str, float]:
    """Nodes the plan opens and their price: what the packing model saves."""
    price = {(c.name, p.name): p.price_usd_per_hour for c in snap.clusters for p in c.pools}
    return {"nodes": sum(s.add_nodes for s in plan.scale),
            "usd_per_hour": round(sum(s.add_nodes * price.get((s.cluster, s.pool), 0.0)
                                      for s in plan.scale), 2)}


@dataclasses.dataclass(frozen=True, slots=True)
class Reference:
    """The bounds the timed run is measured against (computed untimed)."""

    lp_bound_full: float  # the unpruned LP: pricing run until no column prices out
    proven_bound: float  # max(lp_bound_full, the dual bound of a MIP run for mip_s)
    source: str  # "mip" (a MIP ran) or "lp" (the LP bound alone)
    mip_status: str | None
    pricing_converged: bool


def reference_bound(snap: FederationSnapshot, action: PolicyAction, config: PlannerConfig, *,
                    mip_s: float, pricing_s: float = math.inf, seed_sample: int | None = None,
                    seed_columns: int | None = None) -> Reference:
    """`proven_bound`: the LP of the unpruned program, then (mip_s > 0) the dual bound of a MIP
    over the columns pricing left in the model, run for mip_s seconds from scratch.

    The MIP's dual bound is that of the integer program over the priced columns (every
    column that prices out at the LP optimum is in it), the bound issue 12 asks for; with
    mip_s = 0 it is the LP bound alone. Pricing starts from the columns plan_epoch starts
    from (seeded on large batches, plus greedy's: pricing.seed), which only changes how
    fast it converges (5000x500: 15 s instead of 57 s CPU), not the LP bound. If it has
    not converged after `pricing_s` seconds, the bound is Lasdon's Lagrangian bound of
    the last restricted LP (valid, weaker; `pricing_converged` False). `seed_sample` and
    `seed_columns` (default: the config's) size that seeding; like the starting columns
    themselves they change how fast pricing converges, not the converged LP bound.
    """
    # The model plan_epoch solves: its batch (SLO sizing included), packing, reservations.
    snap, queued, _ = solved_batch(snap, config, policy="lp", headroom=action.headroom)
    cs = candidates(snap, action, config, queued=queued)
    pen = penalties(cs, config.unplaced_penalty_usd)
    budgets = tenant_budgets(snap)
    cs = pricing.seed(cs, pen, budgets,
                      sample=config.seed_sample if seed_sample is None else seed_sample,
                      per_workload=config.seed_columns if seed_columns is None else seed_columns,
                      rounds=config.seed_rounds, min_gain=0.0, budget_s=math.inf,
                      lp_time_limit_s=1e5)
    if config.greedy_incumbent:
        cs = pricing.with_ledger_columns(cs, greedy(cs, snap))
    model = lp.build(cs, pen, budgets)
    # No stop on gain (-inf): a degenerate round (the LP value unchanged while columns still
    # price out) must not end pricing short of convergence.
    priced = pricing.generate(cs, pen, budgets, model, rounds=500,
                              per_workload=config.pricing_columns, min_gain=-math.inf,
                              budget_s=pricing_s, lp_time_limit_s=1e5)
    lp_full = priced.relax.objective if priced.converged else \
        lp.lagrangian_bound(priced.cs, priced.model, priced.relax)
    if mip_s <= 0:
        return Reference(lp_full, lp_full, "lp", None, priced.converged)
    mip = lp.solve_mip(priced.model, None, time_limit_s=mip_s, mip_gap=0.0)
    bound = max(lp_full, mip.bound) if mip.bound is not None else lp_full
    return Reference(lp_full, bound, "mip", mip.status, priced.converged)


# The batch `warm_up` plans: small enough to cost well under a second.
WARMUP_SIZE = (60, 20)


def warm_up(catalog: Catalog, config: PlannerConfig, say: Callable[[str], None]) -> None:
    """Plan one small generated batch, untimed, so the timed runs do not pay what a process
    pays once (lazy imports, HiGHS's first instance and its scheduler, first allocations):
    the live broker's placement loop plans every epoch in one long-running process. The
    first timed run at 1000x200 took ~0.15 s more than the two after it without this."""
    say(f"warm-up: one {WARMUP_SIZE[0]}x{WARMUP_SIZE[1]} plan, untimed")
    plan_epoch(generate(catalog, *WARMUP_SIZE, seed=0), PolicyAction(), config, policy="lp")


def _timed(snap: FederationSnapshot, action: PolicyAction, config: PlannerConfig,
           repeats: int, say: Callable[[str], None], label: str
           ) -> tuple[EpochPlan, list[float], list[float], list[float], list[float],
                      list[float]]:
    """The last plan; wall seconds of every run, then the build, solve and CPU seconds and
    the objectives (the time boxes can make runs of the same batch differ).

    CPU seconds (the process's, all threads) beside the wall clock: on a machine shared
    with other work, wall time also counts the time the run waited for a core.
    """
    totals, builds, solves, cpus, objectives = [], [], [], [], []
    plan: EpochPlan | None = None
    for k in range(max(1, repeats)):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_epoch(snap, action, config, policy="lp")
        totals.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        builds.append(plan.stats.build_s)
        solves.append(plan.stats.solve_s)
        objectives.append(plan.stats.objective)
        say(f"{label} run {k + 1}/{max(1, repeats)}: {totals[-1]:.2f} s, cpu {cpus[-1]:.2f} s "
            f"(objective {plan.stats.objective:,.2f}, source {plan.stats.source})")
    if plan is None:  # pragma: no cover - repeats >= 1
        raise RuntimeError("no plan")
    return plan, totals, builds, solves, cpus, objectives


def run_size(catalog: Catalog, size: str, *, repeats: int, seed: int,
             config: PlannerConfig, proven_mip_s: float = 60.0,
             proven_max_workloads: int = 5000, proven_pricing_s: float = 3600.0,
             say: Callable[[str], None] = lambda _msg: None) -> dict[str, Any]:
    try:
        n_w, n_o = (int(x) for x in size.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"size {size!r} is not WORKLOADSxOPTIONS, e.g. 1000x200") from None
    say(f"{size}: generating")
    snap = generate(catalog, n_w, n_o, seed=seed)
    action = PolicyAction()
    plan, totals, builds, solves, cpus, objectives = _timed(snap, action, config, repeats, say,
                                                f"{size}: default path")
    st = plan.stats
    if st.mip_used:  # else the run without the MIP stage is the default path itself
        fast, fast_totals, *_ = _timed(snap, action, dataclasses.replace(config, mip_gap=1.0),
                                       repeats, say, f"{size}: without the MIP stage")
    else:
        fast, fast_totals = plan, totals
    mip_s = proven_mip_s if n_w <= proven_max_workloads else 0.0
    say(f"{size}: reference bound (pricing to convergence"
        + (f", then a {mip_s:g} s MIP)" if mip_s > 0 else ", LP bound)"))
    # The LP bound alone (large batches): seeded from a larger sample, so that pricing
    # converges (REFERENCE_SAMPLE_DIV); with a MIP, from the default path's columns as before.
    ref = reference_bound(
        snap, action, config, mip_s=mip_s, pricing_s=proven_pricing_s,
        seed_sample=None if mip_s > 0 else max(config.seed_sample, n_w // REFERENCE_SAMPLE_DIV),
        seed_columns=None if mip_s > 0 else max(config.seed_columns, REFERENCE_SEED_COLUMNS))
    say(f"{size}: greedy and traditional")
    g = plan_epoch(snap, action, config, policy="greedy")
    t = plan_epoch(snap, action, config, policy="traditional")
    unp, cost = _unplaced_and_cost(plan)
    g_unp, g_cost = _unplaced_and_cost(g)
    t_unp, t_cost = _unplaced_and_cost(t)
    opened = {"lp": _new_nodes(plan, snap), "greedy": _new_nodes(g, snap),
              "traditional": _new_nodes(t, snap)}
    if config.packing and n_w <= proven_max_workloads:  # untimed: the per-replica model
        opened["lp_per_replica_model"] = _new_nodes(plan_epoch(
            snap, action, dataclasses.replace(config, packing=False)), snap)

    def gap_to(bound: float, objective: float = st.objective) -> float:
        return round((objective - bound) / max(abs(bound), 1e-9), 5)

    return {
        "workloads": n_w, "options": sum(len(c.pools) for c in snap.clusters),
        "repeats": max(1, repeats),
        "build_s": round(statistics.median(builds), 4),
        "solve_s": round(statistics.median(solves), 4),
        "total_s_median": round(statistics.median(totals), 4),
        "total_s_all": [round(x, 4) for x in totals],
        "cpu_s_median": round(statistics.median(cpus), 4),
        "objective": round(st.objective, 2), "lp_bound": round(st.lp_bound or 0.0, 2),
        "gap": round(st.gap or 0.0, 5), "status": st.status, "source": st.source,
        "mip_used": st.mip_used, "variables": st.variables, "constraints": st.constraints,
        "best_bound": round(st.best_bound or 0.0, 2),
        "lp_bound_full": round(ref.lp_bound_full, 2),
        "gap_vs_lp_bound_full": gap_to(ref.lp_bound_full),
        "proven_bound": round(ref.proven_bound, 2),
        "proven_bound_source": ref.source,
        "proven_mip_s": mip_s,
        "proven_mip_status": ref.mip_status,
        "pricing_converged_for_reference": ref.pricing_converged,
        "default_path_gap_vs_proven_bound": gap_to(ref.proven_bound),
        # Every timed run's objective and gap (the keys above are the last run's).
        "objective_all": [round(x, 2) for x in objectives],
        "default_path_gap_vs_proven_bound_all": [gap_to(ref.proven_bound, x)
                                                 for x in objectives],
        "pricing_rounds": st.pricing_rounds,
        "heuristic_objective": round(st.heuristic_objective or 0.0, 2),
        "no_mip": {
            "total_s_median": round(statistics.median(fast_totals), 4),
            "objective": round(fast.stats.objective, 2),
            "gap_vs_lp_bound": round(fast.stats.gap or 0.0, 5),
            "gap_vs_best_bound": gap_to(st.best_bound or 0.0, fast.stats.objective),
            "gap_vs_proven_bound": gap_to(ref.proven_bound, fast.stats.objective),
            "source": fast.stats.source,
        },
        "greedy_objective": round(g.stats.objective, 2),
        "traditional_objective": round(t.stats.objective, 2),
        "lp_below_greedy_frac": round(1 - st.objective / g.stats.objective, 4)
        if g.stats.objective else 0.0,
        "unplaced": {"lp": unp, "greedy": g_unp, "traditional": t_unp},
        "placed_usd_per_hour": {"lp": round(cost, 2), "greedy": round(g_cost, 2),
                                "traditional": round(t_cost, 2)},
        "new_nodes": opened,
    }


def register(app: typer.Typer) -> None:
    """Mount this benchmark on `skyfed bench`."""

    @app.command("placement")
    def bench_placement(
        sizes: Annotated[str, typer.Option(help="WORKLOADSxOPTIONS, comma-separated")] =
            "200x50,1000x200,5000x500",
        repeats: Annotated[int, typer.Option(min=1)] = 3,
        seed: int = 1,
        k: Annotated[int, typer.Option(help="candidates kept per workload")] = 8,
        proven_mip_s: Annotated[float, typer.Option(
            min=0.0, max=3600.0,
            help="seconds of the reference MIP whose dual bound is proven_bound")] = 60.0,
        proven_max_workloads: Annotated[int, typer.Option(
            min=0, help="above this many workloads proven_bound is the LP bound")] = 5000,
        proven_pricing_s: Annotated[float, typer.Option(
            min=0.0, help="seconds the reference's pricing may take before its bound is "
                          "the Lagrangian one")] = 3600.0,
        as_json: Annotated[bool, typer.Option("--json")] = False,
        warmup: Annotated[bool, typer.Option(
            help="plan one small batch, untimed, before the sizes (as the live broker's "
                 "loop has planned before its next epoch)")] = True,
    ) -> None:
        """LP vs greedy vs traditional on generated batches priced from the catalog.

        The lp rows run the PlannerConfig the live broker uses by default. Progress goes
        to stderr (a 20000x2000 size takes minutes).
        """
        catalog = Catalog.load()
        config = PlannerConfig(k_candidates=k)

        def say(msg: str) -> None:
            typer.echo(f"[bench placement] {msg}", err=True)

        with run_heap(SERVE_YOUNG_THRESHOLD, collect=True):  # as `skyfed serve` (above)
            if warmup:
                warm_up(catalog, config, say)
            out = {s: run_size(catalog, s, repeats=repeats, seed=seed, config=config,
                               proven_mip_s=proven_mip_s,
                               proven_max_workloads=proven_max_workloads,
                               proven_pricing_s=proven_pricing_s, say=say)
                   for s in sizes.split(",") if s}
        if as_json:
            typer.echo(json.dumps({"sizes": out}, indent=2))
            return
        _print_tables(out)


def _print_tables(out: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="skyfed bench placement (default PlannerConfig)")
    cols = ("build_s", "solve_s", "total_s_median", "objective", "lp_bound", "gap",
            "proven_bound", "default_path_gap_vs_proven_bound", "source",
            "greedy_objective", "traditional_objective", "lp_below_greedy_frac")
    fast_cols = ("total_s_median", "objective", "gap_vs_lp_bound", "gap_vs_best_bound",
                 "gap_vs_proven_bound")
    table.add_column("size")
    for c in cols:
        table.add_column(c, justify="right")
    for s, row in out.items():
        table.add_row(s, *(str(row[c]) for c in cols))
    fast_table = Table(title="lp without the MIP stage (relax + price + round only)")
    fast_table.add_column("size")
    for c in fast_cols:
        fast_table.add_column(c, justify="right")
    for s, row in out.items():
        fast_table.add_row(s, *(str(row["no_mip"][c]) for c in fast_cols))
    console = Console(width=max(160, Console().width))
    console.print(table)
    console.print(fast_table)
