"""The live policy runtime: loading from settings, decisions, records, SHAP from the record."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from broker.domain import FederationSnapshot, PolicyAction
from broker.errors import ConfigError
from broker.federation.placement_loop import decide, decide_and_plan, planner_config
from broker.federation.policy_runtime import (
    PolicyRuntime,
    decode_observation,
    explain_policy,
    load_policy,
    model_for,
)
from broker.placement.policy import (
    DEFAULT_CHECKPOINT,
    HEADROOM_MAX,
    HEADROOM_MIN,
    LEAD_MAX_S,
    ActorCritic,
)
from broker.settings import Settings, load_settings

from .placement_world import federation, workload


def _settings(**policy: object) -> Settings:
    return load_settings(policy=policy, placement={"headroom": 0.8,
                                                   "latency_weight_usd_per_ms": 0.002})


def _snapshot(n: int = 3) -> FederationSnapshot:
    return FederationSnapshot(now_s=3600.0, clusters=federation(),
                              pending=tuple(workload(f"w{i}") for i in range(n)))


@pytest.fixture(scope="module")
def shipped() -> PolicyRuntime:
    return load_policy(_settings(checkpoint="shipped"))


def test_default_is_the_fixed_weights() -> None:
    """The live default places with lp's fixed weights (policy_runtime's docstring says why)."""
    rt = load_policy(_settings())
    assert rt.model is None
    assert rt.decide(_snapshot()).action == PolicyAction(headroom=0.8,
                                                         latency_weight_usd_per_ms=0.002)
    assert 'policy.checkpoint = "none"' in rt.describe()


def test_empty_checkpoint_still_means_the_shipped_one() -> None:
    rt = load_policy(_settings(checkpoint=""))
    assert rt.checkpoint == str(DEFAULT_CHECKPOINT)


def test_shipped_loads_the_packaged_checkpoint(shipped: PolicyRuntime) -> None:
    assert shipped.source == "checkpoint"
    assert shipped.checkpoint == str(DEFAULT_CHECKPOINT)
    assert len(shipped.sha256) == 12
    assert "RL policy checkpoint" in shipped.describe()
    d = shipped.decide(_snapshot())
    assert HEADROOM_MIN <= d.action.headroom <= HEADROOM_MAX
    assert 0.0 <= d.action.prewarm_lead_s <= LEAD_MAX_S
    assert set(d.action.cluster_bias_usd_per_hour) == {c.name for c in federation()}
    # The latency weight is the operator's, not the policy's default.
    assert d.action.latency_weight_usd_per_ms == 0.002
    assert d.record["sha256"] == shipped.sha256
    assert "observation" in d.record


@pytest.mark.parametrize("policy", [{"checkpoint": "none"}, {"checkpoint": "NONE"},
                                    {"enabled": False}])
def test_none_or_disabled_means_fixed_weights(policy: dict[str, object]) -> None:
    rt = load_policy(_settings(**policy))
    assert rt.model is None
    d = rt.decide(_snapshot())
    assert d.action == PolicyAction(headroom=0.8, latency_weight_usd_per_ms=0.002)
    assert d.record["source"] == "fixed"
    assert "observation" not in d.record
    assert "fixed weights" in rt.describe()


def test_operator_checkpoint_missing_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "nope.pt"
    with pytest.raises(ConfigError, match=r"nope\.pt does not exist"):
        load_policy(_settings(checkpoint=str(path)))


def test_operator_checkpoint_corrupt_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt"
    path.write_bytes(b"this is not a torch checkpoint")
    with pytest.raises(ConfigError, match=r"broken\.pt cannot be loaded"):
        load_policy(_settings(checkpoint=str(path)))


def test_operator_checkpoint_loads(tmp_path: Path) -> None:
    torch.manual_seed(3)
    path = tmp_path / "mine.pt"
    ActorCritic().save(path)
    rt = load_policy(_settings(checkpoint=str(path)))
    assert rt.checkpoint == str(path)
    assert rt.decide(_snapshot()).record["checkpoint"] == str(path)


def test_shipped_missing_warns_and_uses_fixed(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        rt = load_policy(_settings(checkpoint="shipped"), shipped=tmp_path / "absent.pt")
    assert rt.model is None
    assert "absent.pt is missing" in caplog.text


def test_plan_records_the_steering_per_placement(shipped: PolicyRuntime) -> None:
    plan = decide_and_plan(_snapshot(), shipped, planner_config(_settings().placement))
    assert plan.placements
    for p in plan.placements:
        pa = p.decision["policy_action"]
        assert isinstance(pa, dict)
        assert pa["source"] == "checkpoint"
        assert pa["sha256"] == shipped.sha256
        chosen = {a.cluster for a in p.assignments}
        assert set(pa["bias_usd_per_hour"]) == chosen
        # Per-pool actions: the chosen clusters' scalable pools, no other cluster's name.
        scalable = {c.name: {p.name for p in c.pools if not c.is_edge} for c in federation()}
        assert {c: set(v) for c, v in pa["pool_idle_timeout_s"].items()} == {
            c: scalable[c] for c in chosen if scalable[c]}
        assert HEADROOM_MIN <= pa["headroom"] <= HEADROOM_MAX
        json.dumps(p.decision)  # the whole record stays JSON-able
        assert len(json.dumps(pa["observation"])) < 4000  # compact


def test_plain_action_function_is_recorded_as_custom() -> None:
    d = decide(lambda _s: PolicyAction(headroom=0.7), _snapshot())
    assert d.record["source"] == "custom"
    assert d.record["headroom"] == 0.7


def test_observation_roundtrip_and_reference(shipped: PolicyRuntime) -> None:
    d = shipped.decide(_snapshot())
    obs, base = decode_observation(d.record["observation"])  # type: ignore[arg-type]
    assert obs.names == tuple(c.name for c in federation())
    assert obs.pools == tuple((c.name, p.name) for c in federation() for p in c.pools
                              if not c.is_edge)
    assert base.pools == obs.pools
    assert np.allclose(base.pool_x, obs.pool_x.mean(axis=0), atol=1e-5)  # the pools' mean
    # Reference: every cluster at the clusters' mean.
    assert all(math.isclose(float(v), float(base.node_x[0, j]), abs_tol=1e-5)
               for row in base.node_x for j, v in enumerate(row))
    assert shipped.model is not None
    assert shipped.model.act(obs).action.headroom == pytest.approx(d.action.headroom, abs=1e-3)
    with pytest.raises(ValueError, match="malformed"):
        decode_observation({"names": ["a"], "node_x": [1.0]})


def test_explain_policy_is_additive(shipped: PolicyRuntime) -> None:
    assert shipped.model is not None
    d = shipped.decide(_snapshot(5))
    out = explain_policy(shipped.model, d.record, clusters=["aws-use1"], top=10_000)
    assert set(out) == {"headroom", "prewarm_lead_s", "bias[aws-use1]"}
    for name, o in out.items():
        assert isinstance(o, dict)
        total = sum(t["shap"] for t in o["top_features"])
        tol = 0.11 if name == "prewarm_lead_s" else 2e-4  # the action is rounded
        assert total == pytest.approx(o["value"] - o["baseline"], abs=tol)


def test_model_for_finds_the_checkpoint_or_says_why(tmp_path: Path,
                                                    shipped: PolicyRuntime) -> None:
    rec = shipped.decide(_snapshot()).record
    assert model_for(rec, shipped) is shipped.model
    assert isinstance(model_for(rec, None), ActorCritic)  # reloaded from the recorded file
    with pytest.raises(LookupError, match="changed since"):
        model_for({**rec, "sha256": "000000000000"}, None)
    with pytest.raises(LookupError, match="not available"):
        model_for({**rec, "checkpoint": str(tmp_path / "gone.pt")}, None)


def test_reference_batch_is_the_recent_mean_and_whatifs_do_not_count() -> None:
    rt = load_policy(_settings(checkpoint="shipped"))
    small, big = _snapshot(1), _snapshot(9)
    rt.decide(small)
    rt.decide(big, remember=False)  # a what-if: not part of the usual batch
    _, base = decode_observation(rt.decide(small).record["observation"])  # type: ignore[arg-type]
    obs_small, _ = decode_observation(rt.decide(small).record["observation"])  # type: ignore[arg-type]
    assert base.batch_x == pytest.approx(obs_small.batch_x, abs=1e-5)
    _, mixed = decode_observation(rt.decide(big).record["observation"])  # type: ignore[arg-type]
    assert mixed.batch_x[0] > obs_small.batch_x[0]  # now the burst moved the reference


def test_the_live_runtime_observes_each_checkpoint_as_it_was_trained(tmp_path: Path) -> None:
    """A checkpoint recording `observation.net_forecast` gets net growth in its forecast
    columns live, as in the twin; one without the record (es3's kind) gets arrivals."""
    from dataclasses import replace

    from broker.placement.action_space import FIXED_WEIGHTS_KEY
    from broker.placement.policy import POOL_FEATURES

    snap = _snapshot()
    key = (snap.clusters[0].name, snap.clusters[0].pools[0].name)
    # As much ends as arrives in one pool: no growth, by the planner's forecast.
    snap = replace(snap, demand={key: (0.05, 0.0)}, freed={key: (0.05, 0.0)})
    new = tmp_path / "new.pt"
    ActorCritic().save(new)
    blob = torch.load(new, weights_only=True)
    del blob["meta"][FIXED_WEIGHTS_KEY]["observation.net_forecast"]
    old = tmp_path / "old.pt"
    torch.save(blob, old)
    fc = POOL_FEATURES.index("forecast_frac")
    seen = {}
    for name, path in (("new", new), ("old", old)):
        rt = load_policy(_settings(checkpoint=str(path)))
        obs, _ = decode_observation(rt.decide(snap).record["observation"])  # type: ignore[arg-type]
        seen[name] = float(obs.pool_x[obs.pools.index(key), fc])
    assert seen["new"] == 0.0
    assert seen["old"] > 0.0
