"""The docs/api.md example, end to end: a Kubernetes Deployment + Service + PlacementPolicy
applied with `PUT /v1/workloads/{name}`, placed, and written to two member clusters.

The broker runs in-process (its real app, store on SQLite in a temporary directory, its real
placement loop, dispatcher and reconciler); each member cluster is kmock's Kubernetes API
emulator (a test dependency: `pip install -e .[dev]`) behind the real KubernetesDriver.
Prints each request and the parts of each answer the docs show.

    .venv/bin/python scripts/k8s_example.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import httpx
import kmock
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.app import build_runtime, create_app, ensure_admin_token
from broker.clock import ManualClock
from broker.federation.dispatcher import Dispatcher
from broker.federation.placement_loop import PlacementLoop
from broker.federation.reconciler import Reconciler
from broker.settings import PlacementSettings, load_settings
from broker.store import migrate
from providers.kubernetes import KubernetesDriver, KubernetesOptions
from tests.contract.k8s_emulator import Emulator

MANIFESTS = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 4
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
        ports: [{containerPort: 80}]
        resources:
          requests: {cpu: 500m, memory: 256Mi}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: skyfed.io/v1
kind: PlacementPolicy
metadata:
  name: web
spec:
  resourceSelectors:
  - {apiVersion: apps/v1, kind: Deployment, name: web}
  placement:
    clusterAffinity:
      clusterNames: [eu-a, eu-b]
    spreadConstraints:
    - {spreadByField: cluster, minGroups: 2}
"""


def cluster(name: str, price: float) -> dict[str, Any]:
    return {"name": name, "provider": "onprem", "region": "fra", "lat": 50.1, "lon": 8.7,
            "pools": [{"name": "general", "instanceType": "8x32",
                       "node": {"cpu": 8, "memory": 32}, "nodes": 2, "maxNodes": 2,
                       "priceUsdPerHour": price}]}


def show(title: str, obj: Any) -> None:
    print(f"## {title}")
    print(json.dumps(obj, indent=2))


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    url = f"sqlite+aiosqlite:///{tmp / 'skyfed.db'}"
    await migrate.upgrade(url)
    rt = build_runtime(load_settings(store={"url": url}, data_dir=tmp))
    admin = await ensure_admin_token(rt)
    clock = ManualClock(1_000.0)
    async with Emulator() as ka, kmock.Server(ka) as sa, Emulator() as kb, \
            kmock.Server(kb) as sb:
        drivers: dict[str, Any] = {}
        members = {"eu-a": (ka, sa), "eu-b": (kb, sb)}
        for name, (k, srv) in members.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                k.resources.load_bundled()
            api = client.ApiClient(configuration=client.Configuration(host=str(srv.url)))
            drivers[name] = KubernetesDriver(name, KubernetesOptions(namespace="skyfed"),
                                             api_client=api)
        transport = httpx.ASGITransport(app=create_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as c:
            r = await c.post("/v1/tokens", json={"tenant": "shop"},
                             headers={"Authorization": f"Bearer {admin}"})
            auth = {"Authorization": f"Bearer {r.json()['token']}"}
            for name, price in (("eu-a", 0.38), ("eu-b", 0.42), ("us-c", 0.20)):
                await c.post("/v1/clusters", json=cluster(name, price), headers=auth)
            r = await c.put("/v1/workloads/web", content=MANIFESTS,
                            headers={**auth, "Content-Type": "application/yaml"})
            body = r.json()
            show(f"PUT /v1/workloads/web -> {r.status_code}",
                 {"id": body["id"], "change": body["change"], "spec": {
                     k: body["spec"][k] for k in ("kind", "replicas", "resources",
                                                  "clusterNames", "spread", "objects")},
                  "status": body["status"]})
            await PlacementLoop(rt.store, clock, PlacementSettings(), catalog=None).tick()
            await Dispatcher(rt.store, drivers, clock).dispatch_once()
            for k, _ in members.values():
                dep = kmock.resource("apps", "v1", "deployments")
                for key, obj in list(k.objects.items()):
                    if key[0] == dep:
                        obj.patch({"status": {"readyReplicas": obj.raw["spec"]["replicas"]}})
            await Reconciler(rt.store, drivers, clock).reconcile_once()
            r = await c.get("/v1/workloads/web", headers=auth)
            st = r.json()["status"]
            show(f"GET /v1/workloads/web -> {r.status_code} (status)",
                 {k: st[k] for k in ("phase", "conditions", "clusters", "readyReplicas")})
            for name, (k, _) in members.items():
                objs = sorted(f"{key[0].plural}/{key[2]}" for key, obj in k.objects.items()
                              if not obj.deleted)
                show(f"objects on member {name} (namespace skyfed)", objs)
            dep = dict(ka.objects[kmock.resource("apps", "v1", "deployments"), "skyfed",
                                  f"skyfed-{body['id']}"].raw)
            pod = dep["spec"]["template"]["spec"]
            show("the Deployment on eu-a (excerpt)", {
                "replicas": dep["spec"]["replicas"], "nodeSelector": pod["nodeSelector"],
                "ports": pod["containers"][0]["ports"],
                "labels": dep["metadata"]["labels"]})
        await rt.store.close()


if __name__ == "__main__":
    asyncio.run(main())
