"""Statistics over seeds: 95 % confidence intervals and when one policy is "better". Pure.

Every policy runs the same scenario over the same seeds (`bench twin --seeds N`), so each
metric has one sample per seed per policy.

- Interval of a metric: Student t over the seeds,
  `mean +- t(0.975, n-1) * s / sqrt(n)`, s the sample standard deviation (n - 1 in the
  denominator). The seeds are independent replications of the twin's random parts, so the
  per-seed values are i.i.d.; t (not z) because n is small (3-10). No interval for n < 2.
- "A is better than B on metric m": the 95 % Student-t interval of the *paired* differences
  `m_A(seed) - m_B(seed)` lies entirely on the better side of 0 (below it where lower is
  better, above it where higher is better). Pairing is right because both policies ran the
  same seeds, i.e. the same jittered arrivals and the same run-time noise (common random
  numbers): the shared noise cancels in the difference. This is the paired-t comparison of
  Law & Kelton, *Simulation Modeling and Analysis* (ch. "Comparing alternative system
  configurations"). It can call a difference significant while the two marginal intervals
  of the table still overlap; an identical result on every seed (a tie) is never "better".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Metrics where a larger value is better; every other metric is better when lower.
HIGHER_IS_BETTER = frozenset({"utilization_cpu", "utilization_gpu", "speedup_8gpu"})
# Metrics with a mean and interval but no "better" verdict: the planner's wall-clock time
# per epoch measures the machine the twin ran on (other processes, a core's sibling) as
# much as the policy, so it is compared in `skyfed bench placement`, not here.
NOT_JUDGED = frozenset({"decision_ms_p99"})
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    mean: float
    low: float | None  # None with fewer than two samples
    high: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean


def t_quantile(df: int) -> float:
    """The two-sided 95 % Student t quantile, t(0.975, df). scipy.stats is imported here,
    not with the module: it takes ~1.2 s, and a one-seed run needs no interval."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.5 + CONFIDENCE / 2.0, df))


def mean_ci95(samples: Sequence[float]) -> Interval:
    """Mean and Student-t 95 % interval of `samples` (at least one finite value)."""
    xs = [float(x) for x in samples]
    if not xs or not all(math.isfinite(x) for x in xs):
        raise ValueError(f"need at least one sample, all finite: {samples!r}")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n < 2:
        return Interval(mean, None, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    hw = t_quantile(n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - hw, mean + hw)


def better(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool) -> bool:
    """Whether `a` beats `b` by the paired-t rule of the module docstring (same seeds)."""
    if len(a) != len(b):
        raise ValueError("paired samples need the same seeds")
    if len(a) < 2:
        return False
    diff = mean_ci95([x - y for x, y in zip(a, b, strict=True)])
    if diff.low is None or diff.high is None:
        return False
    return diff.low > 0.0 if higher_is_better else diff.high < 0.0


def _numbers(values: Sequence[object]) -> list[float] | None:
    """The samples of one metric, or None when any seed has no value (e.g. no GPU jobs)."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy over the seeds: the JSON's `policies.<name>` object."""

    mean: dict[str, object]  # metric -> mean over seeds (the single value with one seed)
    ci95: dict[str, list[float]]  # metric -> [low, high]; empty with one seed
    per_seed: dict[str, list[object]]  # metric -> the value of each seed, in seed order
    better_than: dict[str, list[str]]  # metric -> policies this one beats (paired-t rule)


def summarize(runs: Mapping[str, Sequence[Mapping[str, object]]],
              digits: int = 6) -> dict[str, PolicySummary]:
    """Per policy, from its per-seed metric dicts (every policy ran the same seeds, in order)."""
    samples: dict[str, dict[str, list[float] | None]] = {}
    out: dict[str, PolicySummary] = {}
    for name, metrics in runs.items():
        keys = list(metrics[0]) if metrics else []
        per_seed = {k: [m.get(k) for m in metrics] for k in keys}
        mean: dict[str, object] = {}
        ci: dict[str, list[float]] = {}
        samples[name] = {}
        for k, values in per_seed.items():
            nums = _numbers(values)
            samples[name][k] = nums
            if len(values) == 1 or nums is None:
                mean[k] = values[0] if len(values) == 1 else _mean_of_present(values, digits)
                continue
            iv = mean_ci95(nums)
            mean[k] = round(iv.mean, digits)
            if iv.low is not None and iv.high is not None:
                ci[k] = [round(iv.low, digits), round(iv.high, digits)]
        out[name] = PolicySummary(mean, ci, per_seed, {})
    for name, summary in out.items():
        for k, mine in samples[name].items():
            if mine is None or k in NOT_JUDGED:
                continue
            beaten = [other for other in out if other != name
                      and (theirs := samples[other].get(k)) is not None
                      and better(mine, theirs, higher_is_better=k in HIGHER_IS_BETTER)]
            if beaten:
                summary.better_than[k] = beaten
    return out


def _mean_of_present(values: Sequence[object], digits: int) -> float | None:
    nums = [float(v) for v in values
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return round(math.fsum(nums) / len(nums), digits) if nums else None
