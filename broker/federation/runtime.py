"""`Runtime`: every object the API and the loops share, one typed field each.

Built once by the composition root (`broker.app.build_runtime`), filled in by its start-up
steps (`broker.app.start_up`: drivers, policy) and loop builder (`broker.app.build_loops`),
then handed to the API (`app.state.runtime`, read through `broker.api.deps.RuntimeDep`).

Why here and not in `broker.app`: the loop factories (`make_dispatcher(rt)`, ...) and the
API must name this type, and nothing below `broker.app` may import it (the `layers`
contract in `.importlinter`). Loops themselves never take a `Runtime`: their constructors
take exactly what they use (`Dispatcher(store, drivers, clock)`); the `make_*(rt)`
factories beside them pick those out.

A field is None until the step that builds it ran, or when its part is off (no accounts
file: no quota sync; `--api-only`: no loops). Adding a shared object means adding a field
here, documented, not a string key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.clock import Clock
from broker.settings import Settings
from broker.store import Store
from broker.store.leadership import Fence
from providers.base import CloudProvider, ClusterDriver

if TYPE_CHECKING:
    from broker.federation.actuator import Actuator
    from broker.federation.dispatcher import Dispatcher
    from broker.federation.drivers import DriverRefreshLoop, DriverRegistry
    from broker.federation.edge_hub import EdgeHub
    from broker.federation.inventory import InventoryPoller
    from broker.federation.leader import LeaderElector, WakeNotifier
    from broker.federation.looping import Loop
    from broker.federation.placement_loop import PlacementLoop
    from broker.federation.policy_runtime import PolicyRuntime
    from broker.federation.quota_sync import QuotaSync
    from broker.federation.reconciler import Reconciler
    from broker.federation.telemetry import TelemetryLoop
    from providers.catalog import Catalog

DEFAULT_DRIVERS_REFRESH_S = 5.0


@dataclass(eq=False)
class Runtime:
    """See the module docstring. Loops in `loops()` order are the order they start in."""

    settings: Settings
    store: Store
    clock: Clock
    # cluster/site name -> driver: what the driver registry built (it mirrors into this
    # dict) plus drivers someone else installed under a name (the demo's simulated ones,
    # which win). The dispatcher, reconciler and telemetry hold this very dict.
    drivers: dict[str, ClusterDriver] = field(default_factory=dict)
    # the offline instance/price/region catalog; None until `offline_catalog()` loads it
    catalog: Catalog | None = None
    # the placement policy (a trained checkpoint or fixed weights); set by `install_policy`.
    # None: the placement loop steers with the fixed weights of `settings.placement`.
    policy: PolicyRuntime | None = None
    # registered clusters -> drivers; set by `install_drivers` / `registry_of`
    driver_registry: DriverRegistry | None = None
    drivers_refresh_s: float = DEFAULT_DRIVERS_REFRESH_S  # driver registry refresh interval
    # provider accounts by name (`[sync] accounts_file`), filled by `make_quota_sync`: quota
    # sync reads them, the actuator scales declared node groups through them
    accounts: dict[str, CloudProvider] = field(default_factory=dict)
    # the loops, set by `broker.app.build_loops` (None: not built, or off by settings)
    quota_sync: QuotaSync | None = None
    telemetry: TelemetryLoop | None = None  # `.latest`: the newest values per cluster
    inventory: InventoryPoller | None = None  # every driver's nodes into the store
    placement_loop: PlacementLoop | None = None  # `.wake()` solves now
    dispatcher: Dispatcher | None = None
    actuator: Actuator | None = None  # carries out scale, prewarm, migration decisions
    reconciler: Reconciler | None = None
    driver_refresh: DriverRefreshLoop | None = None
    edge_hub: EdgeHub | None = None  # also the EdgeTransport of every edge site's driver
    # Replicas (broker/federation/leader.py). On PostgreSQL `serve` sets `fenced_store` to
    # `store.fenced(fence)`: the loops write through it, so only the elected leader's units
    # commit. None (SQLite, the demo, tests): the loops use `store` itself.
    fence: Fence = field(default_factory=Fence)
    fenced_store: Store | None = None
    leader: LeaderElector | None = None  # runs `loops()` while this replica leads
    waker: WakeNotifier | None = None  # NOTIFYs the leader after a submission

    def loop_store(self) -> Store:
        """The store the loops write through (see `fenced_store`)."""
        return self.store if self.fenced_store is None else self.fenced_store

    def wake_placement(self) -> None:
        """A workload was submitted or a member registered: wake the placement loop,
        here or in the leader."""
        if self.placement_loop is not None:
            self.placement_loop.wake()
        if self.waker is not None and not (self.leader is not None and self.leader.leading):
            self.waker.poke()

    def offline_catalog(self) -> Catalog:
        """The offline catalog, loaded on first use and kept in `catalog`.

        Raises `providers.errors.ProviderError` when the package ships none.
        """
        if self.catalog is None:
            from providers.catalog import Catalog

            self.catalog = Catalog.load()
        return self.catalog

    def loops(self) -> list[Loop]:
        """The loops that were built, in start order."""
        built = (self.quota_sync, self.telemetry, self.inventory, self.placement_loop,
                 self.dispatcher, self.actuator, self.reconciler, self.driver_refresh,
                 self.edge_hub)
        return [lp for lp in built if lp is not None]
