"""Request schemas: a Kubernetes-like workload manifest and member registration.

Field names are camelCase in the wire format (`latencySloMs`) and snake_case in
Python. Unknown fields are refused (a typo like `replica: 3` must not silently
mean "1 replica"). Each model converts itself to `broker.domain` values with
`to_domain()`; the API never stores anything a model did not accept.

Hostile input is normal input: every number is finite (`Infinity`/`NaN`, JSON
or YAML, are refused) and bounded, every string refuses NUL and control
characters, every list and map has a maximum size, and free-form `attrs` pass
`broker.limits.check_json`. The limits live in `broker/limits.py` and show in
the OpenAPI document (`minimum`, `maximum`, `maxLength`, `pattern`, `maxItems`).

Quantities: `cpu` is cores (`2`, `0.5` or `"500m"`); `memory` is GiB as a number
or a Kubernetes quantity (`"4Gi"`, `"512Mi"`, `"8G"`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel

from broker import limits as lim
from broker.domain import (
    Cluster,
    DataSource,
    Interconnect,
    Offer,
    Pool,
    PricingModel,
    Resources,
    Site,
    Spread,
    Toleration,
    WorkloadKind,
    WorkloadSpec,
)
from broker.errors import SpecError
from broker.store.workloads import is_workload_id

_GIB = 1024.0**3
_UNITS = {"Ki": 1024.0, "Mi": 1024.0**2, "Gi": _GIB, "Ti": 1024.0**4,
          "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "k": 1e3}
_QTY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]{0,2})\s*$")
NAME_RE = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
TENANT_RE = r"^[a-z0-9][-a-z0-9_]{0,63}$"
TenantName = Annotated[str, Field(min_length=1, max_length=64, pattern=TENANT_RE)]
# A tenant's private member lent to these tenants (their workloads may be placed there too).
LendTo = Annotated[list[TenantName], Field(
    max_length=64, description="Tenants this tenant-private member is lent to (tenant tokens "
    "only: an admin's or operator's registration is federation-wide).")]
TEXT = lim.TEXT_PATTERN


def parse_memory_gib(v: Any) -> Any:
    """`4` -> 4.0 GiB; `"4Gi"` -> 4.0; `"512Mi"` -> 0.5; `"8G"` -> 7.45 (decimal)."""
    if isinstance(v, str):
        m = _QTY.match(v)
        if m is None or (m.group(2) and m.group(2) not in _UNITS):
            raise ValueError(f"{v!r} is not a memory quantity (use GiB or e.g. '4Gi', '512Mi')")
        num, unit = float(m.group(1)), m.group(2)
        return num if not unit else num * _UNITS[unit] / _GIB
    return v


def parse_cpu(v: Any) -> Any:
    """`2` -> 2.0 cores; `"500m"` -> 0.5."""
    if isinstance(v, str):
        s = v.strip()
        try:
            return float(s[:-1]) / 1000.0 if s.endswith("m") else float(s)
        except ValueError:
            raise ValueError(f"{v!r} is not a CPU quantity (use cores or e.g. '500m')") from None
    return v


def _json_ok(v: dict[str, Any] | None) -> dict[str, Any] | None:
    if v is not None:
        lim.check_json(v)
    return v


def _quantity_schema(maximum: float, units: str, example: str) -> WithJsonSchema:
    """The wire form of a quantity: a bounded number, or a string such as `example`."""
    return WithJsonSchema({"anyOf": [
        {"type": "number", "minimum": 0, "maximum": maximum},
        {"type": "string", "maxLength": 32,
         "pattern": rf"^\s*[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*({units})?\s*$",
         "description": f"a quantity such as {example!r}, at most {maximum:g} after conversion"},
    ]})


def _resolution(digits: int) -> Callable[[Any, float | None], float | None]:
    """A field validator rounding to `digits` decimals.

    Why: numbers are bounded above, and they must not be absurdly small either. The
    planner divides by sizes and prices; `5e-324` CPUs (a valid float) once made its
    bounds overflow. Every quantity has a resolution far below anything real
    (Kubernetes has millicores and bytes); finer fractions are rounded to it."""
    def rounded(_cls: Any, v: float | None) -> float | None:
        return None if v is None else round(v, digits)
    return rounded


Cpu = Annotated[float, BeforeValidator(parse_cpu), Field(ge=0, le=lim.CPU_MAX),
                AfterValidator(lambda v: round(v, 3)),  # millicores
                _quantity_schema(lim.CPU_MAX, "m", "500m")]
MemoryGib = Annotated[float, BeforeValidator(parse_memory_gib),
                      Field(ge=0, le=lim.MEMORY_GIB_MAX),
                      AfterValidator(lambda v: round(v * _GIB) / _GIB),  # bytes
                      _quantity_schema(lim.MEMORY_GIB_MAX, "Ki|Mi|Gi|Ti|K|M|G|T|k", "4Gi")]
Gpu = Annotated[int, Field(ge=0, le=lim.GPU_MAX)]
Label = Annotated[str, Field(max_length=253, pattern=TEXT)]
Key = Annotated[str, Field(min_length=1, max_length=253, pattern=TEXT)]


def _map_schema(max_items: int, value_max: int, value_pattern: str) -> WithJsonSchema:
    """A string map in OpenAPI: key rules in `propertyNames` (pydantic would put the key
    pattern in `patternProperties`, which does not refuse other keys)."""
    return WithJsonSchema({
        "type": "object", "maxProperties": max_items,
        "propertyNames": {"minLength": 1, "maxLength": 253, "pattern": TEXT},
        "additionalProperties": {"type": "string", "maxLength": value_max,
                                 "pattern": value_pattern}})


Labels = Annotated[dict[Key, Label], Field(max_length=64), _map_schema(64, 253, TEXT)]
EnvValue = Annotated[str, Field(max_length=lim.ARG_CHARS_MAX, pattern=lim.MULTILINE_PATTERN)]
Env = Annotated[dict[Key, EnvValue], Field(max_length=lim.ENV_MAX),
                _map_schema(lim.ENV_MAX, lim.ARG_CHARS_MAX, lim.MULTILINE_PATTERN)]
Short = Annotated[str, Field(min_length=1, max_length=128, pattern=TEXT)]
# Free-form extension data, kept verbatim (`broker.limits.check_json`).
Attrs = Annotated[dict[str, Any] | None, AfterValidator(_json_ok), Field(
    description="Free-form JSON kept verbatim: finite numbers within +-2^53, strings without "
                "control characters, at most 16 levels and 10,000 values.")]


class _Model(BaseModel):
    # allow_inf_nan=False: Python's json and YAML both parse Infinity/NaN (FACTS.md).
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v: Any, info: ValidationInfo) -> Any:
        """`true` is not 1: pydantic's lax mode would take a bool for a number field
        (`durationS: true` -> 1.0 s), which the schema says is a number."""
        if isinstance(v, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            if ann is not bool and bool not in get_args(ann):
                raise ValueError("must be a number or a string, not true/false")
        return v


class ResourcesIn(_Model):
    cpu: Cpu = 0.0
    memory: MemoryGib = 0.0
    gpu: Gpu = 0
    gpu_model: str | None = Field(default=None, max_length=64, pattern=TEXT)
    interconnect: Interconnect = Interconnect.NONE


class DataSourceIn(_Model):
    size_gb: float = Field(ge=0, le=lim.DATA_GB_MAX)
    location: str = Field(min_length=1, max_length=200, pattern=TEXT)
    url: str = Field(default="", max_length=2048, pattern=TEXT)
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")

    _size = field_validator("size_gb")(classmethod(_resolution(9)))


class TolerationIn(_Model):
    key: str = Field(default="", max_length=253, pattern=TEXT)
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = Field(default="", max_length=253, pattern=TEXT)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class SpreadIn(_Model):
    topology: Literal["cluster", "zone", "region"] = "cluster"
    min_domains: int = Field(default=1, ge=1, le=1000)
    max_domains: int | None = Field(default=None, ge=1, le=1000)


class WorkloadSpecIn(_Model):
    kind: WorkloadKind
    image: str = Field(min_length=1, max_length=1024, pattern=TEXT)
    replicas: int = Field(default=1, ge=1, le=lim.REPLICAS_MAX)
    resources: ResourcesIn = Field(default_factory=ResourcesIn)
    user_region: str | None = Field(default=None, max_length=128, pattern=TEXT)
    latency_slo_ms: float | None = Field(default=None, gt=0, le=lim.LATENCY_SLO_MS_MAX)
    data: list[DataSourceIn] = Field(default_factory=list, max_length=100)
    image_gb: float = Field(default=0.5, ge=0, le=lim.IMAGE_GB_MAX)
    duration_s: float | None = Field(default=None, gt=0, le=lim.DURATION_S_MAX)
    affinity: Labels = Field(default_factory=dict)
    anti_affinity: Labels = Field(default_factory=dict)
    avoid_workloads: list[Label] = Field(default_factory=list, max_length=1000)
    tolerations: list[TolerationIn] = Field(default_factory=list, max_length=100)
    spread: SpreadIn | None = None
    priority: int = Field(default=0, ge=-lim.PRIORITY_MAX, le=lim.PRIORITY_MAX)
    budget_usd_per_hour: float | None = Field(default=None, ge=0,
                                              le=lim.BUDGET_USD_PER_HOUR_MAX)
    spot_ok: bool = True
    env: Env = Field(default_factory=dict)
    command: list[EnvValue] = Field(default_factory=list, max_length=lim.ENV_MAX)

    _ms = field_validator("latency_slo_ms", "duration_s")(classmethod(_resolution(3)))
    _usd = field_validator("budget_usd_per_hour")(classmethod(_resolution(6)))
    _gb = field_validator("image_gb")(classmethod(_resolution(9)))


def check_not_an_id(name: str) -> str:
    """A name that looks like an id would make `/v1/workloads/{ref}` ambiguous."""
    if is_workload_id(name):
        raise ValueError("a name cannot look like a workload id ('w-' and 16 hex digits)")
    return name


class MetadataIn(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)
    name: Annotated[str, AfterValidator(check_not_an_id)] = Field(
        min_length=1, max_length=253, pattern=NAME_RE)
    labels: Labels = Field(default_factory=dict)


class WorkloadIn(_Model):
    """`apiVersion: skyfed.io/v1`, `kind: Workload`, `metadata`, `spec`."""

    api_version: Literal["skyfed.io/v1"]
    kind: Literal["Workload"]
    metadata: MetadataIn
    spec: WorkloadSpecIn

    def to_domain(self) -> WorkloadSpec:
        s, r = self.spec, self.spec.resources
        return WorkloadSpec(
            name=self.metadata.name, kind=s.kind, image=s.image, replicas=s.replicas,
            resources=Resources(r.cpu, r.memory, r.gpu), gpu_model=r.gpu_model,
            interconnect=r.interconnect, user_region=s.user_region,
            latency_slo_ms=s.latency_slo_ms,
            data=tuple(DataSource(d.size_gb, d.location, d.url, d.sha256) for d in s.data),
            image_gb=s.image_gb, duration_s=s.duration_s, affinity=dict(s.affinity),
            anti_affinity=dict(s.anti_affinity), avoid_workloads=tuple(s.avoid_workloads),
            tolerations=tuple(Toleration(t.key, t.operator, t.value, t.effect)
                              for t in s.tolerations),
            spread=None if s.spread is None else Spread(s.spread.topology, s.spread.min_domains,
                                                        s.spread.max_domains),
            priority=s.priority, budget_usd_per_hour=s.budget_usd_per_hour, spot_ok=s.spot_ok,
            labels=dict(self.metadata.labels), env=dict(s.env), command=tuple(s.command),
        )


class NodeIn(_Model):
    cpu: Cpu
    memory: MemoryGib
    gpu: Gpu = 0


class PoolIn(_Model):
    """A node pool. `node`, the price, GPU model and interconnect may be left out for a
    cloud pool: they are then taken from the catalog entry of `instanceType` in the
    cluster's provider and region (`skyfed catalog offers`)."""

    name: Short
    instance_type: str = Field(min_length=1, max_length=64, pattern=TEXT)
    node: NodeIn | None = None
    nodes: int = Field(default=0, ge=0, le=lim.NODES_MAX)
    max_nodes: int = Field(default=0, ge=0, le=lim.NODES_MAX)
    price_usd_per_hour: float | None = Field(default=None, ge=0,
                                             le=lim.PRICE_USD_PER_HOUR_MAX)
    pricing: PricingModel = PricingModel.ON_DEMAND
    gpu_model: str | None = Field(default=None, max_length=64, pattern=TEXT)
    interconnect: Interconnect = Interconnect.NONE
    reclaim_rate_per_hour: float = Field(default=0.0, ge=0, le=lim.RECLAIM_RATE_PER_HOUR_MAX)
    # Taints every node of the pool carries (`key=value:Effect`), e.g. a GPU node group's
    # `nvidia.com/gpu=true:NoSchedule`: the planner reads them before a node is observed.
    taints: list[Label] = Field(default_factory=list, max_length=64)

    _res = field_validator("price_usd_per_hour", "reclaim_rate_per_hour")(
        classmethod(_resolution(6)))

    def to_domain(self) -> Pool:
        if self.node is None or self.price_usd_per_hour is None:
            raise SpecError(f"pool {self.name!r} needs node and priceUsdPerHour (or an "
                            "instanceType the catalog knows)", loc=("body", "pools"))
        return Pool(name=self.name, instance_type=self.instance_type,
                    node=Resources(self.node.cpu, self.node.memory, self.node.gpu),
                    nodes=self.nodes, max_nodes=max(self.max_nodes, self.nodes),
                    price_usd_per_hour=self.price_usd_per_hour, pricing=self.pricing,
                    gpu_model=self.gpu_model, interconnect=self.interconnect,
                    reclaim_rate_per_hour=self.reclaim_rate_per_hour,
                    taints=tuple(self.taints))


class ClusterIn(_Model):
    """A member cluster: where it is, its node pools, labels/taints and quotas."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_RE)
    provider: Literal["aws", "gcp", "azure", "onprem", "edge"]
    region: str = Field(min_length=1, max_length=64, pattern=TEXT)
    account: str | None = Field(default=None, max_length=128, pattern=TEXT)
    zones: list[Short] = Field(default_factory=list, max_length=64)
    lat: float | None = Field(default=None, ge=-90, le=90)
    lon: float | None = Field(default=None, ge=-180, le=180)
    labels: Labels = Field(default_factory=dict)
    taints: list[Label] = Field(default_factory=list, max_length=64)
    quota_vcpu: float | None = Field(default=None, ge=0, le=lim.QUOTA_VCPU_MAX)
    quota_gpu: float | None = Field(default=None, ge=0, le=lim.QUOTA_GPU_MAX)
    pools: list[PoolIn] = Field(default_factory=list, max_length=1000)
    attrs: Attrs = None
    lend_to: LendTo = Field(default_factory=list)

    _quota = field_validator("quota_vcpu", "quota_gpu")(classmethod(_resolution(3)))

    def with_catalog(self, offer_of: Callable[[str, str, str], Offer]) -> ClusterIn:
        """Fill each pool's missing node size, price, GPU model and interconnect from
        `offer_of(provider, region, instance_type)` (raises SpecError naming the pool
        when the catalog does not know the type)."""
        pools = []
        for i, p in enumerate(self.pools):
            if p.node is not None and p.price_usd_per_hour is not None:
                pools.append(p)
                continue
            try:
                o = offer_of(self.provider, self.region, p.instance_type)
            except LookupError as e:
                raise SpecError(
                    f"pool {p.name!r}: {self.provider}:{self.region} has no instance type "
                    f"{p.instance_type!r} in the catalog; give node and priceUsdPerHour",
                    loc=("body", "pools", i, "instanceType")) from e
            spot = p.pricing == PricingModel.SPOT
            price = o.spot_price_usd_per_hour if spot else o.price_usd_per_hour
            if p.price_usd_per_hour is None and price is None:
                raise SpecError(f"pool {p.name!r}: the catalog has no "
                                f"{'spot ' if spot else ''}price for {p.instance_type!r}; "
                                "give priceUsdPerHour",
                                loc=("body", "pools", i, "priceUsdPerHour"))
            node = p.node or NodeIn(cpu=o.vcpu, memory=o.memory_gib, gpu=o.gpu_count)
            pools.append(p.model_copy(update={
                "node": node,
                "price_usd_per_hour": p.price_usd_per_hour if p.price_usd_per_hour is not None
                else price,
                "gpu_model": p.gpu_model or o.gpu_model,
                "interconnect": p.interconnect if p.interconnect != Interconnect.NONE
                else o.interconnect}))
        return self.model_copy(update={"pools": pools})

    def to_domain(self) -> Cluster:
        return Cluster(name=self.name, provider=self.provider, region=self.region,
                       pools=tuple(p.to_domain() for p in self.pools), zones=tuple(self.zones),
                       lat=self.lat, lon=self.lon, labels=dict(self.labels),
                       taints=tuple(self.taints), quota_vcpu=self.quota_vcpu,
                       quota_gpu=self.quota_gpu)


class SiteIn(_Model):
    """An edge site run by a `skyfed-edge` agent."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_RE)
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)
    capacity: NodeIn
    price_usd_per_hour: float = Field(default=0.0, ge=0, le=lim.PRICE_USD_PER_HOUR_MAX)
    gpu_model: str | None = Field(default=None, max_length=64, pattern=TEXT)
    interconnect: Interconnect = Interconnect.PCIE
    uplink_gbps: float = Field(default=1.0, ge=0.001, le=lim.UPLINK_GBPS_MAX)
    labels: Labels = Field(default_factory=dict)
    attrs: Attrs = None
    lend_to: LendTo = Field(default_factory=list)

    _res = field_validator("price_usd_per_hour", "uplink_gbps")(classmethod(_resolution(6)))

    def to_domain(self) -> Site:
        return Site(name=self.name, lat=self.lat, lon=self.lon,
                    capacity=Resources(self.capacity.cpu, self.capacity.memory,
                                       self.capacity.gpu),
                    price_usd_per_hour=self.price_usd_per_hour, gpu_model=self.gpu_model,
                    interconnect=self.interconnect, uplink_gbps=self.uplink_gbps,
                    labels=dict(self.labels))
