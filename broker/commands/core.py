"""Core commands: serve, db, submit, get, describe, cancel (tokens, budgets: tenancy.py).

Client commands (submit/get/describe/cancel) talk HTTP to a running broker:
server from `--server` / `$SKYFED_SERVER` / the config's api host:port; token
from `--token` / `$SKYFED_TOKEN` / `<data_dir>/token` (written by the first
`skyfed serve`). Operator commands (`db ...`, `token ...`) talk to the
database named by the config directly, so they work with the broker stopped.

Errors print ONE line on stderr and exit 1.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from broker.api.client import BrokerClient
    from broker.settings import Settings

T = TypeVar("T")
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]
ServerOpt = Annotated[str | None, typer.Option("--server", envvar="SKYFED_SERVER",
                                               help="Broker URL (default from config).")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="SKYFED_TOKEN",
                                              help="API token (default: <data_dir>/token).")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="table | json | yaml")]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Store URL (default from config).")]

db_app = typer.Typer(no_args_is_help=True, help="Database schema migrations.")


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _settings(config: Path | None) -> Settings:
    from pydantic import ValidationError

    from broker.settings import load_settings

    try:
        return load_settings(config)
    except (FileNotFoundError, ValidationError) as e:
        raise fail(f"bad configuration: {str(e).splitlines()[0]}") from e


def _run(fn: Callable[[], T]) -> T:
    """Run `fn`, turning every broker/client error into one line and exit 1."""
    from broker.api.client import ClientError
    from broker.errors import BrokerError

    try:
        return fn()
    except ClientError as e:
        raise fail(str(e)) from e
    except BrokerError as e:
        raise fail(e.message) from e


def _client(config: Path | None, server: str | None, token: str | None) -> BrokerClient:
    from broker.api.client import BrokerClient

    if server is None or token is None:
        s = _settings(config)
        if server is None:
            host = "127.0.0.1" if s.api.host in ("0.0.0.0", "::", "") else s.api.host
            server = f"http://{host}:{s.api.port}"
        if token is None:
            path = s.data_dir / "token"
            if path.exists():
                token = path.read_text().strip()
    return BrokerClient(server, token)


def serve(config: ConfigOpt = None,
          port: Annotated[int | None, typer.Option(help="Override api.port.")] = None,
          host: Annotated[str | None, typer.Option(help="Override api.host.")] = None,
          migrate: Annotated[bool, typer.Option(
              "--migrate", help="Run `db upgrade` first (else an old schema is refused).")] = False,
          api_only: Annotated[bool, typer.Option(
              "--api-only", help="Serve the API without the background loops.")] = False,
          ) -> None:
    """Run the broker: HTTP API plus the placement, dispatch, sync and edge loops."""
    from broker.app import run_serve

    s = _settings(config)
    if host is not None:
        s = s.model_copy(update={"api": s.api.model_copy(update={"host": host})})
    raise typer.Exit(run_serve(s, migrate=migrate, api_only=api_only, port=port))


def _store_url(config: Path | None, url: str | None) -> str:
    return url or _settings(config).store_url


def _print_revision(url: str) -> None:
    from broker.store import migrate

    rev = _run(lambda: asyncio.run(migrate.current(url)))
    typer.echo(f"database at revision {rev or 'none (empty)'}")


@db_app.command("upgrade")
def db_upgrade(config: ConfigOpt = None, url: UrlOpt = None,
               revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Migrate the database to the newest schema (or REVISION)."""
    from broker.store import migrate

    target = _store_url(config, url)
    _run(lambda: asyncio.run(migrate.upgrade(target, revision)))
    _print_revision(target)


@db_app.command("downgrade")
def db_downgrade(config: ConfigOpt = None, url: UrlOpt = None,
                 revision: Annotated[str, typer.Argument()] = "-1") -> None:
    """Step the schema back (default one revision; `base` drops everything)."""
    from broker.store import migrate

    target = _store_url(config, url)
    _run(lambda: asyncio.run(migrate.downgrade(target, revision)))
    _print_revision(target)


@db_app.command("current")
def db_current(config: ConfigOpt = None, url: UrlOpt = None) -> None:
    """Print the database's schema revision and the code's head."""
    from broker.store import migrate

    target = _store_url(config, url)
    have = _run(lambda: asyncio.run(migrate.current(target)))
    typer.echo(f"current: {have or 'none (not migrated)'}  head: {migrate.head_revision()}")


def _documents(path: str) -> Iterator[tuple[int, Any]]:
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise fail(f"cannot read {path}: {e.strerror}") from e
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise fail(f"{path} is not valid YAML/JSON: {str(e).splitlines()[0]}") from e
    for i, d in enumerate(docs, 1):
        for item in (d.get("items", []) if isinstance(d, dict) and d.get("kind") == "List"
                     else [d]):
            yield i, item


def submit(files: Annotated[list[str], typer.Argument(help="YAML/JSON files ('-': stdin).")],
           config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
           output: OutputOpt = "table") -> None:
    """Submit workloads, and register clusters and sites (`kind: Cluster` / `kind: Site`
    documents, like `kubectl apply`). Multi-document YAML is fine."""
    with _client(config, server, token) as c:
        out = send_files(c, files, workload=c.submit,
                         native=lambda items: c.submit(native_list(items)))
    if output != "table":
        _emit(out, output)
        return
    for w in out:
        if echo_member(w):
            continue
        typer.echo(f"workload/{w['metadata']['name']} submitted: {w['id']} "
                   f"({w['status']['phase']})")


def native_list(items: list[Any]) -> dict[str, Any]:
    """A file's Kubernetes manifests as one request body (workload, companions, policy)."""
    return {"apiVersion": "v1", "kind": "List", "items": items}


def send_files(c: BrokerClient, files: list[str], *,
               workload: Callable[[Any], dict[str, Any]],
               native: Callable[[list[Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every document of `files`: clusters and sites are registered, a skyfed
    `Workload` goes to `workload`, a file's Kubernetes manifests together to `native`.
    The answers in order; the first refusal fails naming the file and document."""
    from broker.api.client import ClientError

    out: list[dict[str, Any]] = []
    for f in files:
        manifests: list[Any] = []
        for i, doc in _documents(f):
            try:
                member = _member_document(doc)
                if member is None and is_kubernetes_document(doc):
                    manifests.append(doc)
                elif member is None:
                    out.append(workload(doc))
                else:
                    resource, body = member
                    out.append({"kind": resource,
                                **c.request("POST", f"/v1/{resource}", json=body)})
            except ClientError as e:
                raise fail(f"{f} (document {i}): {e}") from e
        if manifests:
            try:
                out.append(native(manifests))
            except ClientError as e:
                raise fail(f"{f} (Kubernetes manifests): {e}") from e
    return out


def echo_member(answer: dict[str, Any]) -> bool:
    """Print a registered cluster or site's line; False when the answer is a workload."""
    if answer.get("kind") not in ("clusters", "sites"):
        return False
    typer.echo(f"{answer['kind'][:-1]}/{answer['name']} registered")
    return True


def is_kubernetes_document(doc: Any) -> bool:
    """A Kubernetes manifest (Deployment, Service, PlacementPolicy ...), not a skyfed
    `Workload`, `Cluster` or `Site` document."""
    return isinstance(doc, dict) and isinstance(doc.get("apiVersion"), str) and (
        doc["apiVersion"] != "skyfed.io/v1" or doc.get("kind") == "PlacementPolicy")


def _member_document(doc: Any) -> tuple[str, dict[str, Any]] | None:
    """`kind: Cluster|Site` -> ("clusters"|"sites", the registration body); else None.

    The body is `spec` with `metadata.name` as `name` (the API's ClusterIn/SiteIn).
    """
    if not isinstance(doc, dict) or doc.get("kind") not in ("Cluster", "Site"):
        return None
    spec = doc.get("spec")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(spec, dict) or not isinstance(name, str):
        raise fail(f"a {doc['kind']} document needs metadata.name and a spec mapping")
    return ("clusters" if doc["kind"] == "Cluster" else "sites"), {"name": name, **spec}


def get(resource: Annotated[str, typer.Argument(help="workloads | clusters | sites")],
        config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
        output: OutputOpt = "table",
        limit: Annotated[int, typer.Option(help="At most this many rows.")] = 1000,
        watch: Annotated[bool, typer.Option("--watch", "-w", help="Then print each change "
                                            "as it happens (workloads).")] = False,
        watch_timeout: Annotated[int, typer.Option(help="Stop watching after this many "
                                                   "seconds.")] = 3600) -> None:
    """List workloads, clusters or sites."""
    resource = {"workload": "workloads", "cluster": "clusters", "site": "sites",
                "wl": "workloads"}.get(resource, resource)
    if resource not in ("workloads", "clusters", "sites"):
        raise fail(f"unknown resource {resource!r} (use workloads, clusters or sites)")
    if watch:
        if resource != "workloads":
            raise fail("--watch is for workloads")
        from broker.commands.lifecycle import print_watch

        with _client(config, server, token) as c:
            _run(lambda: print_watch(c, output, watch_timeout))
        return
    with _client(config, server, token) as c:
        items = _run(lambda: list(c.list(resource, limit=limit)))
    if output != "table":
        _emit(items, output)
        return
    _print_table(resource, items)


def describe(resource: Annotated[str, typer.Argument(help="workload | cluster")],
             workload_id: Annotated[str, typer.Argument(metavar="ID")],
             config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
             output: OutputOpt = "yaml") -> None:
    """Show one workload with its placement and decision record, or one cluster (or edge
    site) with what was registered and what is observed, synced and measured now."""
    if resource in ("cluster", "clusters"):
        with _client(config, server, token) as c:
            cl = _run(lambda: c.request("GET", f"/v1/clusters/{workload_id}"))
        if output == "table":
            _print_cluster(cl)
        else:
            _emit(cl, output)
        return
    if resource not in ("workload", "workloads", "wl"):
        raise fail(f"cannot describe {resource!r} (use: describe workload ID | cluster NAME)")
    with _client(config, server, token) as c:
        w = _run(lambda: c.request("GET", f"/v1/workloads/{workload_id}"))
        pid = w["status"].get("placementId")
        if pid:
            w["placement"] = _run(lambda: c.request("GET", f"/v1/placements/{pid}"))
    _emit(w, "yaml" if output == "table" else output)


def cancel(workload_id: Annotated[str, typer.Argument(metavar="ID")],
           config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
           output: OutputOpt = "table") -> None:
    """Cancel a workload."""
    with _client(config, server, token) as c:
        w = _run(lambda: c.request("DELETE", f"/v1/workloads/{workload_id}"))
    if output != "table":
        _emit(w, output)
        return
    typer.echo(f"workload/{w['metadata']['name']} {w['id']}: {w['status']['phase']}")


_COLUMNS: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {
    "workloads": [
        ("ID", lambda w: w["id"]), ("NAME", lambda w: w["metadata"]["name"]),
        ("KIND", lambda w: w["spec"]["kind"]), ("STATUS", lambda w: w["status"]["phase"]),
        ("REPLICAS", lambda w: w["spec"]["replicas"]),
        ("CPU", lambda w: f"{w['spec']['resources']['cpu']:g}"),
        ("MEMORY", lambda w: w["spec"]["resources"]["memory"]),
        ("GPU", lambda w: w["spec"]["resources"]["gpu"] or ""),
        ("PLACEMENT", lambda w: w["status"]["placementId"] or ""),
    ],
    "clusters": [
        ("NAME", lambda c: c["name"]), ("PROVIDER", lambda c: c["provider"]),
        ("REGION", lambda c: c["region"]), ("POOLS", lambda c: len(c["pools"])),
        ("NODES", lambda c: sum(p["nodes"] for p in c["pools"])),
        ("OBSERVED", lambda c: _observed(c, "nodes")),
        ("CPU ALLOCATED", lambda c: _observed(c, "cpuAllocated", "cpuAllocatable")),
        ("HEALTHY", lambda c: "yes" if c["healthy"] else "NO"),
        ("QUOTA", lambda c: "stale" if c["quotaStale"] else "ok"),
    ],
    "sites": [
        ("NAME", lambda s: s["name"]), ("LAT", lambda s: s["lat"]), ("LON", lambda s: s["lon"]),
        ("CPU", lambda s: f"{s['capacity']['cpu']:g}"),
        ("MEMORY", lambda s: f"{s['capacity']['memory']:g}Gi"),
        ("GPU", lambda s: s["capacity"]["gpu"] or ""), ("HEALTH", lambda s: s["health"]),
    ],
}


def _observed(c: Any, key: str, of: str = "") -> str:
    o = c.get("observed")
    if not o:
        return "-"
    return f"{o[key]:g}/{o[of]:g}" if of else f"{o[key]:g}"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _print_cluster(cl: dict[str, Any]) -> None:
    """`describe cluster -o table`: what was registered next to what is observed/used now."""
    from rich.console import Console
    from rich.table import Table

    o = cl.get("observed") or {}
    eff = cl.get("effective") or {}
    pools = cl.get("pools") or []
    pr, q, h = cl.get("pricing") or {}, cl.get("quota") or {}, cl.get("health") or {}
    table = Table(title=f"cluster/{cl['name']} ({cl['provider']} {cl['region']})",
                  box=None, header_style="bold", title_justify="left")
    for col in ("", "REGISTERED", "OBSERVED / IN USE", "SOURCE", "AGE S"):
        table.add_column(col)
    rows = [
        ("nodes", sum(p["nodes"] for p in pools), o.get("nodes"), "inventory", o.get("ageS")),
        ("cpu allocatable", sum(p["nodes"] * p["node"]["cpu"] for p in pools),
         o.get("cpuAllocatable"), "inventory", o.get("ageS")),
        ("cpu allocated", None, o.get("cpuAllocated"), "inventory", o.get("ageS")),
        ("gpu free", None, o.get("gpuFree"), "inventory", o.get("ageS")),
        ("quota vcpu", cl.get("quotaVcpu"), eff.get("quotaVcpu"), q.get("source"),
         q.get("ageS")),
        ("price", "; ".join(f"{p['name']} {p['priceUsdPerHour']:g}" for p in pools),
         "; ".join(f"{p['name']} {p['priceUsdPerHour']:g}" for p in eff.get("pools", [])),
         pr.get("source"), pr.get("ageS")),
        ("healthy", cl.get("healthy"), eff.get("healthy"), h.get("source"), h.get("ageS")),
    ]
    for name, reg, now, source, age in rows:
        table.add_row(name, _fmt(reg), _fmt(now), _fmt(source), _fmt(age))
    Console(width=None if sys.stdout.isatty() else 250).print(table)


def _print_table(resource: str, items: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    if not items:
        typer.echo(f"no {resource}")
        return
    table = Table(box=None, header_style="bold")
    cols = _COLUMNS[resource]
    for name, _ in cols:
        table.add_column(name)
    for item in items:
        table.add_row(*(str(fn(item)) for _, fn in cols))
    # Not a terminal (pipes, CI): don't squeeze ids to 80 columns.
    Console(width=None if sys.stdout.isatty() else 250).print(table)


def _emit(obj: Any, output: str) -> None:
    import yaml

    if output == "json":
        typer.echo(json.dumps(obj, indent=2, sort_keys=False))
    elif output == "yaml":
        typer.echo(yaml.safe_dump(obj, sort_keys=False).rstrip())
    else:
        raise fail(f"unknown output format {output!r} (use table, json or yaml)")


def register(app: typer.Typer) -> None:
    """Mount this module's commands on the root app."""
    app.command()(serve)
    app.command()(submit)
    app.command()(get)
    app.command()(describe)
    app.command()(cancel)
    app.add_typer(db_app, name="db")
