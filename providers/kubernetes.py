"""A member Kubernetes cluster as a ClusterDriver, on the official ``kubernetes`` client.

Any conformant cluster works (EKS/GKE/AKS, EKS Anywhere, k3s at the edge): the driver only
uses core/v1 Nodes (and a workload's Services, ConfigMaps, Secrets, claims), apps/v1
Deployments and StatefulSets, batch/v1 Jobs and, for telemetry, metrics.k8s.io.

Contract:

- ``apply``: a ``service`` becomes a Deployment, ``batch``/``train`` a Job, named
  ``skyfed-<workload id>`` in ``KubernetesOptions.namespace`` (created first when
  ``create_namespace``), with requests = limits for cpu, memory and ``nvidia.com/gpu``, the
  cluster's pools of the placement (one: a node selector on ``skyfed.io/pool``; several: one
  node-affinity term, so a split within the cluster is one object with every replica),
  tolerations and ``skyfed.io/*`` labels. A workload submitted as Kubernetes manifests is
  the user's own object and companions instead (``kubernetes_native.py``). Everything is
  written by server-side apply (field manager ``skyfed``). Idempotent: the rendered spec's
  hash is stored in the ``skyfed.io/spec-hash`` annotation; the same hash is left alone; a
  changed Job is deleted first (its pod template is immutable). A companion name held by
  another workload is a conflict, never overwritten.
- ``delete``: the workload object and its companions; 404 is success.
  ``status``/``list_status``: from the objects' status.
- ``watch``: list, then watch from the list's resourceVersion; 410 Gone -> list again; read
  timeouts just re-watch, so a quiet cluster costs one request per ``watch_timeout_s``.
- ``inventory``: nodes' allocatable cpu/memory/GPUs, GPU labels (NVIDIA GPU feature discovery:
  ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``), taints, readiness, and usage summed
  from the requests of running pods.

The client is synchronous: every call runs in ``asyncio.to_thread`` under a per-cluster
semaphore, with a request timeout, and ``ApiException``/urllib3 errors are mapped once
(``_map_error``) into providers/errors.py. The manifests, and the mapping of objects back to
statuses and inventory, are pure functions in ``providers/kubernetes_objects.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from providers import kubernetes_native as kn
from providers import kubernetes_prewarm as kp
from providers.base import (
    ApplySpec,
    Capability,
    DriverStatus,
    NodeInventory,
    PrewarmSpec,
)
from providers.errors import (
    AuthError,
    ConfigError,
    ConflictError,
    NotFoundError,
    ProviderError,
    ThrottledError,
    TransientError,
)
from providers.kubernetes_objects import (
    ACTIVE_PODS_SELECTOR,
    HASH_ANNOTATION,
    ID_LABEL,
    MANAGED_LABEL,
    deployment_status,
    dns_name,
    job_status,
    label_value,
    node_inventory,
    own_labels,
    quantity,
    render,
    requested_by_node,
    status_of,
    workloads_by_node,
)

T = TypeVar("T")
WORKLOAD_KINDS = ("Deployment", "Job", "StatefulSet")
LIST_PAGE = 500  # items per page of a large list (client-go's pager default)


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    kubeconfig: str | None = None  # path; None: in-cluster config when inside a pod, else default
    context: str | None = None
    in_cluster: bool = False
    namespace: str = "skyfed"
    max_concurrency: int = 4
    timeout_s: float = 30.0
    watch_timeout_s: float = 2.0  # read timeout of one watch request before re-watching
    job_backoff_limit: int = 3
    create_namespace: bool = False  # server-side apply `namespace` before the first object
    # Prewarm DaemonSets older than this are deleted by the next prewarm (kubernetes_prewarm).
    prewarm_keep_s: float = 3600.0


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "status", None)
    return code if isinstance(code, int) else None


def _map_error(exc: BaseException, *, cluster: str) -> ProviderError:
    """ApiException / urllib3 / config errors -> the providers error tree."""
    if isinstance(exc, ProviderError):
        return exc
    code = _status_code(exc)
    reason = getattr(exc, "reason", "") or ""
    text = f"{type(exc).__name__}: {code or ''} {reason}".strip()
    kw: dict[str, Any] = {"provider": "kubernetes", "region": cluster}
    if code in (401, 403):
        return AuthError(f"credentials rejected: {text}", **kw)
    if code == 404:
        return NotFoundError(text, **kw)
    if code == 409:
        return ConflictError(text, **kw)
    if code == 410:
        return TransientError(f"resource version gone: {text}", **kw)
    if code == 429:
        return ThrottledError(text, **kw)
    if code is not None and code >= 500:
        return TransientError(text, **kw)
    if code is None and ("urllib3" in type(exc).__module__ or isinstance(exc, OSError)):
        return TransientError(f"cluster unreachable: {type(exc).__name__}: {exc}", **kw)
    return ProviderError(text, **kw)


def load_api_client(options: KubernetesOptions) -> Any:
    """An ApiClient from the kubeconfig (or in-cluster); malformed config -> ConfigError."""
    from kubernetes import client, config

    where = options.kubeconfig or "in-cluster config"
    try:
        if options.in_cluster or (options.kubeconfig is None
                                  and "KUBERNETES_SERVICE_HOST" in os.environ):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(configuration=cfg)
        return config.new_client_from_config(config_file=options.kubeconfig,
                                             context=options.context)
    except Exception as exc:  # yaml errors, ConfigException, missing files: all config errors
        raise ConfigError(
            f"cannot load kubeconfig {where!r}: {type(exc).__name__}: {exc}",
            provider="kubernetes",
        ) from exc


class KubernetesDriver:
    """ClusterDriver for one member cluster (see module docstring)."""

    capabilities = frozenset({Capability.WATCH, Capability.GPU_TOPOLOGY, Capability.METRICS,
                              Capability.PREWARM})

    def __init__(self, name: str, options: KubernetesOptions | None = None, *,
                 api_client: Any | None = None) -> None:
        self.name = name
        self.options = options or KubernetesOptions()
        self._api = api_client if api_client is not None else load_api_client(self.options)
        self._sem = asyncio.Semaphore(self.options.max_concurrency)
        self._namespace_ready = False

    def __repr__(self) -> str:
        return f"KubernetesDriver(name={self.name!r}, namespace={self.options.namespace!r})"

    # ---- plumbing ----------------------------------------------------------------------
    @property
    def _apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self._api)

    @property
    def _batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self._api)

    @property
    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api)

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        kw.setdefault("_request_timeout", self.options.timeout_s)
        async with self._sem:
            try:
                return await asyncio.to_thread(fn, *args, **kw)
            except Exception as exc:  # the SDK boundary: mapped once, here
                raise _map_error(exc, cluster=self.name) from exc

    def _sanitize(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self._api.sanitize_for_serialization(obj)
        return out

    # ---- apply / delete ----------------------------------------------------------------
    def _fn(self, verb: str, kind: str) -> Callable[..., Any]:
        """`<verb>_namespaced_<kind>` of the API group that serves `kind` (kn.KINDS)."""
        group = kn.KINDS[kind][0]
        api = self._apps if group == "apps/v1" else self._batch if group == "batch/v1" \
            else self._core
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
        fn: Callable[..., Any] = getattr(api, f"{verb}_namespaced_{snake}")
        return fn

    async def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return self._sanitize(await self._call(self._fn("read", kind), name,
                                                   self.options.namespace))
        except NotFoundError:
            return None

    async def _server_side_apply(self, body: dict[str, Any]) -> None:
        await self._call(self._fn("patch", body["kind"]), body["metadata"]["name"],
                         self.options.namespace, body, field_manager=kp.FIELD_MANAGER,
                         force=True, _content_type=kp.APPLY_CONTENT_TYPE)

    async def _ensure_namespace(self) -> None:
        """Create the namespace (server-side apply) once, when the options allow it."""
        if not self.options.create_namespace or self._namespace_ready:
            return
        ns = self.options.namespace
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {MANAGED_LABEL: "skyfed"}}}
        await self._call(self._core.patch_namespace, ns, body, field_manager=kp.FIELD_MANAGER,
                         force=True, _content_type=kp.APPLY_CONTENT_TYPE)
        self._namespace_ready = True

    async def apply(self, *, spec: ApplySpec) -> None:
        """Companions first, then the workload object, all by server-side apply; a workload
        object whose spec hash is unchanged is left alone, a changed Job is replaced (its
        pod template is immutable)."""
        if spec.kind not in ("service", "batch", "train"):
            raise ProviderError(f"unknown workload kind {spec.kind!r} for {spec.workload_id!r}",
                                provider="kubernetes", region=self.name)
        await self._ensure_namespace()
        ns = self.options.namespace
        for companion in kn.companion_bodies(spec, namespace=ns, labels=own_labels(spec)):
            await self._apply_companion(companion, spec.workload_id)
        body = render(spec, namespace=ns, backoff_limit=self.options.job_backoff_limit)
        current = await self._read(body["kind"], body["metadata"]["name"])
        if current is not None:
            have = ((current.get("metadata") or {}).get("annotations") or {}).get(
                HASH_ANNOTATION)
            if have == body["metadata"]["annotations"][HASH_ANNOTATION]:
                return  # applying twice is applying once
            if body["kind"] == "Job":
                await self._delete_one(self._batch.delete_namespaced_job,
                                       body["metadata"]["name"], ns)
        await self._server_side_apply(body)

    async def _apply_companion(self, body: dict[str, Any], workload_id: str) -> None:
        """A companion is one workload's: a name held by another workload (or by something
        skyfed did not create) is a conflict, never overwritten."""
        kind, name = str(body["kind"]), str(body["metadata"]["name"])
        current = await self._read(kind, name)
        if current is not None:
            owner = ((current.get("metadata") or {}).get("labels") or {}).get(ID_LABEL)
            if owner != label_value(workload_id):
                raise ConflictError(
                    f"{kind} {name!r} in namespace {self.options.namespace!r} belongs to "
                    f"{'another workload' if owner else 'something skyfed did not create'}",
                    provider="kubernetes", region=self.name)
        await self._server_side_apply(body)

    async def _delete_one(self, fn: Callable[..., Any], name: str, ns: str) -> bool:
        try:
            await self._call(fn, name, ns, propagation_policy="Background")
            return True
        except NotFoundError:
            return False

    async def delete(self, *, workload_id: str) -> None:
        """Delete the workload's object and its companions; deleting what is gone is
        success."""
        name, ns = dns_name(workload_id), self.options.namespace
        for kind in WORKLOAD_KINDS:
            await self._delete_one(self._fn("delete", kind), name, ns)
        mine = label_value(workload_id)
        for kind in kn.COMPANION_KINDS:
            listed = self._sanitize(await self._call(self._fn("list", kind), ns,
                                                     label_selector=f"{ID_LABEL}={mine}"))
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                if (meta.get("labels") or {}).get(ID_LABEL) == mine:  # selector may be ignored
                    await self._delete_one(self._fn("delete", kind), str(meta.get("name")), ns)

    # ---- prewarm (kubernetes_prewarm.py) -------------------------------------------------
    async def prewarm(self, *, spec: PrewarmSpec) -> None:
        """Server-side apply the pre-pull DaemonSet and data-copy Jobs of `spec` (idempotent),
        after deleting the prewarm DaemonSets that expired (kubernetes_prewarm's docstring)."""
        ns, mine = self.options.namespace, kp.key_label(spec.key)
        now = time.time()
        for old in await self._list_all(self._apps.list_namespaced_daemon_set, namespace=ns,
                                        label_selector=kp.PREWARM_LABEL):
            labels = (old.get("metadata") or {}).get("labels") or {}
            if labels.get(kp.PREWARM_LABEL) != mine and \
                    kp.expired(old, now_s=now, keep_s=self.options.prewarm_keep_s):
                await self._delete_one(self._apps.delete_namespaced_daemon_set,
                                       str(old["metadata"]["name"]), ns)
        for body in kp.render_all(spec, namespace=ns, applied_s=now):
            name = body["metadata"]["name"]
            fn = (self._apps.patch_namespaced_daemon_set if body["kind"] == "DaemonSet"
                  else self._batch.patch_namespaced_job)
            await self._call(fn, name, ns, body, field_manager=kp.FIELD_MANAGER, force=True,
                             _content_type=kp.APPLY_CONTENT_TYPE)

    async def prewarm_done(self, *, key: str) -> bool:
        """True when the key's DaemonSet pods are all ready and its copy Jobs succeeded."""
        ns, sel = self.options.namespace, f"{kp.PREWARM_LABEL}={kp.key_label(key)}"
        found = False
        for lister, check in ((self._apps.list_namespaced_daemon_set, kp.daemonset_ready),
                              (self._batch.list_namespaced_job, kp.job_succeeded)):
            items = self._sanitize(await self._call(lister, ns, label_selector=sel))
            for obj in items.get("items") or []:
                labels = (obj.get("metadata") or {}).get("labels") or {}
                if labels.get(kp.PREWARM_LABEL) != kp.key_label(key):
                    continue  # the selector may be ignored: re-check
                found = True
                if not check(obj):
                    return False
        if not found:
            raise NotFoundError(f"no prewarm {key!r} in namespace {ns!r}",
                                provider="kubernetes", region=self.name)
        return True

    # ---- status ------------------------------------------------------------------------
    async def status(self, *, workload_id: str) -> DriverStatus:
        name, ns = dns_name(workload_id), self.options.namespace
        for kind in WORKLOAD_KINDS:
            obj = await self._read(kind, name)
            if obj is not None:
                return (job_status if kind == "Job" else deployment_status)(workload_id, obj)
        raise NotFoundError(f"workload {workload_id!r} not found in namespace {ns!r}",
                            provider="kubernetes", region=self.name)

    async def list_status(self) -> list[DriverStatus]:
        ns, sel = self.options.namespace, f"{MANAGED_LABEL}=skyfed"
        out = []
        for kind in WORKLOAD_KINDS:
            for item in await self._list_all(self._fn("list", kind), namespace=ns,
                                             label_selector=sel):
                st = status_of({**item, "kind": kind})  # selector may be ignored: re-check
                if st is not None:
                    out.append(st)
        return sorted(out, key=lambda s: s.workload_id)

    async def watch(self, *, stop: asyncio.Event) -> AsyncIterator[DriverStatus]:
        """Status changes of skyfed's Deployments, until `stop` is set.

        A thread runs the blocking list+watch loop and hands events to this generator; 410 Gone
        re-lists (and re-emits everything), read timeouts re-watch from the last version.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[DriverStatus | BaseException] = asyncio.Queue()
        halt = threading.Event()

        def emit(item: DriverStatus | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        worker = asyncio.create_task(asyncio.to_thread(self._watch_loop, emit, halt),
                                     name=f"k8s-watch-{self.name}")
        stopper = asyncio.create_task(stop.wait(), name=f"k8s-watch-stop-{self.name}")
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, stopper},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                item = getter.result()
                if isinstance(item, BaseException):
                    raise _map_error(item, cluster=self.name) from item
                yield item
        finally:
            halt.set()
            stopper.cancel()
            await asyncio.gather(worker, stopper, return_exceptions=True)

    def _watch_loop(self, emit: Callable[[DriverStatus | BaseException], None],
                    halt: threading.Event) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import ProtocolError, ReadTimeoutError

        api, ns = self._apps, self.options.namespace
        version: str | None = None
        failures = 0
        while not halt.is_set():
            try:
                if version is None:
                    lst = api.list_namespaced_deployment(
                        ns, _request_timeout=self.options.timeout_s)
                    version = lst.metadata.resource_version or ""
                    for item in self._sanitize(lst).get("items") or []:
                        st = status_of({**item, "kind": "Deployment"})
                        if st is not None:
                            emit(st)
                w = watch.Watch()
                for ev in w.stream(api.list_namespaced_deployment, ns,
                                   resource_version=version,
                                   _request_timeout=self.options.watch_timeout_s):
                    if halt.is_set():
                        w.stop()
                        break
                    obj = self._sanitize(ev["object"])
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    st = status_of({**obj, "kind": "Deployment"})
                    if st is not None:
                        emit(st)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    version = None  # too old: list again
                    continue
                failures += 1
                if failures >= 5:
                    emit(exc)
                    return
                halt.wait(min(2.0, 0.1 * 2**failures))
            except (ReadTimeoutError, ProtocolError, TimeoutError):
                continue  # quiet stream: watch again from the last version
            except Exception as exc:  # noqa: BLE001  top of the thread: hand it to the owner
                emit(exc)
                return

    # ---- inventory ---------------------------------------------------------------------
    async def _list_all(self, fn: Callable[..., Any], **kw: Any) -> list[dict[str, Any]]:
        """Every item of a list call, LIST_PAGE at a time (`limit` and `continue`, as
        client-go's pager reads large lists: the API server answers each page from one
        consistent snapshot without building the whole list in memory), as raw JSON: for
        5,000 pods the client's typed models and back cost ~22x the CPU of `json.loads`
        (`scripts/k8s_list_cost.py`). A continue token that expired (410) fails the call as
        TransientError; the poll that asked tries again on its next round."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = {**kw, "limit": LIST_PAGE, "_preload_content": False,
                    **({"_continue": token} if token else {})}
            body = json.loads((await self._call(fn, **page)).data or b"{}")
            if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
                raise ProviderError("a list answered with something else than a list",
                                    provider="kubernetes", region=self.name)
            items += [i for i in body.get("items") or [] if isinstance(i, dict)]
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def inventory(self) -> list[NodeInventory]:
        nodes = await self._list_all(self._core.list_node)
        try:
            pods = await self._list_all(self._core.list_pod_for_all_namespaces,
                                        field_selector=ACTIVE_PODS_SELECTOR)
        except NotFoundError:
            pods = []
        used = requested_by_node(pods)
        on = workloads_by_node(pods)
        out = []
        for n in nodes:
            name = (n.get("metadata") or {}).get("name", "")
            inv = node_inventory(n, used.get(name, (0.0, 0.0, 0.0, 0)))
            out.append(replace(inv, workloads=on.get(name, ())))
        return out

    # ---- metrics.k8s.io (telemetry) ----------------------------------------------------
    async def node_usage(self) -> dict[str, tuple[float, float]]:
        """Node name -> (cpu cores, memory GiB) in use, from metrics.k8s.io (metrics-server)."""
        from kubernetes import client

        api = client.CustomObjectsApi(self._api)
        body = await self._call(api.list_cluster_custom_object, "metrics.k8s.io", "v1beta1",
                                "nodes")
        out: dict[str, tuple[float, float]] = {}
        for item in (body or {}).get("items") or []:
            usage = item.get("usage") or {}
            out[str(item["metadata"]["name"])] = (
                quantity(usage.get("cpu")), round(quantity(usage.get("memory")) / 2**30, 3))
        return out

    async def pod_usage(self) -> dict[str, tuple[float, float]]:
        """``namespace/pod`` -> (cpu cores, memory GiB), summed over containers."""
        from kubernetes import client

        api = client.CustomObjectsApi(self._api)
        body = await self._call(api.list_namespaced_custom_object, "metrics.k8s.io", "v1beta1",
                                self.options.namespace, "pods")
        out: dict[str, tuple[float, float]] = {}
        for item in (body or {}).get("items") or []:
            cpu = mem = 0.0
            for c in item.get("containers") or []:
                cpu += quantity((c.get("usage") or {}).get("cpu"))
                mem += quantity((c.get("usage") or {}).get("memory")) / 2**30
            meta = item.get("metadata") or {}
            out[f"{meta.get('namespace', '')}/{meta.get('name', '')}"] = (cpu, round(mem, 3))
        return out
