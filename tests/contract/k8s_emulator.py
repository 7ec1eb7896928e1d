"""kmock's Kubernetes emulator with two gaps closed the way the real API server behaves.

- kubernetes<37 sends `watch=True`; kmock only knows `watch=true` (FACTS.md): normalised.
- Server-side apply (`PATCH` with `application/apply-patch+yaml`) creates the object when it
  does not exist; kmock answers 404 there and merges only into existing objects. The object
  is created empty first, then kmock merges the applied body into it as for any patch.
"""

from __future__ import annotations

from typing import Any

import kmock

APPLY_PATCH = "application/apply-patch+yaml"


def _object_key(path: str) -> tuple[Any, str, str] | None:
    """(resource, namespace, name) of a namespaced object path, else None."""
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) == 6:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) == 7:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if rest[0] != "namespaces":
        return None
    return kmock.resource(group, version, rest[2]), rest[1], rest[3]


class Emulator(kmock.KubernetesEmulator):
    async def __call__(self, raw_request: Any) -> Any:
        if raw_request.query.get("watch") == "True":
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.update_query(watch="true"))
        if raw_request.method == "PATCH" and APPLY_PATCH in raw_request.headers.get(
                "Content-Type", ""):
            key = _object_key(raw_request.path)
            if key is not None and (key not in self.objects or self.objects[key].deleted):
                res, ns, name = key
                self.objects[res, ns, name] = {"metadata": {"name": name, "namespace": ns}}
        return await super().__call__(raw_request)
