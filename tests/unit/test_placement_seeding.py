"""Column seeding from a sample's capacity prices (pricing.seed)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from broker.domain import Cluster, PolicyAction, PricingModel
from broker.placement import lp, pricing
from broker.placement.candidates import CandidateSet, build_candidates
from broker.placement.ledger import penalties

from .placement_world import pool, snapshot, workload

ACTION = PolicyAction()


def contended(k: int, n: int = 40) -> CandidateSet:
    """n services of 2 CPUs; the cheapest pool (spot) has room for 4 of them, the next
    (mid) for all; the dearest has no node running (the LP leaves it alone)."""
    cluster = Cluster(name="aws", provider="aws", region="us-east-1", lat=38.9, lon=-77.4,
                      pools=(pool("spot", price=0.10, nodes=1, max_nodes=1,
                                  pricing=PricingModel.SPOT),
                             pool("mid", price=0.30, nodes=4, max_nodes=40),
                             pool("dear", price=0.50, nodes=0, max_nodes=40)))
    ws = tuple(workload(f"w{i}", replicas=2, cpu=2, mem=4, spot_ok=True) for i in range(n))
    return build_candidates(snapshot(ws, clusters=(cluster,)), ACTION, k=k,
                            service_horizon_h=1.0, packing=True)


def lp_value(cs: CandidateSet) -> float:
    pen = penalties(cs, 1000.0)
    return lp.solve_relaxation(lp.build(cs, pen, {}), time_limit_s=60.0).objective


def seeded(cs: CandidateSet, sample: int, per_workload: int = 4) -> CandidateSet:
    return pricing.seed(cs, penalties(cs, 1000.0), {}, sample=sample,
                        per_workload=per_workload,
                        rounds=30, min_gain=0.0, budget_s=math.inf, lp_time_limit_s=60.0)


def test_a_sample_prices_in_the_columns_the_whole_batch_needs() -> None:
    """Each workload sees only the spot pool (k = 1): that LP leaves most replicas unplaced.
    A tenth of the batch, with a tenth of every capacity, prices the spot pool's room, and
    the two columns cheapest at those prices give one LP solve the unpruned program's
    value."""
    narrow, unpruned = contended(1), contended(3)
    full = lp_value(unpruned)
    assert lp_value(narrow) > full * 10  # unplaced penalties
    seeds = seeded(narrow, sample=4, per_workload=2)
    names = {seeds.options[int(o)].pool.name for c in seeds.cand for o in c}
    assert names >= {"spot", "mid"}
    assert lp_value(seeds) == pytest.approx(full, rel=1e-9)


def test_batches_under_the_minimum_for_their_sample_keep_their_columns() -> None:
    cs = contended(1)
    assert len(cs.workloads) == 40
    assert seeded(cs, sample=40 // pricing.SEED_MIN_BATCH + 1) is cs
    assert seeded(cs, sample=40 // pricing.SEED_MIN_BATCH) is not cs
    assert seeded(cs, sample=0) is cs


def test_a_subset_slices_every_per_workload_field() -> None:
    """Every CandidateSet field with one entry per workload is cut to the sample, so a field
    added later cannot silently keep the whole batch's rows (the batch has 40 workloads
    and 3 options, so a per-option field is never mistaken for one)."""
    cs = contended(3)
    n_w = len(cs.workloads)
    assert n_w != len(cs.options)
    idx = np.array([0, 7, 39], dtype=np.int64)
    part = pricing.subset(cs, idx)
    for f in dataclasses.fields(CandidateSet):
        value = getattr(cs, f.name)
        sized = (isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n_w) \
            or (isinstance(value, tuple) and len(value) == n_w)
        if sized:
            assert f.name in pricing.PER_WORKLOAD_FIELDS
            assert len(getattr(part, f.name)) == idx.size
    assert [w.id for w in part.workloads] == ["w0", "w7", "w39"]
    assert np.array_equal(part.cost, cs.cost[idx])


def test_the_sample_gets_its_share_of_every_shared_capacity() -> None:
    """Pool room, addable nodes, quotas and GPU sets are shared by the whole batch: the
    sample's LP sees `alpha` of each; its own rows (demand) and costs stay as they are."""
    cs = contended(1)
    model = lp.build(cs, penalties(cs, 1000.0), {})
    part = pricing.scaled_capacity(model, 0.25)
    fam = np.array([f for f, _ in model.row_names])
    cap = fam == "capacity"
    assert cap.any()
    assert np.allclose(part.row_hi[cap], 0.25 * model.row_hi[cap])
    assert np.array_equal(part.row_hi[fam == "demand"], model.row_hi[fam == "demand"])
    nodes = slice(model.n_start, model.y_start)
    assert np.allclose(part.col_hi[nodes], 0.25 * model.col_hi[nodes])
    assert np.isinf(part.col_hi[:model.n_x]).all()
    assert np.array_equal(part.cost, model.cost)


def test_pairs_join_each_workloads_columns_once_cheapest_first() -> None:
    """pricing.with_pairs (the grown candidate sets of pricing and of the greedy incumbent's
    columns): each workload's own options and the added ones, each once, ordered by cost and
    then by option index, as the per-workload union and stable sort it replaced."""
    cs = contended(k=1, n=6)
    assert all(c.size == 1 for c in cs.cand)
    ws = np.array([0, 0, 0, 3, 5, 5], dtype=np.int64)
    opts = np.array([2, 1, 2, 0, 0, 2], dtype=np.int64)
    grown = pricing.with_pairs(cs, ws, opts)
    for w in range(6):
        added = {int(o) for v, o in zip(ws, opts, strict=True) if v == w}
        expect = sorted(set(cs.cand[w].tolist()) | added,
                        key=lambda o, w=w: (float(cs.cost[w, o]), o))
        assert grown.cand[w].tolist() == expect
    assert grown.cand[0].size == 3  # option 2 added twice is there once
    assert grown.cand[1].tolist() == cs.cand[1].tolist()
