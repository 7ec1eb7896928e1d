"""A checkpoint records the fixed weights it was trained against; loading one that differs
from today's (or has no record) warns, naming the values, in every shell that loads one."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from broker.cli import app
from broker.federation.policy_runtime import load_policy
from broker.placement.policy import (
    CHECKPOINT_VERSION,
    FIXED_WEIGHTS_KEY,
    ActorCritic,
    fixed_weights,
    fixed_weights_warnings,
)
from broker.settings import load_settings
from broker.sim.randomize import random_draft
from broker.sim.runner import run_policy
from providers.catalog import Catalog


def _checkpoint(path: Path, fixed: dict[str, float] | None) -> Path:
    """A fresh model saved as a checkpoint whose metadata records `fixed` (None: no record,
    as every checkpoint saved before the record existed)."""
    torch.manual_seed(0)
    model = ActorCritic()
    meta: dict[str, object] = {"seed": 0}
    if fixed is not None:
        meta[FIXED_WEIGHTS_KEY] = fixed
    torch.save({"version": CHECKPOINT_VERSION, "state": model.state_dict(), "hidden": 32,
                "rounds": 2, "meta": meta}, path)
    return path


def _old_timer() -> dict[str, float]:
    """Today's fixed weights but the idle timer the v2 checkpoint was trained with (CA's)."""
    old = fixed_weights()
    old["idle_timeout_s"] = old["decision.scale_in_idle_s"]
    return old


def test_save_records_todays_fixed_weights_and_loads_without_warning(tmp_path: Path) -> None:
    path = tmp_path / "p.pt"
    ActorCritic().save(path, meta={"seed": 1})
    blob = torch.load(path, weights_only=True)
    assert blob["meta"][FIXED_WEIGHTS_KEY] == fixed_weights()
    assert blob["meta"]["seed"] == 1
    loaded = ActorCritic.load(path)
    assert loaded.meta[FIXED_WEIGHTS_KEY] == fixed_weights()
    assert loaded.fixed_weights_warnings() == ()


def test_a_moved_default_is_named_with_both_values(tmp_path: Path) -> None:
    model = ActorCritic.load(_checkpoint(tmp_path / "old.pt", _old_timer()))
    old, now = _old_timer()["idle_timeout_s"], fixed_weights()["idle_timeout_s"]
    [line] = model.fixed_weights_warnings()
    assert line == f"fixed weight idle_timeout_s: trained against {old}, today {now:g}"


def test_values_only_one_side_has_are_named() -> None:
    rec = {k: v for k, v in fixed_weights().items() if k != "reserve_nodes"}
    rec["retired_knob"] = 1.0
    lines = fixed_weights_warnings({FIXED_WEIGHTS_KEY: rec})
    assert len(lines) == 2
    assert lines[0].startswith("fixed weight reserve_nodes: not recorded")
    assert lines[1] == "fixed weight retired_knob: trained against 1.0, no longer one"


def test_a_checkpoint_without_the_record_loads_with_a_warning() -> None:
    buf = io.BytesIO()
    torch.manual_seed(0)
    torch.save({"version": CHECKPOINT_VERSION, "state": ActorCritic().state_dict(),
                "hidden": 32, "rounds": 2, "meta": {"seed": 0}}, buf)
    model = ActorCritic.load(buf.getvalue())
    [line] = model.fixed_weights_warnings()
    assert "does not record the fixed weights" in line


def test_live_load_logs_the_warning_and_the_banner_names_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _checkpoint(tmp_path / "old.pt", _old_timer())
    with caplog.at_level(logging.WARNING):
        rt = load_policy(load_settings(policy={"checkpoint": str(path)}))
    assert rt.model is not None
    assert "idle_timeout_s: trained against" in caplog.text
    assert "old.pt" in caplog.text
    banner = rt.describe()
    assert "(sha256 " in banner
    assert "; WARNING: fixed weight" in banner
    assert "idle_timeout_s: trained against" in banner


def test_a_current_checkpoint_has_a_clean_banner(tmp_path: Path) -> None:
    path = tmp_path / "new.pt"
    ActorCritic().save(path)
    rt = load_policy(load_settings(policy={"checkpoint": str(path)}))
    assert rt.warnings == ()
    assert "WARNING" not in rt.describe()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    catalog = Catalog.load()
    out = tmp_path_factory.mktemp("tiny")
    return random_draft(catalog, 5, n_clusters=2, n_edge=0, horizon_s=600.0,
                        n_events=10).write(out)


def test_run_notes_and_bench_twin_json_name_it(tmp_path: Path, tiny: Path) -> None:
    path = _checkpoint(tmp_path / "old.pt", _old_timer())
    catalog = Catalog.load()
    from broker.sim.scenario import load_scenario

    res = run_policy(load_scenario(tiny, catalog), "lp+rl", catalog,
                     model=ActorCritic.load(path))
    assert any("idle_timeout_s: trained against" in n for n in res.notes)
    out = CliRunner().invoke(app, ["bench", "twin", "--scenario", str(tiny), "--policies",
                                   "lp,lp+rl", "--checkpoint", str(path), "--json",
                                   "--no-progress", "--jobs", "1"])
    assert out.exit_code == 0, out.output
    notes = json.loads(out.stdout)["notes"]
    assert "lp" not in notes
    assert any("idle_timeout_s: trained against" in n for n in notes["lp+rl"])


def test_policy_leverage_json_names_it(tmp_path: Path, tiny: Path) -> None:
    path = _checkpoint(tmp_path / "old.pt", None)
    out = CliRunner().invoke(app, ["policy", "leverage", "--scenario", str(tiny),
                                   "--checkpoint", str(path), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert "does not record the fixed weights" in doc["checkpoint_warnings"][0]
    assert doc["decisions_changed_frac"] == 0.0  # an untrained model is lp


def test_the_record_holds_the_bound_on_learned_idle_timers() -> None:
    """A checkpoint trained before the planner bounded idle timers (es3) is named as such
    when loaded: its actions were learned where a 2 s timer counted as 2 s."""
    from broker.placement.decisions import DecisionConfig

    assert fixed_weights()["decision.policy_idle_min_s"] == DecisionConfig().policy_idle_min_s
    rec = {k: v for k, v in fixed_weights().items() if k != "decision.policy_idle_min_s"}
    [line] = fixed_weights_warnings({FIXED_WEIGHTS_KEY: rec})
    assert line.startswith("fixed weight decision.policy_idle_min_s: not recorded")


def test_the_record_says_what_the_forecast_features_mean() -> None:
    """Checkpoints trained when the observation's forecast features were arrivals alone
    (es3) are named as such: since 2026-12-07 those columns carry net growth."""
    import inspect

    from broker.placement import observe
    from broker.placement.action_space import OBSERVE_NET_FORECAST

    assert fixed_weights()["observation.net_forecast"] == 1.0 == float(OBSERVE_NET_FORECAST)
    # observe's default is what the record says
    assert inspect.signature(observe.observe).parameters["net_forecast"].default is True
    rec = {k: v for k, v in fixed_weights().items() if k != "observation.net_forecast"}
    [line] = fixed_weights_warnings({FIXED_WEIGHTS_KEY: rec})
    assert line.startswith("fixed weight observation.net_forecast: not recorded")
    [line] = fixed_weights_warnings({FIXED_WEIGHTS_KEY: {**rec, "observation.net_forecast": 0.0}})
    assert line == "fixed weight observation.net_forecast: trained against 0.0, today 1"
