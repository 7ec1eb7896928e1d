"""Composition root: settings -> store -> `Runtime` -> API + loops.

Apart from the one-shot operator commands (`skyfed db ...`, `token create`),
nothing else builds engines or reads settings. `serve(settings)` is what
`skyfed serve` runs: it checks the schema (refusing an unmigrated database
with the command to run), makes sure an admin token exists (printing a new
one once and writing it to `<data_dir>/token`, mode 600), runs the start-up
steps (`start_up`: drivers for the registered clusters, the placement policy),
builds every loop (`build_loops`), then runs uvicorn (one worker, in this event
loop) and the loops, each supervised, under one TaskGroup until SIGTERM/SIGINT.

The shared objects live in one typed `Runtime` (broker/federation/runtime.py),
not here: the API and the loop factories name its type, and nothing below this
module may import it. HOW TO ADD A LOOP: a `PollingLoop` subclass
(broker/federation/looping.py) whose constructor takes what it uses, a
`make_x(rt: Runtime) -> X | None` factory beside it, a field for it on
`Runtime` (and in `Runtime.loops()`), and one line in `build_loops` below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from broker.clock import Clock, SystemClock
from broker.errors import BrokerError
from broker.federation.looping import Loop, supervise
from broker.federation.runtime import Runtime
from broker.heap import serve_heap
from broker.settings import Settings, load_settings
from broker.store import Store
from broker.store.leadership import SqliteLock

log = logging.getLogger("skyfed")
TOKEN_FILE = "token"
SHUTDOWN_GRACE_S = 10.0  # how long loops get to finish after the stop event

__all__ = ["Runtime", "build_loops", "build_runtime", "create_app", "load_settings",
           "replica_loops", "serve", "start_up"]


def build_runtime(settings: Settings, *, clock: Clock | None = None) -> Runtime:
    """The store on `settings` and an otherwise empty Runtime (the caller closes the store)."""
    clock = clock or SystemClock()
    store = Store.from_url(settings.store_url, pool_size=settings.store.pool_size,
                           echo=settings.store.echo, clock=clock)
    return Runtime(settings=settings, store=store, clock=clock)


async def start_up(rt: Runtime) -> None:
    """What must exist before any loop is built: drivers for every registered cluster (so
    the loops that read `rt.drivers` see them) and the placement policy (`rt.policy`)."""
    from broker.federation.drivers import install_drivers
    from broker.federation.policy_runtime import install_policy

    await install_drivers(rt)
    await install_policy(rt)


def build_loops(rt: Runtime) -> list[Loop]:
    """Build every loop onto its `rt` field (None when off by settings); the ones to run.

    Imported here, not at module import, so `skyfed --help` stays fast and an import
    error names the loop's module.
    """
    from broker.federation.actuator import make_actuator
    from broker.federation.dispatcher import make_dispatcher
    from broker.federation.drivers import make_driver_refresh
    from broker.federation.edge_hub import make_edge_hub
    from broker.federation.inventory import make_inventory_poller
    from broker.federation.placement_loop import make_placement_loop
    from broker.federation.quota_sync import make_quota_sync
    from broker.federation.reconciler import make_reconciler
    from broker.federation.telemetry import make_telemetry

    rt.quota_sync = make_quota_sync(rt)
    rt.telemetry = make_telemetry(rt)
    rt.inventory = make_inventory_poller(rt)
    rt.placement_loop = make_placement_loop(rt)
    rt.dispatcher = make_dispatcher(rt)
    rt.actuator = make_actuator(rt)
    rt.reconciler = make_reconciler(rt)
    rt.driver_refresh = make_driver_refresh(rt)
    rt.edge_hub = make_edge_hub(rt)
    return rt.loops()


def create_app(rt: Runtime) -> FastAPI:
    """The FastAPI app over `rt` (which the caller owns and closes)."""
    from broker.api import explain, health, openapi, problems, routes, tenancy, ui
    from broker.api.deps import TokenCache
    from broker.api.middleware import ApiMetrics, EdgeMiddleware
    from broker.api.views import JsonResponse

    app = FastAPI(title="skyfed", version="0.1.0", default_response_class=JsonResponse,
                  description="Multi-cloud and edge federation broker API. See docs/api.md.")
    metrics = ApiMetrics()
    app.state.runtime = rt
    app.state.metrics = metrics
    app.state.token_cache = TokenCache()
    problems.install(app)
    app.include_router(health.router)
    app.include_router(routes.router)
    app.include_router(tenancy.router)
    app.include_router(explain.router)
    app.include_router(ui.router)
    app.add_middleware(EdgeMiddleware, max_body_bytes=rt.settings.api.max_body_bytes,
                       metrics=metrics,
                       fast_routes={("POST", "/v1/workloads"): routes.submit_workload})
    _add_schema_components(app)
    openapi.install(app)
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


async def ensure_admin_token(rt: Runtime) -> str | None:
    """Create the admin token on first start; return it (None if one exists).

    Uses `api.admin_token` when configured, else a random one. The token is
    written to `<data_dir>/token` (mode 600) so local `skyfed` commands find it.
    """
    from broker.errors import ConflictError

    try:
        async with rt.store.unit() as uow:
            if await uow.tokens.has_admin():
                return None
            configured = rt.settings.api.admin_token
            _, token = await uow.tokens.create(
                tenant="admin", is_admin=True, description="created on first start",
                token=configured.get_secret_value() if configured else None)
    except ConflictError:  # replicas starting together: another one stored it first
        return None
    write_token_file(rt.settings.data_dir, token)
    return token


def write_token_file(data_dir: Path, token: str) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return path


async def serve(settings: Settings, *, migrate: bool = False, api_only: bool = False,
                port: int | None = None) -> None:
    """Run the broker until SIGTERM/SIGINT. Raises `BrokerError` on a bad start."""
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sqlite_lock = SqliteLock.for_url(settings.store_url)
    if sqlite_lock is not None:
        sqlite_lock.acquire()  # a second broker on this file refuses to start (ConfigError)
    rt = build_runtime(settings)
    if sqlite_lock is None:  # PostgreSQL: replicas; the loops write only as the leader
        rt.fenced_store = rt.store.fenced(rt.fence)
    try:
        if migrate:
            from broker.store import migrate as migrations

            await migrations.upgrade(settings.store_url)
        await rt.store.check_schema()
        token = await ensure_admin_token(rt)
        if token is not None:
            print(f"admin token (shown once; also in {settings.data_dir / TOKEN_FILE}): "
                  f"{token}", flush=True)
        if not api_only:
            await start_up(rt)
        loops = [] if api_only else build_loops(rt)
        loops = replica_loops(rt, loops, port=settings.api.port if port is None else port)
        config = uvicorn.Config(create_app(rt), host=settings.api.host,
                                port=settings.api.port if port is None else port,
                                workers=1, log_level="warning", access_log=False,
                                lifespan="off", loop="none", http=_http_impl())
        server = _Server(config)
        serve_heap()  # broker/heap.py
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
        await rt.store.close()
        if sqlite_lock is not None:
            sqlite_lock.release()


def replica_loops(rt: Runtime, loops: list[Loop], *, port: int | None = None) -> list[Loop]:
    """What this replica runs: on SQLite (one broker) `loops` themselves; on PostgreSQL the
    leader elector over `loops` plus the wake notifier (broker/federation/leader.py), so
    the loops run in one replica while every replica serves the API."""
    if rt.fenced_store is None:
        return loops
    from broker.federation.leader import make_leadership

    elector, notifier = make_leadership(rt, loops, port=port)
    # `--api-only` builds no loops: it must not campaign (a leader without loops would
    # hold the lock while nothing places); it only wakes the leader
    return [elector, notifier] if loops else [notifier]


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
