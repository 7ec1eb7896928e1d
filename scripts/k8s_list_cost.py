"""Print what one pod list costs the Kubernetes driver to read, the two ways it could.

    .venv/bin/python scripts/k8s_list_cost.py [--pods 5000] [--repeats 3]

The same generated PodList body (each pod bound to a node, one container with requests) is
read (a) as the `kubernetes` client reads a typed list call: deserialised into its models,
then back to dicts (`ApiClient.sanitize_for_serialization`, what the driver did before
2026-12-07), and (b) as `KubernetesDriver._list_all` reads it: `json.loads` of the raw body.
Best of `--repeats` CPU seconds each (`time.process_time`), and their ratio, as JSON. No
server is involved: this is the client-side cost per poll, not the request's.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


class _Body:
    """What `ApiClient.deserialize` reads: a response with `.data`."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def pod_list(n: int) -> bytes:
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{i}", "namespace": "x", "labels": {"app": "a"}},
             "spec": {"nodeName": f"n{i % 50}", "containers": [{
                 "name": "c", "image": "x",
                 "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
             "status": {"phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(n)]
    return json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                       "items": pods}).encode()


def _best(fn: Any, repeats: int) -> float:
    out = []
    for _ in range(max(1, repeats)):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return min(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from kubernetes import client

    api = client.ApiClient()
    raw = pod_list(args.pods)
    typed = _best(lambda: api.sanitize_for_serialization(
        api.deserialize(_Body(raw), "V1PodList")), args.repeats)
    plain = _best(lambda: json.loads(raw), args.repeats)
    print(json.dumps({"pods": args.pods, "typed_models_cpu_s": round(typed, 4),
                      "raw_json_cpu_s": round(plain, 4),
                      "ratio": round(typed / plain, 1) if plain > 0 else None}))


if __name__ == "__main__":
    main()
