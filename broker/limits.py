"""Bounds on every number and string the broker accepts, in one place.

Why bounds at all: one tenant's absurd value must not become everyone's outage.
Python's json (and so FastAPI) parses the literals `Infinity` and `NaN`, YAML
has `.inf`, and PostgreSQL's jsonb keeps `1e300` as an exact 301-digit integer
that no JSON encoder can write back (FACTS.md). A cluster priced at `Infinity`
crashed the LP for every tenant; a `durationS: 1e300` made every list of that
tenant answer 500. So:

- the API schemas (`broker/api/schemas.py`) and the MQTT models
  (`edge_agent/protocol.py`, which keeps its own copy: the agent imports nothing
  from `broker`) accept only finite numbers within the limits below, and they
  show in the OpenAPI document (`minimum`/`maximum`/`pattern`);
- strings refuse NUL and control characters (`TEXT_PATTERN`; `MULTILINE_PATTERN`
  also allows tab, CR and LF, for env values, commands and descriptions);
- free-form JSON (`attrs`) passes `check_json`;
- what older versions already stored is repaired on read (`sanitize_json`,
  `clip_spec`), and the answer says which fields were repaired.

The limits are generous: they are far above any real machine, price or run
time, and far below where float arithmetic stops being exact enough for the LP.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from broker.domain import Resources, WorkloadSpec

__all__ = [
    "ARG_CHARS_MAX",
    "BUDGET_USD_PER_HOUR_MAX",
    "CPU_MAX",
    "DATA_GB_MAX",
    "DURATION_S_MAX",
    "ENV_MAX",
    "GPU_MAX",
    "IMAGE_GB_MAX",
    "JSON_DEPTH_MAX",
    "JSON_INT_MAX",
    "JSON_ITEMS_MAX",
    "LATENCY_SLO_MS_MAX",
    "MEMORY_GIB_MAX",
    "MULTILINE_PATTERN",
    "NODES_MAX",
    "PRICE_USD_PER_HOUR_MAX",
    "PRIORITY_MAX",
    "QUOTA_GPU_MAX",
    "QUOTA_VCPU_MAX",
    "RECLAIM_RATE_PER_HOUR_MAX",
    "REPLICAS_MAX",
    "TEXT_PATTERN",
    "UPLINK_GBPS_MAX",
    "check_json",
    "clean_text",
    "clip_spec",
    "has_control",
    "is_text",
    "sanitize_json",
]

CPU_MAX = 100_000.0  # cores, per replica or per node
MEMORY_GIB_MAX = 1e7  # GiB, per replica or per node
GPU_MAX = 1024  # GPUs, per replica or per node
REPLICAS_MAX = 100_000
NODES_MAX = 100_000  # per pool
PRICE_USD_PER_HOUR_MAX = 100_000.0  # one node, or one edge site
BUDGET_USD_PER_HOUR_MAX = 10_000_000.0  # one workload or one tenant
DURATION_S_MAX = 10 * 365 * 86_400.0  # ten years
LATENCY_SLO_MS_MAX = 1e6
DATA_GB_MAX = 1e9
IMAGE_GB_MAX = 10_000.0
QUOTA_VCPU_MAX = 1e8
QUOTA_GPU_MAX = 1e6
RECLAIM_RATE_PER_HOUR_MAX = 3600.0  # at most one reclaim a second
UPLINK_GBPS_MAX = 100_000.0
PRIORITY_MAX = 1000
# Integers in free-form JSON: exact in a float, in JavaScript and in every JSON parser.
JSON_INT_MAX = 2**53
JSON_DEPTH_MAX = 16
JSON_ITEMS_MAX = 10_000
ENV_MAX = 1000  # entries of `env`, arguments of `command`
ARG_CHARS_MAX = 32_768  # one env value or command argument

# No C0 control character and no DEL (NUL included: PostgreSQL refuses it in text and jsonb).
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"
# The same, but tab, LF and CR are allowed (env values, command arguments, descriptions).
MULTILINE_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


_LINE_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """True if `text` holds a character that `MULTILINE_PATTERN` refuses."""
    return _CONTROL.search(text) is not None


def is_text(text: str) -> bool:
    """True if `text` matches `TEXT_PATTERN` (one line, no control character)."""
    return _LINE_CONTROL.search(text) is None


def clean_text(text: str) -> str:
    """`text` with every refused control character replaced by U+FFFD."""
    return _CONTROL.sub("\ufffd", text)


def _bad_number(value: float | int) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -JSON_INT_MAX <= value <= JSON_INT_MAX else \
            f"integer outside +-2^53 ({str(value)[:20]}...)"
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    if abs(value) > JSON_INT_MAX:
        return f"{value:g} is outside +-2^53"
    return None


def check_json(value: Any, *, path: str = "") -> None:
    """Raise ValueError naming the first bad spot of a free-form JSON value.

    Accepted: objects with string keys, arrays, strings without control characters
    (tab, LF, CR allowed), booleans, null, finite numbers within +-2^53; at most
    `JSON_DEPTH_MAX` levels and `JSON_ITEMS_MAX` values in all.
    """
    budget = [JSON_ITEMS_MAX]

    def walk(v: Any, where: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError(f"more than {JSON_ITEMS_MAX} values")
        if depth > JSON_DEPTH_MAX:
            raise ValueError(f"{where or 'value'}: nested deeper than {JSON_DEPTH_MAX} levels")
        if isinstance(v, Mapping):
            for k, item in v.items():
                if not isinstance(k, str) or has_control(k):
                    raise ValueError(f"{where or 'value'}: key {k!r} is not plain text")
                walk(item, f"{where}.{k}" if where else k, depth + 1)
        elif isinstance(v, list | tuple):
            for i, item in enumerate(v):
                walk(item, f"{where}[{i}]", depth + 1)
        elif isinstance(v, str):
            if has_control(v):
                raise ValueError(f"{where or 'value'}: control characters are not allowed")
        elif isinstance(v, int | float):
            problem = _bad_number(v)
            if problem is not None:
                raise ValueError(f"{where or 'value'}: {problem}")
        elif v is not None:
            raise ValueError(f"{where or 'value'}: {type(v).__name__} is not JSON")

    walk(value, path, 0)


def sanitize_json(value: Any, path: str = "") -> tuple[Any, list[str]]:
    """A copy of stored JSON that every encoder can write, and the paths it changed.

    Integers beyond +-2^53 become the nearest finite float (clipped to +-1e308),
    non-finite floats become null, control characters in strings and keys become
    U+FFFD. Used on read, for rows written before the limits existed.
    """
    changed: list[str] = []

    def walk(v: Any, where: str) -> Any:
        if isinstance(v, Mapping):
            out = {}
            for k, item in v.items():
                key = str(k)
                if has_control(key):
                    changed.append(f"{where}.{clean_text(key)}".lstrip("."))
                    key = clean_text(key)
                out[key] = walk(item, f"{where}.{key}" if where else key)
            return out
        if isinstance(v, list | tuple):
            return [walk(item, f"{where}[{i}]") for i, item in enumerate(v)]
        if isinstance(v, str):
            if has_control(v):
                changed.append(where)
                return clean_text(v)
            return v
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, int) and not -JSON_INT_MAX <= v <= JSON_INT_MAX:
            changed.append(where)
            if abs(v) >= 10**308:  # float(v) would overflow
                return 1e308 if v > 0 else -1e308
            return float(v)
        if isinstance(v, float) and not math.isfinite(v):
            changed.append(where)
            return None
        return v

    return walk(value, path), changed


def _clip(value: float, lo: float, hi: float) -> float:
    if isinstance(value, float) and math.isnan(value):
        return lo
    return min(max(value, lo), hi)


def clip_spec(spec: WorkloadSpec) -> tuple[WorkloadSpec, list[str]]:
    """`spec` with every number inside the API's limits, and the fields that moved.

    A spec read from the store passed the validation of the version that wrote
    it; older versions had no upper bounds. Clipping (rather than refusing the
    row) keeps the tenant's lists readable and the placement loop running.
    """
    changed: list[str] = []

    def clip(name: str, value: float, lo: float, hi: float) -> float:
        out = _clip(value, lo, hi)
        if out != value:
            changed.append(name)
        return out

    def clip_opt(name: str, value: float | None, lo: float, hi: float) -> float | None:
        return None if value is None else clip(name, value, lo, hi)

    r = spec.resources
    resources = Resources(clip("resources.cpu", r.cpu, 0.0, CPU_MAX),
                          clip("resources.memory", r.memory_gib, 0.0, MEMORY_GIB_MAX),
                          int(clip("resources.gpu", r.gpu, 0, GPU_MAX)))
    data = tuple(replace(d, size_gb=clip(f"data[{i}].sizeGb", d.size_gb, 0.0, DATA_GB_MAX))
                 for i, d in enumerate(spec.data))
    out = replace(
        spec, replicas=int(clip("replicas", spec.replicas, 1, REPLICAS_MAX)),
        resources=resources, data=data,
        latency_slo_ms=clip_opt("latencySloMs", spec.latency_slo_ms, 1e-9, LATENCY_SLO_MS_MAX),
        image_gb=clip("imageGb", spec.image_gb, 0.0, IMAGE_GB_MAX),
        duration_s=clip_opt("durationS", spec.duration_s, 1e-9, DURATION_S_MAX),
        priority=int(clip("priority", spec.priority, -PRIORITY_MAX, PRIORITY_MAX)),
        budget_usd_per_hour=clip_opt("budgetUsdPerHour", spec.budget_usd_per_hour, 0.0,
                                     BUDGET_USD_PER_HOUR_MAX))
    # env and command travel to edge agents in bounded MQTT models (edge_agent.protocol)
    env = {k: v[:ARG_CHARS_MAX] for k, v in list(spec.env.items())[:ENV_MAX]}
    command = tuple(a[:ARG_CHARS_MAX] for a in spec.command[:ENV_MAX])
    if env != dict(spec.env):
        changed.append("env")
    if command != spec.command:
        changed.append("command")
    out = replace(out, env=env, command=command)
    return (out, changed) if changed else (spec, [])
