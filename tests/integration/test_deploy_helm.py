"""The Helm chart in deploy/helm/skyfed renders to valid Kubernetes objects.

The helm binary is not installed on these machines, so this file carries a
tiny renderer for the subset of Helm's template language the chart uses
(value paths, `if`/`with`/`else`/`end`, `toYaml`, `nindent`, `quote`,
`default`, `printf`, `not`, `b64enc`, `{{-`/`-}}` trimming). The chart's
values.yaml promises to stay inside that subset; a template that leaves it
fails here with the construct's name, so the subset cannot drift silently.

Each rendered object is then deserialised into the `kubernetes` client's
models (which refuse missing required fields) and serialised back: a key the
model does not know (a typo such as `containerport`) is dropped on the round
trip, so the round trip must give back exactly what was rendered.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "skyfed"

# ----------------------------------------------------------------- renderer

_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\(|\)|\||[^\s()|]+')


class TemplateError(Exception):
    pass


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "", [], {})


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        raise TemplateError(f"cannot print a {type(v).__name__} without toYaml: {v!r}")
    return str(v)


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n")


def _nindent(n: int, s: Any) -> str:
    pad = " " * int(n)
    return "\n" + "\n".join(pad + line if line else line for line in _fmt(s).split("\n"))


_FUNCS: dict[str, Any] = {
    "toYaml": _to_yaml,
    "nindent": _nindent,
    "quote": lambda v: json.dumps(_fmt(v)),
    "default": lambda d, v=None: v if _truthy(v) else d,
    "printf": lambda f, *a: f % tuple(_fmt(x) for x in a),
    "not": lambda v: not _truthy(v),
    "b64enc": lambda v: base64.b64encode(_fmt(v).encode()).decode(),
}


def _lookup(path: str, dot: Any, root: Any) -> Any:
    if path == ".":
        return dot
    base, rest = (root, path[1:]) if path.startswith("$") else (dot, path)
    cur = base
    for part in [p for p in rest.split(".") if p]:
        if not isinstance(cur, dict):
            raise TemplateError(f"cannot index {path!r} at {part!r}")
        cur = cur.get(part)
    return cur


def _parse_args(tokens: list[str]) -> list[Any]:
    """Split into operands; a parenthesised group becomes a nested token list."""
    out: list[Any] = []
    while tokens:
        tok = tokens.pop(0)
        if tok == "(":
            depth, group = 1, []
            while depth:
                t = tokens.pop(0)
                depth += {"(": 1, ")": -1}.get(t, 0)
                if depth:
                    group.append(t)
            out.append(group)
        else:
            out.append(tok)
    return out


def _operand(op: Any, dot: Any, root: Any) -> Any:
    if isinstance(op, list):
        return _eval(op, dot, root)
    if op.startswith('"'):
        return json.loads(op)
    if op.startswith((".", "$")):
        return _lookup(op, dot, root)
    if re.fullmatch(r"-?\d+", op):
        return int(op)
    if op in ("true", "false"):
        return op == "true"
    raise TemplateError(f"unsupported operand {op!r} (outside the chart's template subset)")


def _eval(tokens: list[str], dot: Any, root: Any) -> Any:
    commands: list[list[str]] = [[]]
    depth = 0
    for t in tokens:
        depth += {"(": 1, ")": -1}.get(t, 0)
        if t == "|" and depth == 0:
            commands.append([])
        else:
            commands[-1].append(t)
    value: Any = None
    for i, cmd in enumerate(commands):
        ops = _parse_args(list(cmd))
        head = ops[0]
        if isinstance(head, str) and head in _FUNCS:
            args = [_operand(o, dot, root) for o in ops[1:]]
            if i > 0:
                args.append(value)
            value = _FUNCS[head](*args)
        elif isinstance(head, str) and re.fullmatch(r"[A-Za-z]\w*", head):
            raise TemplateError(f"unsupported function {head!r} (outside the chart's subset)")
        else:
            if i > 0 or len(ops) != 1:
                raise TemplateError(f"bad pipeline {' '.join(tokens)!r}")
            value = _operand(head, dot, root)
    return value


def _parse(template: str) -> list[Any]:
    items: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        items.append(("text", text))
        items.append(("act", m.group(2).strip()))
        trim_next = bool(m.group(3))
        pos = m.end()
    tail = template[pos:]
    items.append(("text", tail.lstrip() if trim_next else tail))
    root: list[Any] = []
    stack: list[tuple[list[Any], dict[str, Any]]] = []
    body = root
    for kind, val in items:
        if kind == "text":
            body.append(("text", val))
            continue
        word, _, rest = val.partition(" ")
        if val.startswith("/*"):
            continue
        if word in ("if", "with"):
            node: dict[str, Any] = {"kind": word, "expr": _TOKEN.findall(rest),
                                    "then": [], "else": []}
            body.append(("block", node))
            stack.append((body, node))
            body = node["then"]
        elif word == "else":
            if not stack:
                raise TemplateError("else without if/with")
            body = stack[-1][1]["else"]
        elif word == "end":
            if not stack:
                raise TemplateError("end without if/with")
            body, _ = stack.pop()
        elif word in ("range", "define", "include", "template", "block", "tpl"):
            raise TemplateError(f"{word!r} is outside the chart's template subset")
        else:
            body.append(("expr", _TOKEN.findall(val)))
    if stack:
        raise TemplateError("unclosed if/with block")
    return root


def _run(nodes: list[Any], dot: Any, root: Any) -> str:
    out: list[str] = []
    for kind, val in nodes:
        if kind == "text":
            out.append(val)
        elif kind == "expr":
            out.append(_fmt(_eval(val, dot, root)))
        else:
            v = _eval(val["expr"], dot, root)
            branch = val["then"] if _truthy(v) else val["else"]
            out.append(_run(branch, v if val["kind"] == "with" and _truthy(v) else dot, root))
    return "".join(out)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render_chart(overrides: dict[str, Any] | None = None,
                 release: str = "demo", namespace: str = "skyfed") -> list[dict[str, Any]]:
    """Render every template like `helm template` and return the parsed objects."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = _merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides or {})
    ctx = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {"Name": chart["name"], "Version": chart["version"],
                  "AppVersion": chart["appVersion"]},
    }
    objects: list[dict[str, Any]] = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        text = _run(_parse(path.read_text()), ctx, ctx)
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


# ----------------------------------------------------------------- validation

SECRETS = {"secrets": {"storeUrl": "postgresql+asyncpg://skyfed:pw@pg:5432/skyfed",
                       "adminToken": "t0k3n-not-a-placeholder", "mqttPassword": "mqtt-pw"}}
EVERYTHING = _merge(SECRETS, {"edgeAgent": {"enabled": True},
                              "serviceMonitor": {"labels": {"release": "kps"}},
                              "broker": {"kubeconfigSecret": "skyfed-kubeconfigs",
                                         "extraEnv": [{"name": "SKYFED_PLACEMENT__EPOCH_S",
                                                       "value": "2.0"}]}})


def _strip_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _strip_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_strip_none(x) for x in v]
    return v


def k8s_round_trip(obj: dict[str, Any]) -> Any:
    """Deserialise into the client's model for obj's kind and serialise back."""
    from kubernetes.client import ApiClient

    group_version = obj["apiVersion"].split("/")[-1]
    klass = f"{group_version.capitalize()}{obj['kind']}"
    api = ApiClient()
    model = api._ApiClient__deserialize(copy.deepcopy(obj), klass)
    return _strip_none(api.sanitize_for_serialization(model))


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


def test_renderer_trims_and_branches_like_helm() -> None:
    ctx = {"Values": {"a": {"b": 3}, "off": False, "m": {"x": 1}}}
    tpl = "k:\n  {{- if .Values.off }}\n  no: 1\n  {{- else }}\n  v: {{ .Values.a.b }}\n" \
          "  {{- end }}\n  m:\n    {{- toYaml .Values.m | nindent 4 }}\n"
    assert yaml.safe_load(_run(_parse(tpl), ctx, ctx)) == {"k": {"v": 3, "m": {"x": 1}}}
    with pytest.raises(TemplateError, match="range"):
        _parse("{{ range .Values.a }}{{ end }}")


def test_default_render_has_broker_secret_service_and_monitor() -> None:
    kinds = _by_kind(render_chart(SECRETS))
    assert set(kinds) == {"Deployment", "Service", "Secret", "ServiceMonitor"}
    secret = kinds["Secret"]
    assert base64.b64decode(secret["data"]["store-url"]).decode() == \
        SECRETS["secrets"]["storeUrl"]


def test_every_object_round_trips_through_kubernetes_models() -> None:
    pytest.importorskip("kubernetes")
    for obj in render_chart(EVERYTHING):
        if obj["kind"] == "ServiceMonitor":
            continue  # a CRD: checked by test_service_monitor_selects_the_service
        assert k8s_round_trip(obj) == obj, f"{obj['kind']} has keys its model does not know"


def test_missing_required_field_is_refused_by_the_models() -> None:
    """Guards the validation itself: the models must reject an incomplete object."""
    pytest.importorskip("kubernetes")
    dep = copy.deepcopy(_by_kind(render_chart(SECRETS))["Deployment"])
    del dep["spec"]["template"]["spec"]["containers"][0]["name"]
    with pytest.raises(ValueError, match="name"):
        k8s_round_trip(dep)


def test_broker_deployment_reads_store_url_and_token_from_the_secret() -> None:
    kinds = _by_kind(render_chart(SECRETS))
    dep, secret = kinds["Deployment"], kinds["Secret"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    for name, key in [("SKYFED_STORE__URL", "store-url"),
                      ("SKYFED_API__ADMIN_TOKEN", "admin-token")]:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": key}
        assert key in secret["data"]
    assert pod["initContainers"][0]["args"] == ["db", "upgrade"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= \
        dep["spec"]["template"]["metadata"]["labels"].items()


def test_existing_secret_replaces_the_generated_one() -> None:
    kinds = _by_kind(render_chart({"secrets": {"existingSecret": "prod-skyfed"}}))
    assert "Secret" not in kinds
    env = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in env if "valueFrom" in e}
    assert refs == {"prod-skyfed"}


def test_service_monitor_selects_the_service() -> None:
    kinds = _by_kind(render_chart(EVERYTHING))
    mon, svc = kinds["ServiceMonitor"], kinds["Service"]
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    assert mon["metadata"]["labels"]["release"] == "kps"
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert all(ep["port"] in ports and ep["path"] == "/metrics" for ep in mon["spec"]["endpoints"])
    assert svc["spec"]["selector"].items() <= \
        kinds["Deployment"]["spec"]["template"]["metadata"]["labels"].items()


def test_edge_agent_daemonset_targets_edge_nodes_only_when_enabled() -> None:
    assert "DaemonSet" not in _by_kind(render_chart(SECRETS))
    ds = _by_kind(render_chart(EVERYTHING))["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"skyfed.io/edge": "true"}
    agent = pod["containers"][0]
    assert agent["image"].startswith("skyfed/agent:")
    script = " ".join(agent["command"] + agent["args"])
    assert 'exec skyfed-edge run --site "$SKYFED_EDGE_SITE" --username "$SKYFED_EDGE_SITE"' \
        in script  # the ACL's %u is the site
    env = {e["name"]: e for e in agent["env"]}
    assert env["SKYFED_EDGE_SITE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["credentials"]["secret"]["secretName"] == "skyfed-edge-credentials"
    assert f'{mounts["credentials"]}/$SKYFED_EDGE_SITE' in script
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsUser"] != 0


def test_round_trip_catches_a_misspelt_key() -> None:
    """Guards the validation itself: an unknown key must not survive the round trip."""
    pytest.importorskip("kubernetes")
    dep = copy.deepcopy(_by_kind(render_chart(SECRETS))["Deployment"])
    dep["spec"]["template"]["spec"]["containers"][0]["containerport"] = 8080
    assert k8s_round_trip(dep) != dep


def test_kubeconfig_secret_is_mounted_only_when_named() -> None:
    plain = _by_kind(render_chart(SECRETS))["Deployment"]["spec"]["template"]["spec"]
    assert "kubeconfigs" not in {v["name"] for v in plain["volumes"]}
    pod = _by_kind(render_chart(EVERYTHING))["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kubeconfigs"]["secret"]["secretName"] == "skyfed-kubeconfigs"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["kubeconfigs"]["mountPath"] == "/etc/skyfed/kube"
    assert mounts["kubeconfigs"]["readOnly"] is True
