"""Job run-time prediction: what a policy may know about how long a batch or train job runs. Pure.

Why: the planner weighs a job's cost by its expected hours (candidates.expected_hours), and
a broker never knows a job's true run time when it is submitted. So every policy, live and in
the twin, gets the same estimate from this module, fitted only on jobs that had *finished
before the submission*. (A later issue gives Kubernetes Jobs their run time from it too.)

Model, per (tenant, size class), in log space because run times are heavy-tailed (the Philly
trace spans 1 s to weeks; a mean of seconds is dominated by the few longest jobs):

    mu = (K * ln(m_c) + sum_i ln(d_i)) / (K + n)        estimate = exp(mu)

- d_1..d_n: run times of the tenant's own finished jobs of that class (clamped to >= 1 s);
- m_c: the cold-start prior, the median run time of size class c in a public trace
  (`PRIOR_MEDIAN_S`, below, with its source); K = `PRIOR_WEIGHT` pseudo-jobs. A new tenant
  or class starts at the prior; after a few jobs its own history dominates.
- exp(mu) is a geometric mean: the median of a log-normal fit, robust to the long tail.
  It is also what the mean absolute percentage error (MAPE) rewards: over-predicting a
  10-minute job by hours is penalised without bound, under-predicting it at most 100 %.

Tenants are isolated: a prediction uses only the tenant's own jobs and the public prior, so
no tenant's run times leak into another tenant's estimates.

Size classes (`size_class`): by the job's total GPUs (GPUs per replica x replicas) when it
has any, "gpu-1", "gpu-2-4", "gpu-5-8", "gpu-9+"; else by total vCPU, "cpu-1-4",
"cpu-5-16", "cpu-17+". The GPU bounds follow the node shapes clouds sell (1, 4 and 8 GPUs):
jobs of one class fit the same nodes and, in Philly, have similar run times.

Cold-start prior (`PRIOR_MEDIAN_S`), printed by `scripts/duration_prior.py`:
- GPU classes: median run time per class of the Microsoft Philly DNN-training jobs
  (shared/data/traces/philly/philly_jobs_pollux.csv.gz, Jeon et al., ATC'19, via Pollux,
  OSDI'21), jobs submitted outside October 2017 (35,055 jobs). October is left out because
  the `federation-day` scenario replays October days, so the prior is not fitted to it.
- CPU classes (one value for all three): median run time of the CPU-only pods of the
  Alibaba GPU cluster trace 2023 (shared/data/traces/alibaba_gpu_v2023, FGD, ATC'23; 1,052
  pods, deletion - scheduled). That trace has no CPU pod under 8 vCPU, hence one value.
`PRIOR_WEIGHT` = 3 pseudo-jobs was chosen before any scenario was run, not fitted.

"Finished before the submission" is strict: a job that finishes at or after `at_s` is not
used for a prediction at `at_s`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker.domain import Resources

# Median run time (s) per size class; see the module docstring for the sources.
PRIOR_MEDIAN_S: Mapping[str, float] = {
    "gpu-1": 309.0,
    "gpu-2-4": 174.0,
    "gpu-5-8": 15498.0,
    "gpu-9+": 15654.5,
    "cpu-1-4": 494.0,
    "cpu-5-16": 494.0,
    "cpu-17+": 494.0,
}
PRIOR_WEIGHT = 3.0
MIN_DURATION_S = 1.0
SIZE_CLASSES = tuple(PRIOR_MEDIAN_S)


def size_class(resources: Resources, replicas: int) -> str:
    """The job's size class: total GPUs if it has any, else total vCPU (module docstring)."""
    n = max(1, replicas)
    gpus = resources.gpu * n
    if gpus >= 1:
        return "gpu-1" if gpus == 1 else "gpu-2-4" if gpus <= 4 else (
            "gpu-5-8" if gpus <= 8 else "gpu-9+")
    cpu = resources.cpu * n
    return "cpu-1-4" if cpu <= 4 else "cpu-5-16" if cpu <= 16 else "cpu-17+"


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One job that ran to completion: the predictor's only input."""

    tenant: str
    size_class: str
    duration_s: float
    finished_s: float


@dataclass(frozen=True, slots=True)
class DurationEstimate:
    duration_s: float
    size_class: str
    jobs: int  # the tenant's finished jobs of this class behind it (0: the prior alone)


@dataclass(slots=True)
class _Sums:
    n: int = 0
    log_sum: float = 0.0


@dataclass
class DurationPredictor:
    """Estimates from finished jobs, never from a job that finished after the query time.

    `record` takes finished jobs in any order; `predict(..., at_s)` uses those with
    `finished_s < at_s`. Queries with non-decreasing `at_s` (the twin, the live loop) are
    O(log n) per recorded job; an earlier `at_s` is answered by a scan of the history.
    """

    prior_median_s: Mapping[str, float] = field(default_factory=lambda: dict(PRIOR_MEDIAN_S))
    prior_weight: float = PRIOR_WEIGHT
    _history: list[FinishedJob] = field(default_factory=list, init=False, repr=False)
    # (finished_s, index into _history) of jobs not yet in _sums
    _waiting: list[tuple[float, int]] = field(default_factory=list, init=False, repr=False)
    _sums: dict[tuple[str, str], _Sums] = field(default_factory=dict, init=False, repr=False)
    # Every recorded job with finished_s < _watermark is counted in _sums.
    _watermark: float = field(default=-math.inf, init=False, repr=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.prior_weight) or self.prior_weight <= 0:
            raise ValueError(f"prior_weight must be finite and > 0, got {self.prior_weight}")
        for cls, median in self.prior_median_s.items():
            if not math.isfinite(median) or median <= 0:
                raise ValueError(f"prior median of {cls!r} must be finite and > 0")

    def record(self, job: FinishedJob) -> None:
        """Add a finished job. Non-finite or negative numbers are refused (ValueError)."""
        if not (math.isfinite(job.duration_s) and job.duration_s >= 0
                and math.isfinite(job.finished_s)):
            raise ValueError(f"finished job needs finite duration_s >= 0 and finished_s: {job}")
        self._history.append(job)
        if job.finished_s < self._watermark:
            self._add(job)
        else:
            heapq.heappush(self._waiting, (job.finished_s, len(self._history) - 1))

    def record_all(self, jobs: Iterable[FinishedJob]) -> None:
        for job in jobs:
            self.record(job)

    def predict(self, tenant: str, resources: Resources, replicas: int, *,
                at_s: float) -> DurationEstimate:
        """The estimate for a job of `tenant` submitted at `at_s` (see the module docstring)."""
        cls = size_class(resources, replicas)
        return self.predict_class(tenant, cls, at_s=at_s)

    def predict_class(self, tenant: str, cls: str, *, at_s: float) -> DurationEstimate:
        if cls not in self.prior_median_s:
            raise ValueError(f"unknown size class {cls!r} (known: {sorted(self.prior_median_s)})")
        if at_s >= self._watermark:
            self._absorb(at_s)
            sums = self._sums.get((tenant, cls), _Sums())
        else:
            sums = _Sums()
            for job in self._history:
                if job.finished_s < at_s and job.tenant == tenant and job.size_class == cls:
                    sums.n += 1
                    sums.log_sum += math.log(max(job.duration_s, MIN_DURATION_S))
        k = self.prior_weight
        mu = (k * math.log(self.prior_median_s[cls]) + sums.log_sum) / (k + sums.n)
        return DurationEstimate(duration_s=math.exp(mu), size_class=cls, jobs=sums.n)

    def _absorb(self, at_s: float) -> None:
        while self._waiting and self._waiting[0][0] < at_s:
            _, i = heapq.heappop(self._waiting)
            self._add(self._history[i])
        self._watermark = at_s

    def _add(self, job: FinishedJob) -> None:
        sums = self._sums.setdefault((job.tenant, job.size_class), _Sums())
        sums.n += 1
        sums.log_sum += math.log(max(job.duration_s, MIN_DURATION_S))


def remaining_s(predicted_s: float | None, age_s: float) -> float:
    """Expected further run time of a job that has been running (or waiting) `age_s`.

    max(predicted - age, age): before its predicted end, what the prediction leaves; past
    it, as long again as it has run. Heavy-tailed run times make age the better guide once
    a job outlives its estimate: Harchol-Balter and Downey ("Exploiting process lifetime
    distributions for dynamic load balancing", ACM TOCS 15(3), 1997) measured that a process
    of age t lives past T with probability t/T, so its median remaining life is its age.
    Used by consolidation (placement/consolidate.py) to judge how long a node would still
    be paid for; with no prediction, the age alone.
    """
    age = max(0.0, age_s)
    if predicted_s is None:
        return age
    return max(predicted_s - age, age)


def mape(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error of (predicted, actual) pairs; actuals clamped to >= 1 s.

    None when there are no pairs (a scenario without batch or train jobs).
    """
    errs = [abs(p - a) / max(a, MIN_DURATION_S) for p, a in pairs]
    return sum(errs) / len(errs) if errs else None
