"""One seeded run of a fixed trace: the twin's random parts, and the run times policies may know.

`bench twin --seeds N` runs every policy over seeds `seed, seed+1, ...`: the trace file stays
fixed, what the twin draws at random varies. `realize(scenario, noise)` turns the trace into
the events of one run of `scenario.seed`, before the engine starts:

- arrival jitter: every row arrives `U(0, arrival_jitter_s)` later than written (default
  30 s: up to one placement epoch, so a seed moves arrivals across epochs and relative to each
  other). A service's `scale` rows never overtake the service or each other: the trace's
  per-service order, and so its replica counts, are kept.
- duration noise: a job runs `duration_s * exp(sigma * Z - sigma^2 / 2)`, Z ~ N(0, 1):
  log-normal with mean 1, so the trace's run time is the expected one. sigma = 0.1 (about
  +-10 % run to run) is an assumption for the same job on the same hardware (I/O, stragglers,
  noisy neighbours); no shared/data trace repeats a job, so it is not fitted.
- predicted run time (`TraceEvent.predicted_duration_s`): from
  `broker.placement.durations.DurationPredictor`, per tenant and size class, fitted only on
  jobs that finished before the submission. "Finished" is judged on this run's trace
  timeline (jittered submit + the run time that actually happens): the time at which the job
  would finish where it was recorded, the same for every policy, so all policies get the
  same predictions (SCENARIO.md) and `duration_prediction_mape` is one number per seed.
  (A policy whose queue delays a job may thus see an estimate that already includes it; the
  alternative, each policy fitting on its own completions, would give policies different
  information.) The engine starts a job's FINISH timer from `duration_s` (the actual run
  time); the snapshot gives the planner `predicted_duration_s` only.

Streams: each random part draws from its own `stream(seed, name)`, so adding a part (the
physics issue adds `spot_hazard` and `fault_timing`, reserved in `STREAMS`) does not shift the
draws of another, and each part can be switched off alone.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from broker.domain import Resources
from broker.placement.durations import DurationPredictor, FinishedJob, mape, size_class
from broker.sim.scenario import FaultSpec, Realization, Scenario, TraceEvent

ARRIVAL_JITTER = "arrival_jitter"
DURATION_NOISE = "duration_noise"
SPOT_HAZARD = "spot_hazard"  # spot reclaims as a per-pool hazard (sim/hazard.py)
FAULT_TIMING = "fault_timing"  # jitter of the scripted [[faults]] start times
STREAMS = (ARRIVAL_JITTER, DURATION_NOISE, SPOT_HAZARD, FAULT_TIMING)
JOB_KINDS = frozenset({"batch", "train"})


def stream(seed: int, name: str) -> random.Random:
    """The independent random stream `name` of run `seed` (string seeds hash with SHA-512:
    the same on every machine and process, unlike `hash()`)."""
    if name not in STREAMS:
        raise ValueError(f"unknown random stream {name!r} (known: {STREAMS})")
    return random.Random(f"skyfed-twin/{seed}/{name}")


@dataclass(frozen=True, slots=True)
class TwinNoise:
    """How much the random parts vary between seeds (0 switches a part off)."""

    arrival_jitter_s: float = 30.0
    duration_sigma: float = 0.1
    # Spot reclaims as a per-pool hazard (sim/hazard.py), drawn from the `spot_hazard` stream.
    spot_hazard: bool = True
    # Scripted fault start times move U(-w, +w), w <= this (module docstring).
    fault_jitter_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("arrival_jitter_s", "duration_sigma", "fault_jitter_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")

    @classmethod
    def off(cls) -> TwinNoise:
        """The trace exactly as written (unit tests that compute expected numbers by hand)."""
        return cls(arrival_jitter_s=0.0, duration_sigma=0.0, spot_hazard=False,
                   fault_jitter_s=0.0)


def realize(scenario: Scenario, noise: TwinNoise | None = None) -> Scenario:
    """The events of run `scenario.seed` (see the module docstring); a realized one as is."""
    if scenario.realization is not None:
        return scenario
    noise = noise or TwinNoise()
    # Noise first, in trace order: its draws do not depend on the jitter.
    events = _noisy_durations(scenario.events, stream(scenario.seed, DURATION_NOISE),
                              noise.duration_sigma)
    events = _jitter(events, stream(scenario.seed, ARRIVAL_JITTER), noise.arrival_jitter_s)
    events, error, jobs = _predict(events)
    faults = jitter_faults(scenario.faults, stream(scenario.seed, FAULT_TIMING),
                           noise.fault_jitter_s, scenario.horizon_s)
    return dataclasses.replace(scenario, events=events, faults=faults, realization=Realization(
        seed=scenario.seed, arrival_jitter_s=noise.arrival_jitter_s,
        duration_sigma=noise.duration_sigma, duration_prediction_mape=error, jobs=jobs,
        fault_jitter_s=noise.fault_jitter_s))


def jitter_faults(faults: tuple[FaultSpec, ...], rng: random.Random, jitter_s: float,
                  horizon_s: float) -> tuple[FaultSpec, ...]:
    """Each fault's start moved within +-jitter_s (the module docstring's rule): one draw per
    fault in order, whether it moves or not, so a fault's time depends on its place alone."""
    if jitter_s <= 0:
        return faults
    out = []
    for f in faults:
        u = rng.random()
        width = min(jitter_s, f.at_s, horizon_s - f.at_s)
        if f.jitter and width > 0:
            f = dataclasses.replace(f, at_s=f.at_s + width * (2.0 * u - 1.0))
        out.append(f)
    return tuple(out)


def _jitter(events: tuple[TraceEvent, ...], rng: random.Random,
            jitter_s: float) -> tuple[TraceEvent, ...]:
    if jitter_s <= 0:
        return events
    last: dict[str, float] = {}  # a service's latest realized row (service, then scales)
    out: list[tuple[float, int, TraceEvent]] = []
    for i, ev in enumerate(events):
        t = ev.submit_s + rng.uniform(0.0, jitter_s)
        if ev.kind in ("service", "scale"):
            t = max(t, last.get(ev.id, t))
            last[ev.id] = t
        out.append((t, i, dataclasses.replace(ev, submit_s=t)))
    out.sort(key=lambda x: (x[0], x[1]))
    return tuple(ev for _, _, ev in out)


def _noisy_durations(events: tuple[TraceEvent, ...], rng: random.Random,
                     sigma: float) -> tuple[TraceEvent, ...]:
    out = []
    for ev in events:
        if ev.kind in JOB_KINDS and ev.duration_s is not None:
            factor = math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2.0) if sigma else 1.0
            ev = dataclasses.replace(ev, duration_s=ev.duration_s * factor,
                                     trace_duration_s=ev.duration_s)
        out.append(ev)
    return tuple(out)


def _predict(events: tuple[TraceEvent, ...]
             ) -> tuple[tuple[TraceEvent, ...], float | None, int]:
    """Predicted run time of every job at its submission, and the MAPE against the actual."""
    predictor = DurationPredictor()
    predictor.record_all(
        FinishedJob(tenant=ev.tenant, size_class=_class(ev), duration_s=ev.duration_s,
                    finished_s=ev.submit_s + ev.duration_s)
        for ev in events if ev.kind in JOB_KINDS and ev.duration_s is not None)
    out = []
    pairs: list[tuple[float, float]] = []
    for ev in events:  # sorted by submit_s: the predictor's fast path
        if ev.kind in JOB_KINDS:
            est = predictor.predict_class(ev.tenant, _class(ev), at_s=ev.submit_s)
            ev = dataclasses.replace(ev, predicted_duration_s=est.duration_s)
            if ev.duration_s is not None:
                pairs.append((est.duration_s, ev.duration_s))
        out.append(ev)
    return tuple(out), mape(pairs), len(pairs)


def _class(ev: TraceEvent) -> str:
    return size_class(Resources(ev.cpu, ev.memory_gib, ev.gpu), ev.replicas)
