"""`skyfed explain` renders the policy part of a decision record and its SHAP attributions."""

from __future__ import annotations

from typing import Any

from broker.commands.placement import _explain_lines

BASE: dict[str, Any] = {
    "placementId": "p-1", "workloadId": "w-1", "costUsdPerHour": 0.5,
    "decision": {"placed": 1, "replicas": 1, "chosen": [], "policy_action": {
        "source": "checkpoint", "checkpoint": "/x/policy.pt", "sha256": "abcdef012345",
        "bias_usd_per_hour": {"aws-use1": -0.0125}, "headroom": 0.91,
        "prewarm_lead_s": 170.0}},
}


def test_policy_action_line() -> None:
    text = "\n".join(_explain_lines(BASE))
    assert "checkpoint /x/policy.pt (sha256 abcdef012345)" in text
    assert "headroom 0.91" in text
    assert "aws-use1 -0.0125" in text


def test_policy_attributions_lines() -> None:
    out = dict(BASE, policyExplanation={"available": True, "outputs": {
        "headroom": {"value": 0.91, "baseline": 0.9, "top_features": [
            {"feature": "batch.pending_cpu_log", "shap": 0.008}]}}})
    text = "\n".join(_explain_lines(out))
    assert "headroom = 0.91 (baseline 0.9)" in text
    assert "+0.00800  batch.pending_cpu_log" in text


def test_policy_attributions_unavailable() -> None:
    out = dict(BASE, policyExplanation={"available": False, "reason": "fixed weights"})
    assert "not available (fixed weights)" in "\n".join(_explain_lines(out))
