"""Checks every request a test's kmock server received against deploy/member-rbac.yaml, the
RBAC that docs/operations.md tells operators to apply in each member cluster: a call the
Kubernetes driver makes and that file does not grant would be a 403 on a real cluster.

The check follows Kubernetes' RBAC authorizer: a request's verb comes from its HTTP method
(GET on a name: get, on a collection: list, or watch with `?watch=`; POST create; PATCH
patch; PUT update; DELETE on a name: delete, on a collection: deletecollection), its API
group, resource (`resource/subresource` for a subresource) and name from its path; a Role
grants in its own namespace only, a ClusterRole (bound by a ClusterRoleBinding) everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RBAC_FILE = Path(__file__).resolve().parents[2] / "deploy" / "member-rbac.yaml"


@dataclass(frozen=True, slots=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str | None  # None: cluster-scoped
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{where}" \
               f"{' ' + self.name if self.name else ''}"


def parse(method: str, path: str, params: Any) -> Call:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts and parts[0] == "apis" and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a Kubernetes API path: {path}")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    method = method.upper()
    watch = str((params or {}).get("watch", "")).lower() in ("true", "1")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method) or (
        ("watch" if watch else "get" if name else "list") if method == "GET"
        else "delete" if name else "deletecollection")
    return Call(verb, group, resource, namespace, name)


def _grants(rule: dict[str, Any], call: Call) -> bool:
    def has(key: str, value: str) -> bool:
        return value in rule.get(key, ()) or "*" in rule.get(key, ())

    names = rule.get("resourceNames") or ()
    return (has("apiGroups", call.group) and has("resources", call.resource)
            and has("verbs", call.verb) and (not names or call.name in names))


def _moved(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """`doc` as an operator edits it for another namespace than the file's (its header)."""
    meta = doc["metadata"]
    if "namespace" in meta:
        meta["namespace"] = namespace
    if doc["kind"] == "Namespace":
        meta["name"] = namespace
    for subject in doc.get("subjects") or ():
        subject["namespace"] = namespace
    for rule in doc.get("rules") or ():
        if rule.get("resources") == ["namespaces"] and rule.get("resourceNames"):
            rule["resourceNames"] = [namespace]
    return doc


def denied(calls: Iterable[Call], *, namespace: str = "skyfed",
           rbac: Path = RBAC_FILE) -> list[str]:
    """The calls no role of `rbac` grants to its service account, as text, with the file's
    namespace moved to `namespace` (the driver's option) as its header says."""
    docs = [_moved(d, namespace) for d in yaml.safe_load_all(rbac.read_text()) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    grants: list[tuple[str | None, dict[str, Any]]] = []  # (namespace or None: all, rule)
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = roles[(d["roleRef"]["kind"], d["roleRef"]["name"])]
        scope = d["metadata"]["namespace"] if d["kind"] == "RoleBinding" else None
        grants += [(scope, r) for r in role["rules"]]
    out = []
    for call in calls:
        if not any((scope is None or scope == call.namespace) and _grants(rule, call)
                   for scope, rule in grants):
            out.append(str(call))
    return sorted(set(out))


def calls_of(kmock_root: Any) -> list[Call]:
    """Every request kmock's server received, as RBAC sees it."""
    return [parse(str(r.method.value if hasattr(r.method, "value") else r.method),
                  r.url.path, r.params) for r in kmock_root]
