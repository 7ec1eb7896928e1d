"""Changing a workload that exists: `skyfed apply`, `PUT` (upsert by name) and `PATCH`.

What a changed spec does depends on what changed (`change_of`), so that a placement is only
re-planned when it must change:

- nothing: nothing is written;
- only what runs in the pods (image, env, command, labels, the submitted manifests) -> a
  rollout: the same assignments are recorded as a new placement, which the dispatcher applies
  (the Kubernetes driver patches the object; its rolling update keeps the ready replicas);
- fewer replicas -> a scale in place: the same clusters and pools, replicas taken off the
  last assignments (a spread workload's off the largest, so it keeps its domains: `shrunk`),
  applied the same way; replicas the planner added for a latency SLO stay
  (placement/feasibility.py `scaled_down_replicas`);
- anything else (more replicas, resources, where it may run) -> re-planned: the workload goes
  back to the planner with the new spec; what runs keeps running until its new placement
  replaces it (a placement on the same cluster is applied as a patch, i.e. a scale).

A pending workload just gets the new spec. A finished one is not changed: applying its name
again submits a new workload. Every path is one unit of work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.domain import Assignment, Placement, WorkloadSpec, WorkloadStatus
from broker.errors import ConflictError, SpecError
from broker.placement.feasibility import scaled_down_replicas
from broker.store import UnitOfWork, WorkloadRecord
from broker.store.workloads import TERMINAL, is_workload_id

LIVE = (WorkloadStatus.PLACED, WorkloadStatus.RUNNING)
# Fields a PATCH may change on a workload submitted as Kubernetes manifests: the pod
# template is the manifests' (re-apply them to change it).
NATIVE_PATCHABLE = frozenset({"replicas", "priority", "userRegion", "latencySloMs",
                              "budgetUsdPerHour", "spotOk", "durationS", "affinity",
                              "antiAffinity", "avoidWorkloads", "spread"})


def change_of(old: WorkloadSpec, new: WorkloadSpec) -> str:
    """`none`, `rollout`, `scale-down` or `replan` (see the module docstring)."""
    if old == new:
        return "none"
    placed_alike = dataclasses.replace(new, image=old.image, env=old.env, command=old.command,
                                       labels=old.labels, native=old.native)
    if placed_alike == old:
        return "rollout"
    if dataclasses.replace(placed_alike, replicas=old.replicas) == old \
            and new.replicas < old.replicas:
        return "scale-down"
    return "replan"


def shrunk(assignments: tuple[Assignment, ...], replicas: int, *,
           spread: bool = False) -> tuple[Assignment, ...]:
    """The assignments holding `replicas` in place, taken off the last ones first.

    With `spread` (the workload asks for a spread over domains) they come off the largest
    assignment first (ties: the later one), so as many assignments as `replicas` allows keep
    one and the spread the planner placed keeps its domains; taken off the last ones, the
    tour's shop-frontend (3 on azure-weu, 1 on gcp-euw4, at least 2 clusters) scaled to 2
    lost gcp-euw4. The Kubernetes ReplicaSet controller ranks pods for deletion the same way
    (pkg/controller/controller_utils.go `ActivePodsWithRanks`: "doubled up < not doubled
    up", a pod sharing its node with more of the set goes first).
    """
    counts = [a.replicas for a in assignments]
    drop = sum(counts) - max(0, replicas)
    while drop > 0:
        i = max(range(len(counts)), key=lambda j: (counts[j], j)) if spread else \
            max(j for j, n in enumerate(counts) if n > 0)
        take = 1 if spread else min(drop, counts[i])
        counts[i] -= take
        drop -= take
    return tuple(dataclasses.replace(a, replicas=n)
                 for a, n in zip(assignments, counts, strict=True) if n > 0)


async def upsert(uow: UnitOfWork, *, tenant: str, ref: str | None,
                 spec: WorkloadSpec) -> tuple[WorkloadRecord, bool, str]:
    """Create or change the workload `ref` (an id or a name; None: the spec's name) of
    `tenant`; returns (record, created, what was done). Two concurrent calls for one new
    name make one workload: the second's insert is refused by the unique index on live
    workloads created by name (store `create_by_name`), and it changes the first's."""
    if ref is not None and is_workload_id(ref):
        existing: WorkloadRecord | None = await uow.workloads.resolve(ref, tenant=tenant,
                                                                      lock=True)
        if existing is not None and existing.workload.spec.name != spec.name:
            raise SpecError(f"metadata.name {spec.name!r} is not the name of {ref}",
                            loc=("body", "metadata", "name"))
        if existing is not None and existing.workload.status in TERMINAL:
            raise SpecError(f"workload {ref} is {existing.workload.status}; submit it again "
                            "by name", loc=("path", "ref"))
    else:
        if ref is not None and ref != spec.name:
            raise SpecError(f"metadata.name {spec.name!r} is not the name in the path "
                            f"({ref!r})", loc=("body", "metadata", "name"))
        existing = await uow.workloads.find_by_name(spec.name, tenant=tenant, lock=True)
    if existing is None:
        created = await uow.workloads.create_by_name(tenant=tenant, spec=spec)
        if created is not None:
            return created, True, "created"
        # A concurrent PUT of the same new name committed first: change that one instead.
        existing = await uow.workloads.find_by_name(spec.name, tenant=tenant, lock=True)
        if existing is None:  # pragma: no cover - it finished in between; the client retries
            raise ConflictError(f"workload {spec.name!r} changed concurrently; retry")
    w = existing.workload
    change = change_of(w.spec, spec)
    if change == "none":
        return existing, False, "unchanged"
    active = await uow.placements.get_active_for_workload(w.id) if w.status in LIVE else None
    if active is None or change == "replan":
        message = "spec changed: re-planned" if w.status in LIVE else "spec changed"
        rec = await uow.workloads.update_spec(w.id, spec, message=message, requeue=True)
        return rec, False, "replanned" if w.status in LIVE else "updated"
    p = active.placement
    if change == "rollout":
        assignments, message = p.assignments, "rolling out the changed spec"
    else:
        keep = scaled_down_replicas(w.spec.replicas, spec.replicas, p.placed_replicas)
        assignments = shrunk(p.assignments, keep, spread=spec.spread is not None)
        message = f"scaled in place to {spec.replicas} replicas" + (
            f" (+{keep - spec.replicas} for the latency SLO)" if keep > spec.replicas else "")
    await uow.workloads.update_spec(w.id, spec, message=message, requeue=False)
    await uow.placements.record(Placement(
        workload_id=w.id, assignments=assignments,
        cost_usd_per_hour=p.cost_usd_per_hour * sum(a.replicas for a in assignments)
        / max(1, sum(a.replicas for a in p.assignments)),
        rtt_ms=p.rtt_ms, decision=dict(p.decision)), status=w.status, message=message)
    return await uow.workloads.get(w.id), False, change


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: objects merge, `null` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# Spec keys of the view that come from the manifests, not the Workload kind: the PATCH route
# carries them over from the stored spec (routes.patch_workload).
VIEW_ONLY = ("objects", "clusterNames", "replicaSplit", "staticWeightList")


def patched_document(view: dict[str, Any], patch: Any, *, native: bool) -> dict[str, Any]:
    """The skyfed `Workload` document of a workload (`views.workload_view`) with `patch`
    merged in, ready for validation; SpecError for what a patch may not change."""
    if not isinstance(patch, dict):
        raise SpecError("a merge patch is a JSON object", loc=("body",))
    meta = patch.get("metadata")
    if isinstance(meta, dict) and "name" in meta and meta["name"] != view["metadata"]["name"]:
        raise SpecError("the name cannot be changed", loc=("body", "metadata", "name"))
    spec_patch = patch.get("spec")
    if native and isinstance(spec_patch, dict):
        for key in spec_patch:
            if key not in NATIVE_PATCHABLE:
                raise SpecError(f"{key} of a workload submitted as Kubernetes manifests is "
                                "theirs: apply the changed manifests", loc=("body", "spec", key))
    base = {"apiVersion": "skyfed.io/v1", "kind": "Workload",
            "metadata": {"name": view["metadata"]["name"],
                         "labels": view["metadata"]["labels"]},
            "spec": {k: v for k, v in view["spec"].items() if k not in VIEW_ONLY}}
    doc: dict[str, Any] = merge_patch(base, {k: v for k, v in patch.items()
                                             if k in ("metadata", "spec")})
    return doc
