"""`skyfed apply FILE` (create or change by name, like `kubectl apply`) and the printing of
`skyfed get workloads -w`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.commands.core import (
    ConfigOpt,
    OutputOpt,
    ServerOpt,
    TokenOpt,
    _client,
    _emit,
    echo_member,
    fail,
    native_list,
    send_files,
)

if TYPE_CHECKING:
    from broker.api.client import BrokerClient

_WORKLOAD_KINDS = {("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("batch/v1", "Job")}


def _workload_name(docs: list[Any]) -> str:
    for d in docs:
        if (d.get("apiVersion"), d.get("kind")) in _WORKLOAD_KINDS:
            name = (d.get("metadata") or {}).get("name")
            if isinstance(name, str):
                return name
    raise fail("no Deployment, StatefulSet or Job with metadata.name among the manifests")


def apply(files: Annotated[list[str], typer.Argument(help="YAML/JSON files ('-': stdin).")],
          config: ConfigOpt = None, server: ServerOpt = None, token: TokenOpt = None,
          output: OutputOpt = "table") -> None:
    """Create or change workloads by name (and register clusters and sites): a changed
    replica count scales the same workload, a changed spec rolls it out."""
    with _client(config, server, token) as c:
        def by_name(doc: Any) -> Any:
            name = (doc.get("metadata") or {}).get("name") if isinstance(doc, dict) else None
            return c.apply(str(name or ""), doc)

        out = send_files(c, files, workload=by_name,
                         native=lambda items: c.apply(_workload_name(items), native_list(items)))
    if output != "table":
        _emit(out, output)
        return
    for w in out:
        if echo_member(w):
            continue
        verb = {"created": "created", "unchanged": "unchanged"}.get(w.get("change", ""),
                                                                    "configured")
        typer.echo(f"workload/{w['metadata']['name']} {verb}: {w['id']} "
                   f"({w.get('change', '')}, {w['status']['phase']})")


def print_watch(c: BrokerClient, output: str, timeout_s: int) -> None:
    """One line per event (table), or one JSON/YAML document per event; Ctrl-C ends it."""
    try:
        _print_events(c, output, timeout_s)
    except KeyboardInterrupt:
        return


def _print_events(c: BrokerClient, output: str, timeout_s: int) -> None:
    for event, w in c.watch("workloads", timeout_s=timeout_s):
        if output != "table":
            _emit({"type": event, "object": w}, output)
            sys.stdout.flush()
            continue
        ready = w["status"].get("readyReplicas")
        typer.echo(f"{event:<9} {w['metadata']['name']:<24} {w['id']}  "
                   f"{w['status']['phase']:<11} {ready if ready is not None else '-'}/"
                   f"{w['spec']['replicas']}")
        sys.stdout.flush()  # each change as it happens, also into a pipe


def register(app: typer.Typer) -> None:
    app.command()(apply)
