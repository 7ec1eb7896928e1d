"""`skyfed-edge`: the edge agent's command line.

`skyfed-edge run ...` is parsed with argparse and never imports typer or rich:
they cost ~16 MB and ~12 MB of RSS, more than a third of the agent's 40 MB
budget. The other commands (`version`, help) go through typer as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edge_agent.protocol import DEFAULT_PREFIX

VERSION = "skyfed-edge 0.1.0"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skyfed-edge run",
                                description="Run the edge agent for one site.")
    p.add_argument("--site", required=True, help="this site's name (MQTT user with the ACL)")
    p.add_argument("--broker", default="mqtt://127.0.0.1:1883",
                   help="mqtt://host:port or mqtts://host:port")
    p.add_argument("--username", default=os.environ.get("SKYFED_EDGE_USERNAME"))
    p.add_argument("--password", default=None,
                   help="prefer $SKYFED_EDGE_PASSWORD: arguments are visible in ps")
    p.add_argument("--tls", action="store_true", help="TLS to the broker (implied by mqtts://)")
    p.add_argument("--tls-ca", default=None, help="CA bundle for the broker's certificate")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="MQTT topic prefix")
    p.add_argument("--heartbeat-ms", type=int, default=100)
    p.add_argument("--keepalive-s", type=int, default=5)
    p.add_argument("--data-dir", type=Path, default=Path(".skyfed-edge"))
    p.add_argument("--peer", action="append", default=[],
                   help="[SITE=]host:port of a peer site (RTT reported under SITE)")
    p.add_argument("--probe", action="append", default=[],
                   help="[REGION=]host:port of a user probe point (RTT reported under the "
                        "user region's name, the key placement looks RTTs up by)")
    p.add_argument("--probe-every-s", type=float, default=5.0)
    p.add_argument("--load-every-s", type=float, default=2.0)
    p.add_argument("--cache-max-gib", type=float, default=10.0)
    p.add_argument("--max-downloads", type=int, default=2)
    p.add_argument("--pull-command", default="", help='e.g. "crictl pull {image}"')
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(ns: argparse.Namespace) -> Any:
    from edge_agent.config import AgentConfig
    from edge_agent.probe import parse_target

    url = urlsplit(ns.broker if "://" in ns.broker else f"mqtt://{ns.broker}")
    if url.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise SystemExit(f"--broker: unsupported scheme {url.scheme!r} (use mqtt:// or mqtts://)")
    for target in (*ns.peer, *ns.probe):  # a bad probe fails at start, naming itself
        try:
            parse_target(target)
        except ValueError as exc:
            raise SystemExit(f"--peer/--probe: {exc}") from exc
    tls = ns.tls or url.scheme in ("mqtts", "ssl")
    port = url.port or (8883 if tls else 1883)
    password = ns.password or os.environ.get("SKYFED_EDGE_PASSWORD") or url.password
    return AgentConfig(
        site=ns.site, host=url.hostname or "127.0.0.1", port=port,
        username=ns.username or url.username, password=password, tls=tls, tls_ca=ns.tls_ca,
        prefix=ns.prefix, heartbeat_ms=ns.heartbeat_ms, keepalive_s=ns.keepalive_s,
        data_dir=ns.data_dir, peers=tuple(ns.peer), probes=tuple(ns.probe),
        probe_every_s=ns.probe_every_s, load_every_s=ns.load_every_s,
        cache_max_bytes=int(ns.cache_max_gib * 1024**3), max_concurrent_downloads=ns.max_downloads,
        pull_command=ns.pull_command)


def run(argv: list[str]) -> int:
    # pydantic would scan every installed distribution for plugins: time and RSS
    # the agent does not need (it uses none).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(ns)

    async def _main() -> None:
        from edge_agent.agent import EdgeAgent

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await EdgeAgent(config).run(stop)

    asyncio.run(_main())
    return 0


def _typer_app() -> Any:
    import typer

    app = typer.Typer(name="skyfed-edge", no_args_is_help=True, add_completion=False)

    @app.command()
    def version() -> None:
        """Print the agent's version."""
        typer.echo(VERSION)

    @app.command(name="run")
    def run_help() -> None:
        """Run the agent for one site (`skyfed-edge run --help` lists the options)."""
        build_parser().print_help()

    return app


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:
        raise SystemExit(run(args[1:]))
    _typer_app()(args=args, prog_name="skyfed-edge")


if __name__ == "__main__":
    main()
