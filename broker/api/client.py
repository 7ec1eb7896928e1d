"""A small synchronous HTTP client for the broker API (the CLI uses it).

Every failure becomes one `ClientError` whose message is one clear line:
unreachable server, 401, 404, or a validation error naming the field.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import httpx


class ClientError(Exception):
    """One line for a human; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class BrokerClient:
    def __init__(self, server: str, token: str | None, *, timeout_s: float = 10.0) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s)

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as e:
            raise ClientError(f"the broker at {self.server} did not answer in time") from e
        except httpx.TransportError as e:
            raise ClientError(f"cannot reach the broker at {self.server} ({e}); "
                              "is `skyfed serve` running? (set --server or SKYFED_SERVER)") from e
        if r.status_code >= 400:
            raise ClientError(_problem_line(r), status=r.status_code)
        return r.json()

    def submit(self, doc: Mapping[str, Any], *, idempotency_key: str | None = None) -> Any:
        key = idempotency_key or uuid.uuid4().hex
        return self.request("POST", "/v1/workloads", json=dict(doc),
                            headers={"Idempotency-Key": key})

    def apply(self, name: str, doc: Mapping[str, Any]) -> Any:
        """Create or change the workload `name` (PUT: upsert by name)."""
        return self.request("PUT", f"/v1/workloads/{name}", json=dict(doc))

    def watch(self, resource: str, *, timeout_s: int = 3600) -> Iterator[tuple[str, Any]]:
        """(event, item) of `/v1/<resource>?watch=true` until the server ends the stream."""
        params: dict[str, str | int] = {"watch": "true", "timeoutSeconds": timeout_s}
        try:
            with self._http.stream("GET", f"/v1/{resource}", params=params,
                                   timeout=httpx.Timeout(10.0, read=None)) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ClientError(_problem_line(r), status=r.status_code)
                event = ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                    elif line.startswith("data: "):
                        yield event, json.loads(line[len("data: "):])
        except httpx.TransportError as e:
            raise ClientError(f"lost the watch on {self.server} ({e})") from e

    def list(self, resource: str, *, limit: int = 1000) -> Iterator[Any]:
        """Every item of `/v1/<resource>`, following cursors, at most `limit`."""
        cursor: str | None = None
        seen = 0
        while seen < limit:
            params: dict[str, Any] = {"limit": min(500, limit - seen)}
            if cursor:
                params["cursor"] = cursor
            page = self.request("GET", f"/v1/{resource}", params=params)
            for item in page["items"]:
                seen += 1
                yield item
            cursor = page.get("nextCursor")
            if not cursor:
                return


def _problem_line(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    if not isinstance(body, dict):
        return f"HTTP {r.status_code}"
    detail = str(body.get("detail") or body.get("title") or "")
    errors = body.get("errors") or []
    if errors and isinstance(errors[0], dict) and errors[0].get("loc"):
        loc = ".".join(str(x) for x in errors[0]["loc"] if x != "body")
        detail = f"{loc}: {errors[0].get('msg', detail)}"
    hint = " (set --token or SKYFED_TOKEN)" if r.status_code == 401 else ""
    return f"{r.status_code} {body.get('title', '')}: {detail}{hint}"
