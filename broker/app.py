"""Composition root: settings -> engine/store -> services -> API + loops.

Apart from the one-shot operator commands (`skyfed db ...`, `token create`),
nothing else builds engines or reads settings. `serve(settings)` is what
`skyfed serve` runs: it checks the schema (refusing an unmigrated database
with the command to run), makes sure an admin token exists (printing a new
one once and writing it to `<data_dir>/token`, mode 600), then runs uvicorn
(one worker, in this event loop) and every loop from
`broker.federation.registry` under one TaskGroup until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from broker.clock import Clock, SystemClock
from broker.errors import BrokerError
from broker.federation.registry import LOOP_FACTORIES, STARTUP_HOOKS, Loop
from broker.settings import Settings, load_settings
from broker.store import Store
from providers.base import CloudProvider, ClusterDriver

log = logging.getLogger("skyfed")
TOKEN_FILE = "token"
BACKOFF_MAX_S = 30.0
SHUTDOWN_GRACE_S = 10.0  # how long loops get to finish after the stop event

__all__ = ["Services", "build_services", "create_app", "load_settings", "serve"]


@dataclass
class Services:
    """Everything the API and the loops share, built once by `build_services`."""

    settings: Settings
    store: Store
    clock: Clock
    drivers: dict[str, ClusterDriver] = field(default_factory=dict)  # by cluster/site name
    providers: dict[str, CloudProvider] = field(default_factory=dict)  # by account name
    extras: dict[str, Any] = field(default_factory=dict)  # shared objects loops hand around


def build_services(settings: Settings, *, clock: Clock | None = None) -> Services:
    clock = clock or SystemClock()
    store = Store.from_url(settings.store_url, pool_size=settings.store.pool_size,
                           echo=settings.store.echo, clock=clock)
    return Services(settings=settings, store=store, clock=clock)


def create_app(services: Services) -> FastAPI:
    """The FastAPI app over `services` (which the caller owns and closes)."""
    from broker.api import explain, health, problems, routes, ui
    from broker.api.deps import TokenCache
    from broker.api.middleware import ApiMetrics, EdgeMiddleware
    from broker.api.views import JsonResponse

    app = FastAPI(title="skyfed", version="0.1.0", default_response_class=JsonResponse,
                  description="Multi-cloud and edge federation broker API. See docs/api.md.")
    metrics = ApiMetrics()
    app.state.services = services
    app.state.metrics = metrics
    app.state.token_cache = TokenCache()
    problems.install(app)
    app.include_router(health.router)
    app.include_router(routes.router)
    app.include_router(explain.router)
    app.include_router(ui.router)
    app.add_middleware(EdgeMiddleware, max_body_bytes=services.settings.api.max_body_bytes,
                       metrics=metrics,
                       fast_routes={("POST", "/v1/workloads"): routes.submit_workload})
    _add_schema_components(app)
    return app


def _add_schema_components(app: FastAPI) -> None:
    """Put the raw-body request schema (`WorkloadIn`) into /openapi.json."""
    from broker.api.schemas import WorkloadIn

    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        extra = WorkloadIn.model_json_schema(ref_template="#/components/schemas/{model}",
                                             by_alias=True)
        comps.update(extra.pop("$defs", {}))
        comps["WorkloadIn"] = extra
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


async def ensure_admin_token(services: Services) -> str | None:
    """Create the admin token on first start; return it (None if one exists).

    Uses `api.admin_token` when configured, else a random one. The token is
    written to `<data_dir>/token` (mode 600) so local `skyfed` commands find it.
    """
    async with services.store.unit() as uow:
        if await uow.tokens.has_admin():
            return None
        configured = services.settings.api.admin_token
        _, token = await uow.tokens.create(
            tenant="admin", is_admin=True, description="created on first start",
            token=configured.get_secret_value() if configured else None)
    write_token_file(services.settings.data_dir, token)
    return token


def write_token_file(data_dir: Path, token: str) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return path


async def supervise(loop: Loop, stop: asyncio.Event, *, initial_backoff_s: float = 1.0,
                    max_backoff_s: float = BACKOFF_MAX_S) -> None:
    """Run `loop` until `stop`; log and restart it with backoff when it crashes.

    The backoff doubles per crash up to `max_backoff_s` and waits on `stop`, so
    shutdown is never delayed by a sleeping supervisor.
    """
    backoff_s = initial_backoff_s
    while not stop.is_set():
        try:
            await loop.run(stop)
            if stop.is_set():
                return
            log.warning("loop %s returned before stop; restarting", loop.name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop %s crashed; restarting in %.0f s", loop.name, backoff_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=backoff_s)
        backoff_s = min(backoff_s * 2, max_backoff_s)


def build_loops(services: Services) -> list[Loop]:
    loops = []
    for factory in LOOP_FACTORIES:
        made = factory(services)
        if made is not None:
            loops.append(made)
    return loops


async def serve(settings: Settings, *, migrate: bool = False, api_only: bool = False,
                port: int | None = None) -> None:
    """Run the broker until SIGTERM/SIGINT. Raises `BrokerError` on a bad start."""
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    services = build_services(settings)
    try:
        if migrate:
            from broker.store import migrate as migrations

            await migrations.upgrade(settings.store_url)
        await services.store.check_schema()
        token = await ensure_admin_token(services)
        if token is not None:
            print(f"admin token (shown once; also in {settings.data_dir / TOKEN_FILE}): "
                  f"{token}", flush=True)
        if not api_only:
            for hook in STARTUP_HOOKS:
                await hook(services)
        loops = [] if api_only else build_loops(services)
        config = uvicorn.Config(create_app(services), host=settings.api.host,
                                port=settings.api.port if port is None else port,
                                workers=1, log_level="warning", access_log=False,
                                lifespan="off", loop="none", http=_http_impl())
        server = _Server(config)
        _tune_gc()
        stop = asyncio.Event()
        with _signals(server, stop):
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(supervise(lp, stop), name=f"loop:{lp.name}")
                         for lp in loops]
                await server.serve()
                stop.set()
                if tasks:
                    _, late = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
                    for task in late:
                        log.warning("%s ignored stop for %.0f s; cancelling it",
                                    task.get_name(), SHUTDOWN_GRACE_S)
                        task.cancel()
    finally:
        await services.store.close()


def _tune_gc() -> None:
    """Fewer, cheaper collections: the long-lived start-up objects (modules,
    the app, pydantic schemas) are moved out of the collector's view, and the
    young generation is collected less often. Cuts GC pauses from the API's
    tail latency; request garbage is short-lived and freed by refcounting."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 20_000), gen1, gen2)


def _http_impl() -> str:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


class _Server(uvicorn.Server):
    """uvicorn.Server without its own signal handling (we own SIGTERM/SIGINT)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.contextmanager
def _signals(server: Any, stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        log.info("shutting down")
        server.should_exit = True
        stop.set()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_serve(settings: Settings, **kwargs: Any) -> int:
    """Blocking entry for the CLI: uvloop when installed; returns an exit code."""
    runner: Any = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    try:
        runner(serve(settings, **kwargs))
    except BrokerError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    return 0
