"""Demo step: the loop closes. What the actuator did with the epoch's other decisions.

Printed from the broker's own event log (`GET /v1/events`), as an operator would read it:

- pools the actuator grew for the placements (`scale.ordered` -> `scale.done`: the
  simulated cloud pools start at their registered size and their new nodes boot first);
- images and data prewarmed on a cloud cluster before a GPU job starts (`prewarm.*`);
- a cloud cluster fails (its API stops answering): the reconciler moves its work away and
  remembers where from; the cluster comes back, and the planner's "recovered" migration
  takes a service home: `migration.started` -> `switched` -> `done`, the target ready
  before the source drains.

A decision the planner did not make prints a `SKIPPED:` line naming the decision type.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from broker.demo import report

if TYPE_CHECKING:
    from broker.demo.runner import Narrator

FAILOVER_WAIT_S = 8.0
MOVE_BACK_WAIT_S = 5.0
SERVICE = "checkout-us"


async def close_the_loop(n: Narrator, step: int) -> None:
    report.step(n.console, step, "The loop closes: scale up, prewarm, move back after recovery")
    ids = {str(p["workloadId"]): name for name, p in n.placements.items()}
    events = await _events(n)
    _print_scale(n, events)
    _print_prewarm(n, events, ids)
    await _fail_and_recover(n, ids)


async def _events(n: Narrator, after: int = 0) -> list[dict[str, Any]]:
    """Every event after id `after`, oldest first (paged like any API client)."""
    out: list[dict[str, Any]] = []
    while True:
        r = await n.api.get("/v1/events", params={"limit": 1000, "after": after})
        r.raise_for_status()
        page = r.json()
        out += page.get("items", [])
        if not page.get("nextCursor"):
            return out
        after = int(page["nextCursor"])


def _print_scale(n: Narrator, events: list[dict[str, Any]]) -> None:
    ordered = {e["subject"]: e for e in events if e["kind"] == "scale.ordered"}
    done = {e["subject"]: e for e in events if e["kind"] == "scale.done"}
    if not ordered:
        report.skipped(n.console, "pool scale-up", "no placement of the mix needed a new node")
    for pool, e in sorted(ordered.items()):
        d = e.get("data") or {}
        joined = done.get(pool)
        after = f", joined {joined['ts'] - e['ts']:.1f} s later (scale.done)" if joined else ""
        n.console.print(f"  scale.ordered  {pool}: to {d.get('target_nodes')} nodes for "
                        f"{d.get('reason') or 'the plan'}, via {d.get('via')}{after}")


def _print_prewarm(n: Narrator, events: list[dict[str, Any]], ids: dict[str, str]) -> None:
    """The GPU jobs' prewarms on cloud clusters, each against when the job started."""
    started = {e["data"].get("decision"): e for e in events if e["kind"] == "prewarm.started"}
    done = {e["data"].get("decision"): e for e in events if e["kind"] == "prewarm.done"}
    running = {e["subject"]: e["ts"] for e in events if e["kind"] == "workload.running"}
    gpu = {w.spec.name for w in n.fed.workloads if w.spec.resources.gpu}
    edge = {s.name for s in n.fed.sites}
    shown = 0
    for did, e in started.items():
        d = e.get("data") or {}
        wid = str(d.get("workload", ""))
        name = ids.get(wid, wid)
        if name not in gpu or d.get("cluster") in edge:
            continue
        what = ", ".join([*d.get("images", []), *d.get("data", [])])
        fin = done.get(did)
        took = f", done {fin['ts'] - e['ts']:.1f} s later" if fin else ""
        job = f"; {name} running {running[wid] - e['ts']:.1f} s after it started" \
            if wid in running else ""
        n.console.print(f"  prewarm.started  {e['subject']}: {what} for {name}{took}{job}")
        shown += 1
    if not shown:
        report.skipped(n.console, "cloud-cluster prewarm",
                       "the planner decided no prewarm (planner.Prewarm) for a GPU job")
    elif len(started) > shown:
        n.console.print(f"  ({len(started) - shown} more prewarms: one per image and pool)")


async def _fail_and_recover(n: Narrator, ids: dict[str, str]) -> None:
    """Take the cluster running SERVICE down and back up; show what the loop did."""
    p = n.placements.get(SERVICE)
    drivers = n.stack.runtime.drivers if n.stack.runtime is not None else {}
    cluster = p["assignments"][0]["cluster"] if p and p.get("assignments") else ""
    driver: Any = drivers.get(cluster)
    if not cluster or not hasattr(driver, "set_down"):
        report.skipped(n.console, "cluster failure and recovery",
                       f"{SERVICE} is not on a simulated cloud cluster")
        return
    wid = str(p["workloadId"]) if p else ""
    mark = max((e["id"] for e in await _events(n)), default=0)
    driver.set_down(True)
    t0 = time.monotonic()
    moved = await _until(n, lambda w: w["status"]["phase"] == "running" and _where(w) not in
                         ("", cluster), wid, FAILOVER_WAIT_S)
    if moved is None:
        driver.set_down(False)
        report.skipped(n.console, "failover of a cloud cluster",
                       f"{SERVICE} was not running elsewhere {FAILOVER_WAIT_S:.0f} s after "
                       f"{cluster} went down")
        return
    n.console.print(f"  {cluster} stops answering: the reconciler marks it unhealthy and "
                    f"{SERVICE} runs on {_where(moved)} {time.monotonic() - t0:.1f} s later "
                    f"(it remembers {cluster})")
    driver.set_down(False)
    t1 = time.monotonic()
    home = await _until(n, lambda w: _where(w) == cluster, wid, MOVE_BACK_WAIT_S)
    if home is not None:  # switched: the drain follows within a pass or two
        await _until_event(n, "migration.done", wid, mark, 3.0)
    for e in await _events(n, after=mark):
        if e["kind"].startswith("migration.") and e["subject"] == wid:
            d = e.get("data") or {}
            n.console.print(f"  {e['kind']:<20} {SERVICE}: {d.get('reason', '')} "
                            f"(decision {d.get('decision')})")
    if home is None:
        report.skipped(n.console, "migration back after recovery",
                       f"no planner.Migration 'recovered' moved {SERVICE} back to {cluster} "
                       f"within {MOVE_BACK_WAIT_S:.0f} s")
        return
    n.console.print(f"  {cluster} is back: {SERVICE} moved home {time.monotonic() - t1:.1f} s "
                    f"later, its target ready before the source drained")


async def _until_event(n: Narrator, kind: str, subject: str, after: int,
                       timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e["kind"] == kind and e["subject"] == subject
               for e in await _events(n, after=after)):
            return True
        await asyncio.sleep(0.25)
    return False


def _where(w: dict[str, Any]) -> str:
    return str(w["status"].get("cluster") or "")


async def _until(n: Narrator, cond: Any, wid: str, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = await n.api.get(f"/v1/workloads/{wid}")
        if r.status_code == 200:
            w = r.json()
            pid = w["status"].get("placementId")
            if pid:
                pr = await n.api.get(f"/v1/placements/{pid}")
                if pr.status_code == 200:
                    asg = pr.json().get("assignments") or []
                    w["status"]["cluster"] = asg[0]["cluster"] if asg else ""
            if cond(w):
                return dict(w)
        await asyncio.sleep(0.25)
    return None
