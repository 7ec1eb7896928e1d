"""Settings: one TOML file plus `SKYFED_<SECTION>__<KEY>` environment overrides.

Loaded once, in `broker/app.py` (`load_settings()`), and passed down as grouped
values; nothing reads settings at import time. Precedence, highest first:
explicit keyword arguments, environment variables, the TOML file, defaults.

The defaults run with nothing installed but the package: a SQLite file under
`data_dir`, an embedded MQTT broker, simulated member clusters.

Environment variables use a double underscore between section and key so keys
may contain single underscores: `SKYFED_STORE__URL`, `SKYFED_API__PORT`,
`SKYFED_PLACEMENT__SOLVER`. The single-underscore form from DESIGN.md
(`SKYFED_STORE_URL`) is accepted too for the documented top-level keys (see
`_legacy_env`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from broker.domain import LATENCY_WEIGHT_USD_PER_MS

DEFAULT_CONFIG = Path("config/skyfed.toml")


class StoreSettings(BaseModel):
    # Empty means: SQLite file `skyfed.db` under `data_dir`.
    url: str = ""
    echo: bool = False
    pool_size: int = Field(default=10, ge=1)


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    # How often a watch (`GET /v1/workloads?watch=true`) reads the event log for changes.
    watch_poll_s: float = Field(default=0.5, gt=0, le=60)
    # Printed once on first start when no admin token exists yet. Never logged.
    admin_token: SecretStr | None = None

    @field_validator("admin_token")
    @classmethod
    def _no_placeholder(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and v.get_secret_value() in {"changeme", "changethis", "secret", ""}:
            raise ValueError("admin_token must not be a placeholder value")
        return v


class MqttSettings(BaseModel):
    url: str = "mqtt://127.0.0.1:1883"
    # Run an in-process broker (amqtt) instead of connecting to `url`'s broker.
    embedded: bool = False
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False
    keepalive_s: int = Field(default=5, ge=1)


class UserRegionSettings(BaseModel):
    """A place users are, for latency SLOs: a workload's `userRegion` may name it.

    `probes`: the `host:port` probe points in that region that edge agents measure
    (`skyfed-edge run --probe host:port`); their RTTs count as RTTs to this region. Agents
    may instead name the region themselves (`--probe NAME=host:port`).
    """

    name: str = Field(min_length=1)
    lat: float = Field(ge=-90, le=90)
    lon: float = Field(ge=-180, le=180)
    probes: list[str] = Field(default_factory=list)


class PlacementSettings(BaseModel):
    solver: Literal["highs", "pulp-cbc", "pulp-glpk", "pulp-highs", "pulp-gurobi",
                    "pulp-cplex"] = "highs"
    epoch_s: float = Field(default=2.0, gt=0)
    # A submission wakes the placement loop; it then waits this long for more to batch with
    # it (the LP places a batch jointly) before it solves. 0: solve at once.
    batch_window_s: float = Field(default=0.05, ge=0, le=60)
    batch_max: int = Field(default=500, ge=1)
    k_candidates: int = Field(default=8, ge=1)
    mip_gap: float = Field(default=0.01, ge=0, le=1)
    time_limit_s: float = Field(default=5.0, gt=0)
    latency_weight_usd_per_ms: float = Field(default=LATENCY_WEIGHT_USD_PER_MS, ge=0)
    # The share of a node's vCPUs and memory the planner fills on CPU pools and fixed sites
    # (the allocation ratio); cloud GPU nodes are filled whole (feasibility.capacity_shares).
    headroom: float = Field(default=0.9, gt=0, le=1)
    unplaced_penalty_usd: float = Field(default=1000.0, gt=0)
    # Marginal cost of fixed (edge/on-prem) sites as a fraction of their amortised price; see
    # broker/placement/candidates.py SUNK_SITE_COST_FRACTION (the default). Budgets always
    # use the full price.
    site_cost_fraction: float = Field(default=0.1, ge=0, le=1)
    lp_file_dir: str | None = None  # write each model as an LP file (debugging)
    # Named user regions (`[[placement.user_regions]]`); besides these a workload's
    # userRegion may be a catalog region (`aws:eu-central-1`) or an edge site's name.
    user_regions: list[UserRegionSettings] = Field(default_factory=list)


class ReconcilerSettings(BaseModel):
    """How the reconciler watches the member clusters (broker/federation/reconciler.py)."""

    poll_s: float = Field(default=2.0, gt=0)  # full pass over every driver
    down_after: int = Field(default=3, ge=1)  # failed passes in a row -> unhealthy
    stuck_after_s: float = Field(default=300.0, gt=0)  # not-ready replicas -> re-placed


class ActuatorSettings(BaseModel):
    """How the actuator carries out scale, prewarm and migration decisions."""

    poll_s: float = Field(default=1.0, gt=0)  # re-check ordered nodes, prewarms, migrations
    retries: int = Field(default=3, ge=1)  # tenacity attempts per call, within one pass
    backoff_s: float = Field(default=0.5, gt=0)  # first wait between passes that failed
    max_attempts: int = Field(default=8, ge=1)  # failed passes before a decision fails
    order_timeout_s: float = Field(default=900.0, gt=0)  # ordered nodes must join by then
    ready_timeout_s: float = Field(default=600.0, gt=0)  # a migration target must be ready
    prewarm_timeout_s: float = Field(default=1800.0, gt=0)


class PolicySettings(BaseModel):
    # "none" (default): fixed weights, what `lp` does; "shipped" (or ""): the checkpoint in
    # the package; else a checkpoint's path. Why not the shipped one by default:
    # broker/federation/policy_runtime.py's docstring.
    checkpoint: str = "none"
    enabled: bool = True


class EdgeSettings(BaseModel):
    heartbeat_ms: int = Field(default=100, ge=10)
    suspect_after_ms: int = Field(default=300, ge=10)
    down_after_ms: int = Field(default=600, ge=10)
    rtt_target_ms: float = Field(default=50.0, gt=0)
    rebalance_hysteresis: float = Field(default=0.2, ge=0)


class SyncSettings(BaseModel):
    interval_s: float = Field(default=300.0, gt=0)
    stale_after_failures: int = Field(default=3, ge=1)
    accounts_file: str | None = None  # TOML with provider accounts (see docs/providers.md)


class TelemetrySettings(BaseModel):
    prometheus_url: str | None = None
    interval_s: float = Field(default=30.0, gt=0)
    queries: dict[str, str] = Field(default_factory=dict)


class SnapshotSettings(BaseModel):
    """How the live snapshot is sensed and how old a reading may be (docs/snapshot.md).

    A reading older than its `*_max_age_s` is still used (it is the newest knowledge) but
    marked stale in the cluster's provenance; a stale quota keeps only
    `1 - stale_quota_margin` of its limit.
    """

    # Driver inventory poll (`ClusterDriver.inventory()` of every member).
    inventory_interval_s: float = Field(default=2.0, gt=0, le=5.0)
    inventory_timeout_s: float = Field(default=5.0, gt=0, le=60.0)
    inventory_max_age_s: float = Field(default=30.0, gt=0)
    # Synced offers and quotas (the sync loop runs every `sync.interval_s`, 300 s by default).
    sync_max_age_s: float = Field(default=900.0, gt=0)
    stale_quota_margin: float = Field(default=0.5, ge=0, le=1)
    telemetry_max_age_s: float = Field(default=120.0, gt=0)
    # Agent-measured RTTs and hub health.
    rtt_max_age_s: float = Field(default=60.0, gt=0)
    hub_max_age_s: float = Field(default=60.0, gt=0)
    # Time constant of the per-pool demand EWMA (the twin's SimConfig.demand_tau_s).
    demand_tau_s: float = Field(default=900.0, gt=0)


class HaSettings(BaseModel):
    """Broker replicas on PostgreSQL (broker/federation/leader.py, docs/operations.md)."""

    retry_s: float = Field(default=0.5, gt=0, le=60)  # a candidate's lock tries
    check_s: float = Field(default=0.5, gt=0, le=60)  # the leader's session checks
    session_timeout_s: float = Field(default=2.0, gt=0, le=60)  # connect / check bound
    grace_s: float = Field(default=2.0, gt=0, le=60)  # loops' time to stop on step-down


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SKYFED_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    data_dir: Path = Path(".skyfed")
    log_level: str = "INFO"
    store: StoreSettings = Field(default_factory=StoreSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    actuator: ActuatorSettings = Field(default_factory=ActuatorSettings)
    reconciler: ReconcilerSettings = Field(default_factory=ReconcilerSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    edge: EdgeSettings = Field(default_factory=EdgeSettings)
    sync: SyncSettings = Field(default_factory=SyncSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    snapshot: SnapshotSettings = Field(default_factory=SnapshotSettings)
    ha: HaSettings = Field(default_factory=HaSettings)

    @property
    def store_url(self) -> str:
        """The SQLAlchemy async URL; the SQLite default lives under `data_dir`."""
        if self.store.url:
            return self.store.url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'skyfed.db').resolve()}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = os.environ.get("SKYFED_CONFIG", str(DEFAULT_CONFIG))
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=toml_file),
        )


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Load settings once. `config_file` wins over `$SKYFED_CONFIG`.

    Raises `FileNotFoundError` for an explicitly named file that does not
    exist (a missing default file is fine: defaults apply).
    """
    if config_file is not None:
        if not config_file.exists():
            raise FileNotFoundError(f"config file not found: {config_file}")
        os.environ["SKYFED_CONFIG"] = str(config_file)
    for key, value in _legacy_env().items():
        overrides.setdefault(key, value)
    return Settings(**overrides)


def _legacy_env() -> dict[str, Any]:
    """`SKYFED_STORE_URL`-style names (DESIGN.md) for the most used keys."""
    mapping = {"SKYFED_STORE_URL": ("store", "url"), "SKYFED_MQTT_URL": ("mqtt", "url")}
    out: dict[str, Any] = {}
    for env, (section, key) in mapping.items():
        if env in os.environ:
            out.setdefault(section, {})[key] = os.environ[env]
    return out
