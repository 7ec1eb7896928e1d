"""The broker's background loops, and how they are found.

`broker/app.py` calls every factory in `LOOP_FACTORIES` with the `Services`
once, at start; each returns a `Loop` (or None to stay off, e.g. when its
settings disable it). Every loop runs supervised: if `run` raises, the error
is logged and the loop restarted with exponential backoff; it never takes the
API down. `run` must return promptly once `stop` is set.

HOW TO ADD A LOOP: in your own module write

    def make_my_loop(services: Services) -> Loop | None:
        return MyLoop(services.store, services.clock, ...)

and append ONE line below: `LOOP_FACTORIES.append(_lazy("broker.federation.mine",
"make_my_loop"))`. `_lazy` imports your module only when the broker starts, so
`skyfed --help` stays fast and an import error names your module.

`STARTUP_HOOKS` are awaited once before the loops start (e.g. to fill
`services.drivers` / `services.providers` from config); add them the same way.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from broker.app import Services


@runtime_checkable
class Loop(Protocol):
    name: str

    async def run(self, stop: asyncio.Event) -> None: ...


LoopFactory = Callable[["Services"], "Loop | None"]
StartupHook = Callable[["Services"], Awaitable[None]]


def _lazy(module: str, attr: str) -> Any:
    """A factory/hook that imports `module.attr` on first call."""

    def call(services: Services) -> Any:
        return getattr(importlib.import_module(module), attr)(services)

    call.__name__ = f"{module}.{attr}"
    return call


LOOP_FACTORIES: list[LoopFactory] = [
    # Append one line per loop, e.g.:
    _lazy("broker.federation.quota_sync", "make_quota_sync"),
    _lazy("broker.federation.telemetry", "make_telemetry"),
    _lazy("broker.federation.placement_loop", "make_placement_loop"),
    _lazy("broker.federation.dispatcher", "make_dispatcher"),
    _lazy("broker.federation.reconciler", "make_reconciler"),
    _lazy("broker.federation.drivers", "make_driver_refresh"),
    _lazy("broker.federation.edge_hub", "make_edge_hub"),
]

STARTUP_HOOKS: list[StartupHook] = [
    _lazy("broker.federation.drivers", "install_drivers"),
    _lazy("broker.federation.policy_runtime", "install_policy"),
]
