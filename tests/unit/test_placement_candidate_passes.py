"""The W x O arrays of candidates.py and lp.py, computed per replica shape, in row blocks and
without zero passes, equal the plain per-pair formulas of their docstrings, number for number.

Those shortcuts exist for speed at 20000 x 2000 (docs/placement.md, section 7); these tests pin
that they change no number: exact equality, not a tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from broker.domain import DataSource, PolicyAction, PricingModel, WorkloadKind
from broker.placement import lp
from broker.placement.candidates import (
    NODE_BOOT_S,
    CandidateSet,
    build_candidates,
    egress_usd_per_gb,
    expected_hours,
)
from broker.placement.ledger import penalties

from .placement_world import snapshot, workload

HORIZON_H = 1.0


def _batch(bias: bool) -> tuple[CandidateSet, PolicyAction]:
    """Services, batch jobs with one and with two data sources, GPU jobs: repeated shapes."""
    ws = []
    for i in range(12):
        ws.append(workload(f"svc{i}", replicas=1 + i % 3, cpu=0.5 * (1 + i % 2), mem=2.0,
                           user_region="nyc" if i % 2 else "amsterdam",
                           latency_slo_ms=None if i % 4 else 80.0))
        data = (DataSource(10.0 + i, "aws-use1"),) if i % 3 else \
            (DataSource(5.0 * i, "gcp:europe-west4"), DataSource(3.5, "aws-use1"))
        ws.append(workload(f"job{i}", kind=WorkloadKind.BATCH, replicas=1 + i % 4,
                           cpu=1.0 + i % 2, mem=4.0, duration_s=600.0 * (1 + i),
                           data=data, spot_ok=bool(i % 2)))
    ws += [workload(f"gpu{i}", kind=WorkloadKind.TRAIN, cpu=8, mem=64, gpu=1 + i % 2,
                    duration_s=3600.0 * (1 + i)) for i in range(4)]
    action = PolicyAction(
        cluster_bias_usd_per_hour={"aws-use1": 0.25, "azure-eus": -0.1},
        spot_bias_usd_per_hour={"aws-use1": 0.05}) if bias else PolicyAction()
    cs = build_candidates(snapshot(tuple(ws)), action, k=3, service_horizon_h=HORIZON_H,
                          packing=True, site_cost_fraction=0.1)
    return cs, action


@pytest.mark.parametrize("bias", [False, True])
def test_costs_equal_the_per_pair_formulas(bias: bool) -> None:
    cs, action = _batch(bias)
    clusters = {o.cluster.name: o.cluster for o in cs.options}
    snap = snapshot(cs.workloads)
    for i, w in enumerate(cs.workloads):
        r = w.spec.resources
        hours = expected_hours(w, HORIZON_H)
        for j, o in enumerate(cs.options):
            node = o.pool.node
            share = 0.0
            for d, n in ((r.cpu, node.cpu), (r.memory_gib, node.memory_gib),
                         (float(r.gpu), float(node.gpu))):
                share = max(share, d * (1.0 / n if n > 0 else 0.0))
            usdh = share * o.pool.price_usd_per_hour
            marginal = 0.1 if o.pool.pricing is PricingModel.EDGE else 1.0
            assert cs.usd_per_hour[i, j] == usdh
            assert cs.list_compute is not None
            assert cs.list_compute[i, j] == usdh * marginal * hours
            egress = 0.0
            for src in w.spec.data:
                egress += src.size_gb * egress_usd_per_gb(snap, clusters, src.location,
                                                          o.cluster)
            assert cs.egress[i, j] == egress / max(1, w.spec.replicas)
            rtt = cs.rtt_ms[i, j]
            assert cs.latency[i, j] == \
                (0.0 if math.isnan(rtt) else rtt) * action.latency_weight_usd_per_ms
            per_h = action.cluster_bias_usd_per_hour.get(o.cluster.name, 0.0) + (
                action.spot_bias_usd_per_hour.get(o.cluster.name, 0.0)
                if o.pool.pricing is PricingModel.SPOT else 0.0)
            assert cs.bias[i, j] == hours * per_h
    # the bias is in the cost where there is one, and only there
    feasible_cost = np.where(cs.feasible, cs.compute + cs.egress + cs.latency + cs.bias,
                             np.inf)
    np.testing.assert_array_equal(cs.cost, feasible_cost)
    assert bool(cs.bias.any()) is bias


def test_node_charges_count_the_longest_feasible_job_of_each_option() -> None:
    cs, _ = _batch(False)
    hours = np.array([expected_hours(w, HORIZON_H) for w in cs.workloads])
    longest = np.where(cs.feasible, hours[:, None], 0.0).max(axis=0)
    table = cs.table
    span_h = np.maximum(table.billing_h, np.minimum(HORIZON_H, longest))
    want = np.where(table.fixed, 0.0, table.price * (NODE_BOOT_S / 3600.0 + span_h))
    assert cs.node_usd is not None
    np.testing.assert_array_equal(cs.node_usd, want)
    # the options differ in their longest job, and some are capped at the horizon
    assert len(set(longest[cs.feasible.any(axis=0)].tolist())) > 1
    assert (longest > HORIZON_H).any()


@pytest.mark.parametrize("block", [1, 5, 10_000])
def test_reduced_costs_in_row_blocks_equal_the_whole_matrix_formula(
        monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    cs, _ = _batch(True)
    model = lp.build(cs, penalties(cs, 1000.0), {"t1": 50.0})
    assert model.cap_rows
    assert model.budget_rows
    rng = np.random.default_rng(7)
    y = rng.normal(size=model.a.shape[0])
    monkeypatch.setattr(lp, "ROW_BLOCK", block)
    relax = lp.Relaxation("optimal", 0.0, np.zeros(model.cost.size), y, 0.0)
    got = lp.reduced_costs(cs, model, relax)
    prices = lp.option_prices(cs, model, y)

    n_w, n_o = cs.cost.shape
    cap = np.zeros((n_o, 3))
    for (o, r), row in model.cap_rows.items():
        cap[o, r] = y[row]
    want = cs.cost - y[:n_w, None]
    plain = cs.cost.copy()
    for r in range(3):
        want = want - np.multiply.outer(cs.demand[:, r], cap[:, r])
        plain = plain - np.multiply.outer(cs.demand[:, r], cap[:, r])
    for (o, cls), row in model.set_rows.items():
        for i, w in enumerate(cs.workloads):
            if w.spec.resources.gpu == cls[0]:
                want[i, o] -= y[row]
                plain[i, o] -= y[row]
    t_dual = np.array([y[model.budget_rows[w.tenant]] for w in cs.workloads])
    want -= t_dual[:, None] * cs.usd_per_hour
    plain -= t_dual[:, None] * cs.usd_per_hour
    want[lp.linked_workloads(cs)] = np.inf
    want[~cs.feasible] = np.inf
    plain[~cs.feasible] = np.inf
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(prices, plain)
