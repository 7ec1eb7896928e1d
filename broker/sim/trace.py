"""Trace loading for the digital twin: `trace.csv(.gz)` as SCENARIO.md defines it.

Split from scenario.py (the TOML half) so each stays small. The same strictness applies:
an unknown column, a bad cell or an out-of-order row is a `ScenarioError` naming the column
and the line, because a silently misread trace makes an experiment measure something else.

A `TraceEvent` is one row. The twin's realization (`broker/sim/realize.py`) derives the
events one seeded run replays: the same rows with jittered `submit_s`, the run time that
actually happens (`duration_s`: the trace's run time times seeded noise; `trace_duration_s`
keeps the file's value) and `predicted_duration_s`, the duration predictor's estimate at
submission: the only run time a policy ever sees.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TRACE_KINDS = frozenset({"service", "batch", "train", "scale"})
TRACE_COLUMNS = (
    "id", "submit_s", "tenant", "kind", "replicas", "cpu", "memory_gib", "gpu", "gpu_model",
    "duration_s", "user_region", "latency_slo_ms", "data_gb", "data_region", "image_gb",
    "priority",
)
REQUIRED_TRACE_COLUMNS = ("id", "submit_s", "kind")


class ScenarioError(ValueError):
    """A scenario or trace file breaks SCENARIO.md; the message names the key/column/line."""


class Located(Protocol):
    """What the trace needs of a cluster to check `data_region` (ClusterSpec fits)."""

    @property
    def name(self) -> str: ...

    @property
    def region(self) -> str: ...

    @property
    def region_key(self) -> str: ...


@dataclass(frozen=True, slots=True)
class TraceEvent:
    id: str
    submit_s: float
    tenant: str
    kind: str
    replicas: int
    cpu: float
    memory_gib: float
    gpu: int
    gpu_model: str | None
    duration_s: float | None
    user_region: str | None
    latency_slo_ms: float | None
    data_gb: float
    data_region: str | None
    image_gb: float
    priority: int
    # Set by the realization of a seeded run (realize.py), never read from the file:
    # the predictor's run-time estimate at submission (what the planner sees) and the run
    # time the file gave before the seeded noise (what the prediction error is judged on).
    predicted_duration_s: float | None = None
    trace_duration_s: float | None = None


def _cell_float(row: Mapping[str, str], col: str, where: str, default: float | None,
                *, minimum: float = 0.0) -> float | None:
    raw = (row.get(col) or "").strip()
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ScenarioError(f"{where}: column {col!r} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise ScenarioError(f"{where}: column {col!r} must be >= {minimum}, got {raw!r}")
    return value


def _cell_int(row: Mapping[str, str], col: str, where: str, default: int, *,
              minimum: int = 0) -> int:
    raw = (row.get(col) or "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ScenarioError(f"{where}: column {col!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ScenarioError(f"{where}: column {col!r} must be >= {minimum}, got {raw!r}")
    return value


def _location_known(loc: str, clusters: Iterable[Located]) -> bool:
    return any(loc in (c.name, c.region, c.region_key) for c in clusters)


def parse_trace(text: str, *, user_regions: set[str], clusters: Iterable[Located],
                where: str = "trace") -> tuple[TraceEvent, ...]:
    """Parse trace CSV text (header required, rows sorted by submit_s)."""
    sites = tuple(clusters)
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    for col in header:
        if col not in TRACE_COLUMNS:
            raise ScenarioError(f"{where}: unknown column {col!r} (allowed: {TRACE_COLUMNS})")
    for col in REQUIRED_TRACE_COLUMNS:
        if col not in header:
            raise ScenarioError(f"{where}: missing required column {col!r}")
    events: list[TraceEvent] = []
    services: set[str] = set()
    seen: set[str] = set()
    last = -math.inf
    for line, row in enumerate(reader, start=2):
        w = f"{where} line {line}"
        wid = (row.get("id") or "").strip()
        if not wid:
            raise ScenarioError(f"{w}: column 'id' is empty")
        submit = _cell_float(row, "submit_s", w, None)
        if submit is None:
            raise ScenarioError(f"{w}: column 'submit_s' is empty")
        if submit < last:
            raise ScenarioError(f"{w}: rows must be sorted by submit_s ({submit} < {last})")
        last = submit
        kind = (row.get("kind") or "").strip()
        if kind not in TRACE_KINDS:
            raise ScenarioError(f"{w}: column 'kind' must be one of {sorted(TRACE_KINDS)}, "
                                f"got {kind!r}")
        if kind == "scale":
            if wid not in services:
                raise ScenarioError(f"{w}: scale event for {wid!r}, which is not an earlier "
                                    "service")
        elif wid in seen:
            raise ScenarioError(f"{w}: duplicate workload id {wid!r}")
        seen.add(wid)
        if kind == "service":
            services.add(wid)
        ur = (row.get("user_region") or "").strip() or None
        if ur is not None and ur not in user_regions:
            raise ScenarioError(f"{w}: user_region {ur!r} is not a [[user_regions]] name")
        dr = (row.get("data_region") or "").strip() or None
        if dr is not None and not _location_known(dr, sites):
            raise ScenarioError(f"{w}: data_region {dr!r} is not a cluster or region name")
        slo = _cell_float(row, "latency_slo_ms", w, None)
        if slo is not None and ur is None:
            raise ScenarioError(f"{w}: latency_slo_ms needs a user_region")
        events.append(TraceEvent(
            id=wid, submit_s=submit, tenant=(row.get("tenant") or "").strip() or "default",
            kind=kind, replicas=_cell_int(row, "replicas", w, 1, minimum=0 if kind == "scale"
                                          else 1),
            cpu=_cell_float(row, "cpu", w, 0.0) or 0.0,
            memory_gib=_cell_float(row, "memory_gib", w, 0.0) or 0.0,
            gpu=_cell_int(row, "gpu", w, 0),
            gpu_model=(row.get("gpu_model") or "").strip() or None,
            duration_s=_cell_float(row, "duration_s", w, None),
            user_region=ur, latency_slo_ms=slo,
            data_gb=_cell_float(row, "data_gb", w, 0.0) or 0.0, data_region=dr,
            image_gb=_cell_float(row, "image_gb", w, 0.5) or 0.0,
            priority=_cell_int(row, "priority", w, 0, minimum=-(10**9)),
        ))
    return tuple(events)


def load_trace(path: Path, *, user_regions: set[str],
               clusters: Iterable[Located]) -> tuple[TraceEvent, ...]:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
                text = fh.read()
        else:
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"trace file not found: {path}") from None
    return parse_trace(text, user_regions=user_regions, clusters=clusters, where=str(path))
