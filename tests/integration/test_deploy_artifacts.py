"""deploy/: the Dockerfile, the compose file, the Grafana dashboard, the systemd unit.

No docker engine runs on these machines, so each artifact is checked for what
can be checked without one: it parses, it names what the others expect, and it
keeps the security rules (non-root users, secrets from the environment).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


# ----------------------------------------------------------------- Dockerfile

def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (keyword, rest), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            m = re.search(r"\bAS\s+(\S+)", rest, re.I)
            current = stages.setdefault(m.group(1) if m else f"stage{len(stages)}", [])
            current.append(("FROM", rest))
        elif current is not None:
            current.append((word.upper(), rest))
    return stages


def _final_user(stages: dict[str, list[tuple[str, str]]], name: str) -> str | None:
    users = [rest.strip() for kw, rest in stages[name] if kw == "USER"]
    return users[-1] if users else None


def test_dockerfile_has_broker_and_agent_targets_running_as_non_root() -> None:
    stages = _stages((DEPLOY / "Dockerfile").read_text())
    assert {"broker", "agent"} <= set(stages)
    for target in ("broker", "agent"):
        user = _final_user(stages, target)
        assert user is not None, f"target {target} has no USER"
        assert user.split(":")[0] not in {"root", "0"}, f"target {target} runs as {user}"


def test_agent_target_installs_only_the_edge_extra() -> None:
    stages = _stages((DEPLOY / "Dockerfile").read_text())
    sources = {re.search(r"--from=(\S+)", rest).group(1)  # type: ignore[union-attr]
               for kw, rest in stages["agent"] if kw == "COPY" and "--from=" in rest}
    runs = " ".join(rest for src in sources for kw, rest in stages[src] if kw == "RUN")
    assert '".[edge]"' in runs
    assert "broker]" not in runs
    assert "torch" not in runs


def test_build_stage_copies_every_package_pyproject_installs() -> None:
    """`pip install .` in the image must see every package (migrations included)."""
    import tomllib

    pyproject = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    wanted = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    stages = _stages((DEPLOY / "Dockerfile").read_text())
    copied = {rest.split()[0].rstrip("/") for kw, rest in stages["build"]
              if kw == "COPY" and not rest.startswith("--")}
    assert wanted <= copied, f"build stage does not COPY {sorted(wanted - copied)}"


def test_dockerfile_parser_sees_a_root_user() -> None:
    """Guards the check above: a stage ending as root must be reported as root."""
    stages = _stages("FROM x AS broker\nUSER skyfed\nUSER 0:0\n")
    assert _final_user(stages, "broker") == "0:0"


# ----------------------------------------------------------------- compose

def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_postgres_mosquitto_broker_and_two_agents() -> None:
    services = _compose()["services"]
    assert {"postgres", "mosquitto", "broker"} <= set(services)
    agents = [s for s in services.values() if s.get("build", {}).get("target") == "agent"]
    assert len(agents) == 2
    sites = {a["command"][a["command"].index("--site") + 1] for a in agents}
    assert len(sites) == 2
    broker = services["broker"]
    assert broker["build"]["target"] == "broker"
    assert broker["environment"]["SKYFED_STORE__URL"].startswith("postgresql+asyncpg://")
    assert broker["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert broker["command"][:2] == ["serve", "--migrate"]  # entrypoint is `skyfed`


def test_compose_references_resolve() -> None:
    """What `docker compose config` would refuse: unknown services and volumes."""
    data = _compose()
    services, volumes = data["services"], set(data.get("volumes") or {})
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        for dep in svc.get("depends_on") or {}:
            assert dep in services, f"{name} depends on unknown service {dep}"
        for v in svc.get("volumes") or []:
            src = v.split(":")[0]
            if not src.startswith(("./", "/")):
                assert src in volumes, f"{name} mounts undeclared volume {src}"


def test_compose_takes_every_secret_from_the_environment() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    for service in _compose()["services"].values():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN", key):
                assert re.fullmatch(r"\$\{[A-Z_]+(:\?[^}]*)?\}", str(value)), key
    assert "POSTGRES_PASSWORD" in (DEPLOY / "compose.env.example").read_text()
    assert "changeme" not in text


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to deploy/) of a service's bind mounts."""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split("#")[0].strip().split(":")
        if parts[0].startswith("./"):
            out[parts[1]] = parts[0]
    return out


def test_compose_mosquitto_uses_the_acl_and_refuses_anonymous_clients() -> None:
    mounts = _mounts(_compose()["services"]["mosquitto"])
    conf_host = mounts["/mosquitto/config/mosquitto.conf"]
    conf = dict(line.split(None, 1) for line in (DEPLOY / conf_host).read_text().splitlines()
                if line.strip() and not line.startswith("#") and " " in line)
    assert conf["allow_anonymous"].strip() == "false"
    assert conf["acl_file"].strip() in mounts
    assert conf["password_file"].strip() in mounts
    if not (DEPLOY / "mosquitto").is_dir():
        pytest.skip("deploy/mosquitto/ (the edge work's ACL config) is not in the tree yet")
    acl_host = mounts[conf["acl_file"].strip()]
    assert acl_host.startswith("./mosquitto/")
    assert (DEPLOY / acl_host).is_file()


def test_compose_broker_user_is_the_acl_broker_user() -> None:
    """The broker must log in as the one user the ACL lets read every site's topics."""
    acl = DEPLOY / "mosquitto" / "acl"
    if not acl.is_file():
        pytest.skip("deploy/mosquitto/acl (the edge work's ACL) is not in the tree yet")
    users = re.findall(r"^user\s+(\S+)", acl.read_text(), re.M)
    assert users, "the ACL names no broker user"
    broker_env = _compose()["services"]["broker"]["environment"]
    assert broker_env["SKYFED_MQTT__USERNAME"] in users
    values = yaml.safe_load((DEPLOY / "helm" / "skyfed" / "values.yaml").read_text())
    assert values["mqtt"]["username"] in users


# ----------------------------------------------------------------- Grafana

_PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "min", "avg",
                 "count", "or", "vector", "le", "without", "on", "and", "unless"}


def _grafana_metrics() -> set[str]:
    dash = json.loads((DEPLOY / "grafana" / "skyfed.json").read_text())
    names: set[str] = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(by|without)\s*\([^)]*\)", "",
                          target["expr"])
            for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
                if word not in _PROMQL_WORDS:
                    names.add(word)
    return names


def test_grafana_dashboard_is_valid_and_uses_only_skyfed_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "skyfed.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 8
    for p in dash["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert p["targets"], p["title"]
    names = _grafana_metrics()
    assert names
    assert all(n.startswith("skyfed_") for n in names), sorted(names)


def _defined_metrics() -> set[str]:
    """Metric names the code registers (string literals passed to prometheus_client)."""
    root = DEPLOY.parent
    found: set[str] = set()
    for pkg in ("broker", "providers", "edge_agent"):
        for path in (root / pkg).rglob("*.py"):
            found.update(re.findall(r"(?:Counter|Gauge|Histogram|Summary|Info)\(\s*"
                                    r"\"(skyfed_[a-z0-9_]+)\"", path.read_text()))
    return found


def test_grafana_queries_only_metrics_the_broker_defines() -> None:
    """A panel on a metric nobody exports would stay empty forever."""
    defined = _defined_metrics()
    assert "skyfed_http_requests_total" in defined  # guards the scan itself
    series = set(defined)
    for name in defined:  # histograms are queried as _bucket/_sum/_count, counters as _total
        series.update({f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_total"})
    missing = sorted(_grafana_metrics() - series)
    assert not missing, f"dashboard queries metrics no module defines: {missing}"


# ----------------------------------------------------------------- systemd

def _units() -> list[Path]:
    units = sorted((DEPLOY / "systemd").glob("*.service")) if (DEPLOY / "systemd").is_dir() else []
    if not units:
        pytest.skip("deploy/systemd/*.service (the edge work's unit) is not in the tree yet")
    return units


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    return subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True,
                          text=True, timeout=60, check=False)


def _with_local_binary(unit: Path, tmp_path: Path) -> Path:
    """The unit with ExecStart's binary pointed at this checkout's (the installed path
    does not exist on a dev machine), so verify checks everything else strictly."""
    local = Path(sys.executable).with_name("skyfed-edge")
    text = re.sub(r"ExecStart=(\S+)", f"ExecStart={local}", unit.read_text())
    out = tmp_path / unit.name
    out.write_text(text)
    return out


def test_edge_agent_systemd_unit_verifies(tmp_path: Path) -> None:
    for unit in _units():
        proc = _verify(_with_local_binary(unit, tmp_path))
        assert proc.returncode == 0, f"{unit.name}: {proc.stderr}"
        assert not proc.stderr.strip(), f"{unit.name}: {proc.stderr}"


def test_systemd_verify_reports_a_misspelt_key(tmp_path: Path) -> None:
    """Guards the check above: verify must complain about an unknown key."""
    unit = _with_local_binary(_units()[0], tmp_path)
    unit.write_text(unit.read_text().replace("[Service]", "[Service]\nRestartt=always", 1))
    assert "Restartt" in _verify(unit).stderr


def test_systemd_unit_runs_the_agent_with_flags_it_accepts() -> None:
    """ExecStart must parse with the agent's own argument parser."""
    from edge_agent.cli import build_parser

    for unit in _units():
        text = re.sub(r"\\\n\s*", " ", unit.read_text())
        line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
        argv = line.split("=", 1)[1].split()
        assert argv[0].endswith("skyfed-edge")
        assert argv[1] == "run"
        args = [re.sub(r"\$\{?(\w+)\}?", r"<\1>", a) for a in argv[2:]
                if a not in ("$SKYFED_EDGE_ARGS", "${SKYFED_EDGE_ARGS}")]
        ns = build_parser().parse_args(args)
        assert ns.site == "<SKYFED_EDGE_SITE>"
