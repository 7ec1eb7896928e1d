"""`skyfed bench placement`: LP vs greedy vs traditional on generated batches.

Batches are generated from the real catalog (providers.catalog: on-demand and
spot prices, Skyplane-measured RTTs and egress prices, region coordinates), so
the objectives are in real USD. A size `WxO` means W pending workloads and O
options (pools). Capacity is sized so that the cheap pools cannot hold
everything ("contention"): that is where a batch optimiser and a one-at-a-time
greedy differ.

Reported per size (medians over `--repeats` for times): build_s (candidates +
matrix), solve_s, total_s_median (whole plan_epoch, decision records
included), objective, lp_bound, gap (fraction), greedy_objective,
traditional_objective, plus unplaced counts and placed-cost of each policy and
how much below greedy the LP lands.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import time
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
from broker.placement.planner import PlannerConfig, plan_epoch
from broker.placement.snapshot import Member, MergeInputs, merge
from providers.base import Offer
from providers.catalog import Catalog

POOLS_PER_CLUSTER = 10


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
    for r in regions:
        if n_pools >= n_options:
            break
        offers = _pick_offers(catalog, r.provider, r.name, rng)
        pools = tuple(_pool(o, rng) for o in offers[:n_options - n_pools])
        if not pools:
            continue
        n_pools += len(pools)
        clusters.append(Cluster(
            name=f"{r.provider}-{r.name}", provider=r.provider, region=r.name,
            pools=pools, lat=r.lat, lon=r.lon,
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


def run_size(catalog: Catalog, size: str, *, repeats: int, seed: int,
             config: PlannerConfig) -> dict[str, Any]:
    try:
        n_w, n_o = (int(x) for x in size.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(f"size {size!r} is not WORKLOADSxOPTIONS, e.g. 1000x200") from None
    snap = generate(catalog, n_w, n_o, seed=seed)
    action = PolicyAction()
    totals, builds, solves = [], [], []
    plan = None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        plan = plan_epoch(snap, action, config, policy="lp")
        totals.append(time.perf_counter() - t0)
        builds.append(plan.stats.build_s)
        solves.append(plan.stats.solve_s)
    assert_plan = plan
    if assert_plan is None:  # pragma: no cover - repeats >= 1
        raise RuntimeError("no plan")
    fast_cfg = dataclasses.replace(config, mip_gap=1.0)  # never run the MIP
    fast_totals = []
    fast = None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fast = plan_epoch(snap, action, fast_cfg, policy="lp")
        fast_totals.append(time.perf_counter() - t0)
    if fast is None:  # pragma: no cover - repeats >= 1
        raise RuntimeError("no plan")
    # The bound of the unpruned LP (pricing run to convergence, untimed): the
    # timed path may stop pricing early and then reports a weaker, valid bound.
    full = plan_epoch(snap, action, dataclasses.replace(
        config, mip_gap=1.0, pricing_rounds=200, pricing_min_gain=0.0,
        pricing_time_frac=1e6, explain=False), policy="lp")
    g = plan_epoch(snap, action, config, policy="greedy")
    t = plan_epoch(snap, action, config, policy="traditional")
    st = assert_plan.stats
    unp, cost = _unplaced_and_cost(assert_plan)
    g_unp, g_cost = _unplaced_and_cost(g)
    t_unp, t_cost = _unplaced_and_cost(t)
    return {
        "workloads": n_w, "options": sum(len(c.pools) for c in snap.clusters),
        "build_s": round(statistics.median(builds), 4),
        "solve_s": round(statistics.median(solves), 4),
        "total_s_median": round(statistics.median(totals), 4),
        "objective": round(st.objective, 2), "lp_bound": round(st.lp_bound or 0.0, 2),
        "gap": round(st.gap or 0.0, 5), "status": st.status, "source": st.source,
        "mip_used": st.mip_used, "variables": st.variables, "constraints": st.constraints,
        "best_bound": round(st.best_bound or 0.0, 2),
        "lp_bound_full": round(full.stats.lp_bound or 0.0, 2),
        "gap_vs_lp_bound_full": round((st.objective - (full.stats.lp_bound or 0.0))
                                      / max(abs(full.stats.lp_bound or 0.0), 1e-9), 5),
        "pricing_rounds": st.pricing_rounds,
        "heuristic_objective": round(st.heuristic_objective or 0.0, 2),
        "no_mip": {
            "total_s_median": round(statistics.median(fast_totals), 4),
            "objective": round(fast.stats.objective, 2),
            "gap_vs_lp_bound": round(fast.stats.gap or 0.0, 5),
            "gap_vs_best_bound": round((fast.stats.objective - (st.best_bound or 0.0))
                                       / max(abs(st.best_bound or 0.0), 1e-9), 5),
            "source": fast.stats.source,
        },
        "greedy_objective": round(g.stats.objective, 2),
        "traditional_objective": round(t.stats.objective, 2),
        "lp_below_greedy_frac": round(1 - st.objective / g.stats.objective, 4)
        if g.stats.objective else 0.0,
        "unplaced": {"lp": unp, "greedy": g_unp, "traditional": t_unp},
        "placed_usd_per_hour": {"lp": round(cost, 2), "greedy": round(g_cost, 2),
                                "traditional": round(t_cost, 2)},
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
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """LP vs greedy vs traditional on generated batches priced from the catalog."""
        catalog = Catalog.load()
        config = PlannerConfig(k_candidates=k)
        out = {s: run_size(catalog, s, repeats=repeats, seed=seed, config=config)
               for s in sizes.split(",") if s}
        if as_json:
            typer.echo(json.dumps({"sizes": out}, indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="skyfed bench placement")
        cols = ("build_s", "solve_s", "total_s_median", "objective", "lp_bound", "gap",
                "greedy_objective", "traditional_objective", "lp_below_greedy_frac")
        fast_cols = ("total_s_median", "objective", "gap_vs_lp_bound", "gap_vs_best_bound")
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
