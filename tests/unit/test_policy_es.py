"""The ES trainer (broker/sim/es.py): its episode score, its parameter slices and its step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from broker.placement.policy import ActorCritic
from broker.sim.es import (
    PairTask,
    es_keys,
    free_mask,
    get_vector,
    held_out,
    pair_scores,
    robust_score,
    train_es,
    with_vector,
)
from broker.sim.rollout import RewardWeights
from broker.sim.tracedraft import KINDS

W = RewardWeights()


def _m(cost: float, slo: float = 0.0, queue: float = 0.0, gpu: float | None = None
       ) -> dict[str, object]:
    return {"cost_usd": cost, "slo_violation_frac": slo, "cross_zone_traffic_frac": 0.0,
            "queued_replica_h": queue, "gpu_job_start_s_p50": gpu}


def test_the_cheaper_run_of_a_pair_scores_higher_by_its_percent() -> None:
    s = pair_scores([_m(99.0), _m(101.0)], W)
    assert s[0] > 0 > s[1]
    assert abs(s[0] - 1.0) < 1e-9  # 1 % below the pair's mean cost = 1 point


def test_slo_violations_and_queueing_cost_points() -> None:
    worse_slo = pair_scores([_m(100.0, slo=0.01), _m(100.0)], W)
    assert worse_slo[0] < worse_slo[1]
    more_queue = pair_scores([_m(100.0, queue=2.0), _m(100.0, queue=0.0)], W)
    assert more_queue[0] < more_queue[1]
    no_gpu_jobs = pair_scores([_m(100.0, gpu=None), _m(100.0, gpu=None)], W)
    assert no_gpu_jobs == [0.0, 0.0]


def test_the_vector_round_trips_through_the_heads_last_layers() -> None:
    torch.manual_seed(0)
    model = ActorCritic()
    keys = es_keys(model)
    assert keys
    assert all(k.split(".")[0] in ("node_head", "global_head", "pool_head")
                        for k in keys)
    theta = get_vector(model, keys)
    moved = with_vector(model.state_dict(), keys, theta + 1.0)
    other = ActorCritic()
    other.load_state_dict(moved)
    assert np.allclose(get_vector(other, keys), theta + 1.0)
    untouched = [k for k in model.state_dict() if k not in keys]
    assert all(torch.equal(moved[k], model.state_dict()[k]) for k in untouched)


def _quadratic_world(target: np.ndarray) -> Callable[..., list[tuple[dict[str, object],
                                                                      dict[str, object]]]]:
    """A pool_map whose episodes cost |theta - target|^2 + 100: the twin stand-in."""

    def cost(theta: np.ndarray) -> float:
        return float(((theta - target) ** 2).sum()) + 100.0

    def pool_map(_fn: object, tasks: list[PairTask]
                 ) -> list[tuple[dict[str, object], dict[str, object]]]:
        out = []
        for t in tasks:
            if t.eps is None:
                out.append((_m(cost(t.theta) + 1.0), _m(cost(t.theta))))
            else:
                out.append((_m(cost(t.theta + t.sigma * t.eps)),
                            _m(cost(t.theta - t.sigma * t.eps))))
        return out

    return pool_map


def test_es_steps_towards_cheaper_episodes() -> None:
    torch.manual_seed(0)
    model = ActorCritic()
    keys = es_keys(model)
    start = get_vector(model, keys)
    target = start + 0.5
    out = train_es(model, weights=W, seed=1, budget_s=1e9, iterations=30, pairs=8,
                   sigma=0.1, lr=0.05, eval_every=10, decision_interval_s=300.0,
                   scenarios=(), data=None, trace_share=0.0, extra_share=0.0,
                   pool_map=_quadratic_world(target))
    trained = ActorCritic()
    trained.load_state_dict(out.state)
    after = get_vector(trained, keys)
    assert np.linalg.norm(after - target) < 0.8 * np.linalg.norm(start - target)
    assert out.iterations == 30
    assert len(out.history) == 4


def test_a_loss_on_one_held_out_draft_ranks_below_a_smaller_gain_everywhere() -> None:
    lopsided = [3.0, 3.0, -2.0]  # mean 1.33, loses on one kind
    even = [1.0, 1.0, 1.0]
    assert float(np.mean(lopsided)) > float(np.mean(even))
    assert robust_score(lopsided) < robust_score(even)
    assert robust_score(even) == 1.0


def test_the_held_out_drafts_hold_every_trace_kind() -> None:
    from pathlib import Path

    with_data = held_out(3, Path("data"))
    assert sorted(d.kind for d in with_data if d.trace) == sorted(KINDS)  # type: ignore[type-var]
    assert [d.kind for d in held_out(3, None) if d.trace] == []


def test_more_held_out_drafts_keep_the_six_and_add_new_ones_of_each_kind() -> None:
    """`--es-held-out 2`: twelve drafts, the six every earlier checkpoint was picked on
    first, then a new draft of each kind and two new synthetic ones; no seed repeats, and
    seed 3's drafts share none with seed 4's."""
    from pathlib import Path

    six = held_out(3, Path("data"))
    twelve = held_out(3, Path("data"), per_kind=2)
    assert len(six) == 6
    assert len(twelve) == 12
    assert twelve[:4] == six[:4]  # the trace drafts, then the synthetic ones
    assert [d for d in twelve if not d.trace][:2] == six[4:]
    assert sorted(d.kind for d in twelve if d.trace) == sorted(KINDS * 2)  # type: ignore[type-var]
    seeds = [d.seed for d in twelve]
    assert len(set(seeds)) == len(seeds)
    assert not set(seeds) & {d.seed for d in held_out(4, Path("data"), per_kind=2)}
    with pytest.raises(ValueError, match="held-out"):
        held_out(3, Path("data"), per_kind=3)


def test_the_trainer_picks_its_result_on_the_drafts_it_was_asked_for() -> None:
    """train_es checks `held_out_per_kind` x the kinds: each check runs 12 drafts, not 6."""
    torch.manual_seed(0)
    model = ActorCritic()
    keys = es_keys(model)
    world = _quadratic_world(get_vector(model, keys) + 0.5)
    sizes: list[int] = []

    def counting(fn: Callable[[PairTask], tuple[dict[str, object], dict[str, object]]],
                 tasks: list[PairTask]) -> list[tuple[dict[str, object], dict[str, object]]]:
        if tasks and tasks[0].eps is None:
            sizes.append(len(tasks))
        return world(fn, tasks)

    out = train_es(model, weights=W, seed=1, budget_s=1e9, iterations=4, pairs=2,
                   sigma=0.1, lr=0.05, eval_every=2, decision_interval_s=300.0,
                   scenarios=(), data=Path("data"), trace_share=0.0, extra_share=0.0,
                   pool_map=counting, held_out_per_kind=2)
    assert sizes == [12, 12, 12]  # iterations 0, 2 and the final check
    assert out.episodes == 4 * 2 * 2 + 3 * 2 * 12


def test_training_reports_progress_as_lines_where_stderr_is_not_a_terminal() -> None:
    """`skyfed train` under nohup or in CI: rich's bar draws nothing on a file, so progress
    comes as plain lines, the first at once, then at most one per interval, and the last."""
    import io

    from broker.sim.train import ProgressLines, progress_reporter

    now = [0.0]
    out = io.StringIO()
    lines = ProgressLines(out, every_s=30.0, clock=lambda: now[0])
    for t, frac in ((0.0, 0.01), (10.0, 0.1), (29.0, 0.2), (31.0, 0.3), (50.0, 0.5),
                    (55.0, 1.0)):
        now[0] = t
        lines(frac, f"iteration {int(frac * 100)} held-out 0.00")
    assert out.getvalue().splitlines() == [
        "[train]   1.0 % iteration 1 held-out 0.00",
        "[train]  30.0 % iteration 30 held-out 0.00, 1 min in, about 1 min left",
        "[train] 100.0 % iteration 100 held-out 0.00, 1 min in",
    ]
    stream = io.StringIO()  # not a terminal
    with progress_reporter(stream) as update:
        update(0.5, "episode 3 reward 0.100")
    assert stream.getvalue() == "[train]  50.0 % episode 3 reward 0.100\n"


def test_progress_lines_say_how_long_the_run_has_taken_and_still_needs() -> None:
    """A fixed --episodes ES run can take 90 minutes: each line after the first gives the
    time so far and, at the rate so far, the time left."""
    import io

    from broker.sim.train import ProgressLines

    now = [100.0]
    out = io.StringIO()
    lines = ProgressLines(out, every_s=30.0, clock=lambda: now[0])
    for t, frac in ((100.0, 0.0), (100.0 + 600.0, 0.1), (100.0 + 1800.0, 0.25),
                    (100.0 + 7200.0, 1.0)):
        now[0] = t
        lines(frac, "x")
    assert out.getvalue().splitlines() == [
        "[train]   0.0 % x",
        "[train]  10.0 % x, 10 min in, about 90 min left",
        "[train]  25.0 % x, 30 min in, about 90 min left",
        "[train] 100.0 % x, 120 min in",
    ]


def test_each_new_best_is_handed_out_as_it_is_found() -> None:
    """`skyfed train` writes every new held-out best to its --out file (`on_best`), so a run
    stopped midway keeps the best parameters it had found, and the last one handed out is
    the result."""
    torch.manual_seed(0)
    model = ActorCritic()
    keys = es_keys(model)
    target = get_vector(model, keys) + 0.5
    seen: list[tuple[dict[str, torch.Tensor], int]] = []
    out = train_es(model, weights=W, seed=1, budget_s=1e9, iterations=30, pairs=8,
                   sigma=0.1, lr=0.05, eval_every=10, decision_interval_s=300.0,
                   scenarios=(), data=None, trace_share=0.0, extra_share=0.0,
                   pool_map=_quadratic_world(target),
                   on_best=lambda state, history: seen.append((state, len(history))))
    assert len(seen) >= 2  # the start, then at least one improvement
    assert [n for _, n in seen] == sorted({n for _, n in seen})  # one per new best, in order
    last, _ = seen[-1]
    assert all(torch.equal(last[k], out.state[k]) for k in out.state)


def test_a_checkpoint_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    from broker.sim.train import save_atomically

    path = tmp_path / "runs" / "es.pt"
    save_atomically(ActorCritic(), path, meta={"partial": True})
    assert ActorCritic.load(path).meta["partial"] is True
    save_atomically(ActorCritic(), path, meta={"partial": False})
    assert ActorCritic.load(path).meta["partial"] is False
    assert sorted(p.name for p in path.parent.iterdir()) == ["es.pt"]  # no temporary left


def test_frozen_actions_stay_at_their_start_and_the_rest_still_learn() -> None:
    """--es-freeze: the heads' rows that output a frozen action keep their start (a fresh
    model's neutral zone: the fixed weights in every state); the other rows move."""
    from broker.placement.policy import NODE_ACTIONS, POOL_ACTIONS

    torch.manual_seed(0)
    model = ActorCritic()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    keys = es_keys(model)
    target = get_vector(model, keys) + 0.5
    frozen = ("cluster_bias_usd_per_hour", "spot_bias_usd_per_hour")
    out = train_es(model, weights=W, seed=1, budget_s=1e9, iterations=20, pairs=8,
                   sigma=0.1, lr=0.05, eval_every=10, decision_interval_s=300.0,
                   scenarios=(), data=None, trace_share=0.0, extra_share=0.0,
                   pool_map=_quadratic_world(target), frozen=frozen)
    node = [a.name for a in NODE_ACTIONS]
    pool = [a.name for a in POOL_ACTIONS]
    for name in frozen:
        i = node.index(name)
        assert torch.equal(out.state["node_head.2.weight"][i], before["node_head.2.weight"][i])
        assert torch.equal(out.state["node_head.2.bias"][i], before["node_head.2.bias"][i])
    j = pool.index("spot_bias_usd_per_hour")
    assert torch.equal(out.state["pool_head.2.weight"][j], before["pool_head.2.weight"][j])
    free = node.index("idle_timeout_s")
    assert not torch.equal(out.state["node_head.2.weight"][free],
                           before["node_head.2.weight"][free])
    assert not torch.equal(out.state["global_head.2.bias"], before["global_head.2.bias"])
    with pytest.raises(ValueError, match="unknown action"):
        free_mask(model, keys, ("bias",))
