"""Counterfactual replay: `--whatif "cluster=NAME:down@T[+D]"` as an extra fault. Pure."""

from __future__ import annotations

from dataclasses import replace

from broker.sim.scenario import FaultSpec, Scenario


def with_whatif(scenario: Scenario, spec: str) -> Scenario:
    """Apply a counterfactual like `cluster=aws-use1:down@3600` (or `:partition@T+D`)."""
    try:
        lhs, rhs = spec.split("=", 1)
        target, rest = rhs.rsplit(":", 1)
        kind, when = rest.split("@", 1)
        at_s, _, dur = when.partition("+")
        duration = float(dur) if dur else None
        at = float(at_s)
    except ValueError:
        raise ValueError(f"--whatif {spec!r}: expected cluster=NAME:down@SECONDS[+DURATION]"
                         ) from None
    kinds = {"down": "site_down", "partition": "partition"}
    if lhs.strip() != "cluster" or kind not in kinds:
        raise ValueError(f"--whatif {spec!r}: supported: cluster=NAME:down@T, "
                         "cluster=NAME:partition@T (optionally +DURATION)")
    if target not in {c.name for c in scenario.clusters}:
        raise ValueError(f"--whatif {spec!r}: no cluster named {target!r}")
    # At the time asked for: a seeded run does not move it (realize.py, fault timing).
    fault = FaultSpec(at_s=at, target=target, kind=kinds[kind], duration_s=duration,
                      jitter=False)
    return replace(scenario, faults=(*scenario.faults, fault))
