"""Registered clusters -> live ClusterDrivers: the registry the dispatcher applies through.

Why: `POST /v1/clusters` only writes a row. Something has to turn it into a driver the
dispatcher, reconciler and telemetry can call, follow registrations made, changed or deleted
while the broker runs, and keep one bad registration from taking the others down.
`DriverRegistry` is that (a read-only `Mapping[str, ClusterDriver]`), `DriverRefreshLoop`
refreshes it on an interval. docs/clusters.md has the API bodies and every attr.

Which kind of driver a registration gets, and with which options, is parsed and validated in
driver_targets.py (`target_for`). Edge drivers reach their site through the edge hub, looked
up per call (start-up order).

Lifecycle: built the first time a refresh sees a registration (never at import; the kubernetes
SDK only when a kubernetes cluster exists), reused while its fingerprint (kind, options, pool
shapes; not usage or telemetry) is unchanged, closed when it changes or the cluster goes. A
registration that cannot be built is logged once per distinct error with the cluster's name,
gets no driver, and its row is marked unhealthy with `attrs.driver_error`; it is retried every
refresh (fixing a kubeconfig on disk is enough) and the mark lifted when it builds.

`mirror` (the broker's `Runtime.drivers` dict): the registry writes what it builds there and
removes it again, never touching an entry it did not put there: a driver someone else
installed under a cluster's name (the demo's) wins and the registry builds none for it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.clock import Clock, SystemClock
from broker.errors import BrokerError
from broker.federation.driver_targets import (
    TRUSTED_TENANTS,
    DriverConfigError,
    DriverTarget,
    target_for,
)
from broker.federation.looping import PollingLoop
from providers.base import ClusterDriver
from providers.catalog import Catalog
from providers.errors import TransientError
from providers.simulated import FailureInjection, SimulatedClusterDriver

if TYPE_CHECKING:
    from broker.federation.runtime import Runtime
    from broker.store import ClusterRecord, SiteRecord, Store

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 5.0
SITE_ONLY = "_site_only"  # marks a registration made from a site row (not a cluster row)

EdgeFactory = Callable[["DriverTarget"], ClusterDriver]
Closer = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RefreshResult:
    """What one refresh changed (cluster names), for logs and tests."""

    added: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)  # name -> error
    foreign: tuple[str, ...] = ()  # a driver someone else installed is kept


@dataclass(slots=True)
class _Entry:
    target: DriverTarget
    driver: ClusterDriver
    close: Closer


def site_records(sites: Sequence[SiteRecord], clusters: set[str]) -> list[ClusterRecord]:
    """Edge sites registered once (`POST /v1/sites`, no cluster of the same name) as the
    registrations the registry builds edge drivers from."""
    from broker.placement.snapshot import site_cluster
    from broker.store import ClusterRecord

    return [ClusterRecord(cluster=site_cluster(s.site), tenant=s.tenant,
                          attrs={"driver": "edge", SITE_ONLY: True}, updated_s=s.updated_s)
            for s in sites if s.site.name not in clusters]


# ---- target -> driver ------------------------------------------------------------------
class EdgeDriverFactory:
    """Builds `providers.edge.EdgeSiteDriver`s that reach their site through the edge hub.

    `hub` is asked for the hub (an `EdgeTransport`: `send_command`, `site_services`) on every
    call, not at build time: the hub is a loop built after the drivers, and may restart. While
    there is none, commands fail as TransientError (retried, then counted by the dispatcher)
    and the site reads as "not heard yet".
    """

    def __init__(self, hub: Callable[[], Any] = lambda: None) -> None:
        self._hub = hub

    def __call__(self, target: DriverTarget) -> ClusterDriver:
        from providers.edge import EdgeSiteDriver

        site = str(target.options.get("site", target.name))
        cpu = sum(p.cpu_per_node * p.nodes for p in target.pools)
        mem = sum(p.memory_gib_per_node * p.nodes for p in target.pools)
        gpu = sum(p.gpu_per_node * p.nodes for p in target.pools)
        driver: ClusterDriver = EdgeSiteDriver(
            site=site, transport=_HubTransport(self._hub), cpu=cpu, memory_gib=mem, gpu=gpu,
            command_timeout_s=float(target.options.get("command_timeout_s", 5.0)))
        return driver


class _HubTransport:
    """`providers.edge.EdgeTransport` over whatever hub `lookup` returns right now."""

    def __init__(self, lookup: Callable[[], Any]) -> None:
        self._lookup = lookup

    def _hub(self) -> Any:
        hub = self._lookup()
        return hub if hub is not None and hasattr(hub, "send_command") else None

    async def send_command(self, *, site: str, kind: str,
                           service: Mapping[str, Any] | None = None, service_name: str = "",
                           standby: bool = False, timeout_s: float = 5.0,
                           data: Sequence[Mapping[str, Any]] = (),
                           images: Sequence[str] = ()) -> Mapping[str, Any]:
        hub = self._hub()
        if hub is None:
            raise TransientError(f"cannot send {kind!r} to site {site!r}: no edge hub (MQTT "
                                 "session) runs in this broker", provider="edge", region=site)
        ack: Mapping[str, Any] = await hub.send_command(
            site=site, kind=kind, service=service, service_name=service_name, standby=standby,
            timeout_s=timeout_s, data=data, images=images)
        return ack

    def site_services(self, *, site: str) -> Mapping[str, str] | None:
        hub = self._hub()
        states: Mapping[str, str] | None = None if hub is None else hub.site_services(site=site)
        return states


async def _close_generic(driver: object) -> None:
    """Close a driver that offers `aclose()` or `close()`; drivers without either need none."""
    for attr in ("aclose", "close"):
        fn = getattr(driver, attr, None)
        if callable(fn):
            result = fn()
            if inspect.isawaitable(result):
                await result
            return


async def _noop() -> None:
    return None


class DriverRegistry(Mapping[str, ClusterDriver]):
    """Cluster name -> live ClusterDriver, built from the store's registrations (module doc)."""

    def __init__(self, *, clock: Clock | None = None,
                 catalog: Callable[[], Catalog] = Catalog.load,
                 mirror: MutableMapping[str, ClusterDriver] | None = None,
                 trusted_tenants: frozenset[str] | None = TRUSTED_TENANTS,
                 edge_factory: EdgeFactory | None = None) -> None:
        self._clock = clock or SystemClock()
        self._catalog = catalog
        self._mirror = mirror
        self._trusted = trusted_tenants
        self._edge_factory = edge_factory or EdgeDriverFactory()
        self._entries: dict[str, _Entry] = {}
        self._errors: dict[str, str] = {}
        # Cluster name -> what the last refresh made of its registration (`_key`).
        self._applied: dict[str, str] = {}
        self._closed = False  # aclose() ran: behind() asks for no more drivers
        self._lock = asyncio.Lock()
        self.refreshes = 0

    # ---- Mapping ----------------------------------------------------------------------
    def __getitem__(self, name: str) -> ClusterDriver:
        return self._entries[name].driver

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        kinds = {n: e.target.kind for n, e in sorted(self._entries.items())}
        return f"DriverRegistry({kinds}, errors={sorted(self._errors)})"

    @property
    def errors(self) -> Mapping[str, str]:
        """Cluster name -> why it has no driver, as of the last refresh."""
        return dict(self._errors)

    def kind_of(self, name: str) -> str:
        return self._entries[name].target.kind

    def behind(self, records: Sequence[ClusterRecord]) -> bool:
        """Whether some registration in `records` is not what the last refresh applied: a
        cluster registered, or its driver's registration changed, since then.

        The placement loop asks before it plans on `records` and refreshes when True: a pool
        whose cluster has no driver yet looks unable to scale (scaling.py), so planning
        between a registration and the refresh loop's next pass ordered no nodes there.
        A registration that cannot be built is not behind once a refresh recorded its error;
        nothing is once the registry was closed (a placement epoch during shutdown must not
        build drivers nobody closes).
        """
        return not self._closed and any(not self._is_foreign(r.cluster.name)
                   and self._applied.get(r.cluster.name) != self._key(r) for r in records)

    def _target(self, rec: ClusterRecord) -> DriverTarget:
        return target_for(rec, catalog=self._catalog, trusted_tenants=self._trusted)

    def _key(self, rec: ClusterRecord) -> str:
        """The registration as the registry builds from it: its target's fingerprint, or
        why it has no target."""
        try:
            return self._target(rec).fingerprint
        except Exception as exc:  # noqa: BLE001  as _apply: any error means "no target"
            return f"error: {_describe(rec.cluster.name, exc)}"

    # ---- refresh ----------------------------------------------------------------------
    async def refresh(self, store: Store) -> RefreshResult:
        """Bring the drivers in line with the store's clusters; see the module docstring.

        Store errors propagate (the loop logs them and tries again); a registration that
        cannot be built never does: it is recorded in `errors` and its cluster marked unhealthy.
        """
        async with self._lock:
            async with store.unit() as uow:
                records = await uow.clusters.list_records()
                sites = await uow.sites.list_records()
            records = [*records, *site_records(sites, {r.cluster.name for r in records})]
            result = await self._apply(records)
            await self._record_health(store, [r for r in records if not r.attrs.get(SITE_ONLY)],
                                      result.failed)
            self.refreshes += 1
            return result

    async def _apply(self, records: Sequence[ClusterRecord]) -> RefreshResult:
        added: list[str] = []
        replaced: list[str] = []
        failed: dict[str, str] = {}
        foreign: list[str] = []
        seen = set()
        applied: dict[str, str] = {}
        for rec in records:
            name = rec.cluster.name
            seen.add(name)
            applied[name] = self._key(rec)
            if self._is_foreign(name):
                foreign.append(name)
                await self._drop(name)
                continue
            try:
                target = self._target(rec)
                old = self._entries.get(name)
                if old is not None and old.target.fingerprint == target.fingerprint:
                    if self._mirror is not None and name not in self._mirror:
                        self._mirror[name] = old.driver  # someone deleted it: put it back
                    continue
                driver, close = await self._build(target)
            except Exception as exc:  # noqa: BLE001  one bad registration must not stop the rest
                failed[name] = _describe(name, exc)
                await self._drop(name)
                continue
            (replaced if name in self._entries else added).append(name)
            await self._drop(name)
            self._entries[name] = _Entry(target=target, driver=driver, close=close)
            if self._mirror is not None:
                self._mirror[name] = driver
            log.info("driver for cluster %r: %s%s", name, target.kind,
                     " (replaced)" if name in replaced else "")
        removed = [n for n in list(self._entries) if n not in seen]
        for name in removed:
            await self._drop(name)
            log.info("cluster %r is gone: its driver is closed", name)
        for name, msg in failed.items():
            if self._errors.get(name) != msg:
                log.warning("no driver for %s", msg)
        self._errors = failed
        self._applied = applied
        return RefreshResult(added=tuple(added), replaced=tuple(replaced),
                             removed=tuple(removed), failed=dict(failed), foreign=tuple(foreign))

    def _is_foreign(self, name: str) -> bool:
        """True when the mirror holds a driver under `name` that this registry did not put."""
        if self._mirror is None or name not in self._mirror:
            return False
        mine = self._entries.get(name)
        return mine is None or self._mirror[name] is not mine.driver

    async def _build(self, target: DriverTarget) -> tuple[ClusterDriver, Closer]:
        if target.kind == "simulated":
            driver = SimulatedClusterDriver(
                target.name, target.pools, seed=int(target.options["seed"]),
                clock=self._clock.now, startup_s=float(target.options["startup_s"]),
                boot_s=float(target.options.get("boot_s", 0.0)),
                prewarm_s=float(target.options.get("prewarm_s", 0.0)),
                failures=_failures(float(target.options.get("error_rate", 0.0))))
            return driver, _noop
        if target.kind == "kubernetes":
            return await self._build_kubernetes(target)
        edge = self._edge_factory(target)
        return edge, lambda: _close_generic(edge)

    async def _build_kubernetes(self, target: DriverTarget) -> tuple[ClusterDriver, Closer]:
        from providers.kubernetes import KubernetesDriver, KubernetesOptions, load_api_client

        opts = KubernetesOptions(**target.options)
        # kubeconfig parsing (and the first import of the SDK, ~1 s) is blocking: off the loop
        api = await asyncio.to_thread(load_api_client, opts)
        driver = KubernetesDriver(target.name, opts, api_client=api)

        async def close() -> None:
            await asyncio.to_thread(api.close)

        return driver, close

    async def _drop(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        if self._mirror is not None and self._mirror.get(name) is entry.driver:
            del self._mirror[name]
        try:
            await entry.close()
        except Exception:  # a failed close must not keep the registry stale; logged
            log.exception("closing the driver of cluster %r failed", name)

    async def _record_health(self, store: Store, records: Sequence[ClusterRecord],
                             failed: Mapping[str, str]) -> None:
        """Mark clusters without a driver unhealthy (with why); lift marks this registry set."""
        changes: list[tuple[str, str | None]] = []
        for rec in records:
            name, had = rec.cluster.name, rec.attrs.get("driver_error")
            if name in failed and (had != failed[name] or rec.cluster.healthy):
                changes.append((name, failed[name]))
            elif name not in failed and had:
                changes.append((name, None))
        if not changes:
            return
        async with store.unit() as uow:
            for name, msg in changes:
                await uow.clusters.set_attrs(name, {"driver_error": msg})
                await uow.clusters.set_health(name, healthy=msg is None,
                                              reason=msg or "driver built")

    async def aclose(self) -> None:
        """Close every driver this registry built and take them out of the mirror."""
        async with self._lock:
            for name in list(self._entries):
                await self._drop(name)
            self._closed = True


def _describe(name: str, exc: BaseException) -> str:
    if isinstance(exc, DriverConfigError):
        return str(exc.message)
    text = exc.message if isinstance(exc, BrokerError) else str(exc)
    return f"cluster {name!r}: {type(exc).__name__}: {text}"


class DriverRefreshLoop(PollingLoop):
    """Refreshes a DriverRegistry every `interval_s`, so clusters registered later get drivers.

    With `close_on_stop` the registry is closed when the loop ends because `stop` was set.
    """

    name = "drivers"

    def __init__(self, registry: DriverRegistry, store: Store, clock: Clock, *,
                 interval_s: float = DEFAULT_REFRESH_S, close_on_stop: bool = False) -> None:
        super().__init__(clock, interval_s=interval_s)
        self.registry = registry
        self._store = store
        self._close_on_stop = close_on_stop

    async def step(self) -> RefreshResult | None:
        try:
            return await self.registry.refresh(self._store)
        except BrokerError as exc:  # the store is down: keep the drivers, try again
            log.warning("refreshing cluster drivers failed: %s", exc.message)
            return None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await super().run(stop)
        finally:
            if self._close_on_stop and stop.is_set():
                await self.registry.aclose()


# ---- wiring (broker/app.py) ------------------------------------------------------------
def registry_of(rt: Runtime) -> DriverRegistry:
    """The broker's DriverRegistry (`rt.driver_registry`), created on first use.

    It mirrors into `rt.drivers`, so code holding that dict sees its drivers too; its edge
    drivers reach their sites through `rt.edge_hub`, looked up per command.
    """
    if rt.driver_registry is None:
        rt.driver_registry = DriverRegistry(
            clock=rt.clock, mirror=rt.drivers, edge_factory=EdgeDriverFactory(lambda: rt.edge_hub))
    return rt.driver_registry


async def install_drivers(rt: Runtime) -> None:
    """Start-up step: drivers for every registered cluster before any loop is built."""
    await registry_of(rt).refresh(rt.store)


def make_driver_refresh(rt: Runtime) -> DriverRefreshLoop:
    """Keeps the registry in step with the store every `rt.drivers_refresh_s`; closes it on
    stop."""
    return DriverRefreshLoop(registry_of(rt), rt.loop_store(), rt.clock,
                             interval_s=rt.drivers_refresh_s, close_on_stop=True)


def _failures(error_rate: float) -> FailureInjection:
    """Injected provider faults of a simulated cluster (`attrs.simulated.error_rate`): of
    the failing calls a third time out (hang 1 s, then fail), a third are 429s, a third 5xx."""
    return FailureInjection(apply_error_rate=error_rate, delete_error_rate=error_rate,
                            status_error_rate=error_rate, timeout_share=1 / 3,
                            throttle_share=0.5, timeout_s=1.0)
