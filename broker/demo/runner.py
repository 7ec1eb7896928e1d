"""`skyfed demo`: start everything, then narrate five steps.

1. submit a realistic mix (services with latency SLOs from several user
   regions, batch jobs, GPU jobs with a data set to prewarm);
2. the live placements, and LP vs greedy vs traditional on the same batch;
3. one decision explained, one what-if;
4. kill -9 one edge agent and time the failover;
5. the loop closes: pools the actuator grew, a prewarm, a cloud cluster that fails and
   recovers and the service that moves back (broker/demo/closing.py);
6. where to look next.

Everything goes through the public API (httpx, the admin token) or the public
MQTT protocol, like any client would; only the baseline comparison calls the
planner directly, because the live broker runs one policy. A step whose piece
is missing prints a `SKIPPED:` line and the demo goes on; the exit code is 0
when every step that could run did.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from broker.demo import report
from broker.demo.closing import close_the_loop
from broker.demo.compare import (
    Comparison,
    batch_epoch,
    demo_snapshot,
    differences,
    live_comparison,
    resolved_comparison,
)
from broker.demo.federation import DemoFederation, load_demo_federation
from broker.demo.stack import DemoStack, free_port
from broker.domain import PolicyAction
from broker.settings import Settings, load_settings

PLACE_TIMEOUT_S = 40.0
DISPATCH_TIMEOUT_S = 10.0
DECIDED = {"placed", "running", "succeeded", "failed", "cancelled", "unplaceable"}
SETTLED = DECIDED - {"placed"}  # placed and then applied by the dispatcher (or final)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    config: Path | None = None
    data_dir: Path | None = None
    serve: bool = False
    port: int = 0
    agents: bool = True


def demo_settings(data_dir: Path, port: int) -> Settings:
    """Embedded defaults in `data_dir`: SQLite, in-process MQTT on a free port, fast epochs."""
    return load_settings(
        data_dir=data_dir, log_level="WARNING",
        store={"url": ""},
        api={"host": "127.0.0.1", "port": port},
        mqtt={"url": f"mqtt://127.0.0.1:{free_port()}", "embedded": True, "keepalive_s": 2},
        placement={"epoch_s": 0.5},
        reconciler={"poll_s": 0.5, "down_after": 2},
        actuator={"poll_s": 0.25},
    )


class Narrator:
    """Runs the steps against a started `DemoStack`."""

    def __init__(self, stack: DemoStack, fed: DemoFederation, console: Console) -> None:
        self.stack = stack
        self.fed = fed
        self.console = console
        self.api = httpx.AsyncClient(base_url=stack.url, timeout=15.0,
                                     headers={"Authorization": f"Bearer {stack.token}"})
        self.workloads: list[dict[str, Any]] = []
        self.placements: dict[str, dict[str, Any]] = {}  # workload name -> placement view
        self.display: dict[str, str] = {}  # workload id -> workload name

    async def aclose(self) -> None:
        await self.api.aclose()

    # ------------------------------------------------------------------ 1
    async def submit(self) -> None:
        report.step(self.console, 1, "Register the federation and submit a realistic mix")
        for body in self.fed.cluster_payloads():
            (await self.api.post("/v1/clusters", json=body)).raise_for_status()
        sites = self.fed.site_payloads()
        for body in sites:
            (await self.api.post("/v1/sites", json=body)).raise_for_status()
        self.console.print(f"{len(self.fed.clusters)} clusters in real regions "
                           f"({', '.join(c.region_key for c in self.fed.clusters)}) and "
                           f"{len(sites)} edge sites, priced from the catalog")
        for manifest in self.fed.workload_manifests():
            r = await self.api.post("/v1/workloads", json=manifest,
                                    headers={"Idempotency-Key": uuid.uuid4().hex})
            r.raise_for_status()
            spec = manifest["spec"]
            what = f"{spec['replicas']} x {spec['resources']['cpu']:g} cpu"
            if spec["resources"].get("gpu"):
                model = spec["resources"].get("gpuModel") or "GPU"
                what += f" + {spec['resources']['gpu']} {model}"
            users = next((w.users for w in self.fed.workloads
                          if w.spec.name == manifest["metadata"]["name"]), None)
            slo = f", SLO {spec['latencySloMs']:g} ms from {users} ({spec['userRegion']})" \
                if spec.get("latencySloMs") else ""
            data = f", {spec['data'][0]['sizeGb']:g} GB data in {spec['data'][0]['location']}" \
                if spec.get("data") else ""
            self.console.print(f"  submitted {manifest['metadata']['name']:<22} "
                               f"{spec['kind']:<8} {what}{slo}{data}")

    async def wait_placed(self) -> bool:
        """Until the placement loop decided every workload, then (briefly) until the
        dispatcher applied them; progress on one live line."""
        has_loop = any("placement" in n for n in self.stack.loop_names)
        t0 = time.monotonic()
        place_by = t0 + (PLACE_TIMEOUT_S if has_loop else 3.0)
        with self.console.status("waiting for the placement loop...") as status:
            while True:
                r = await self.api.get("/v1/workloads", params={"limit": 200})
                r.raise_for_status()
                self.workloads = r.json()["items"]
                phases = [w["status"]["phase"] for w in self.workloads]
                decided = sum(p in DECIDED for p in phases)
                settled = sum(p in SETTLED for p in phases)
                status.update(f"placement loop: {decided}/{len(phases)} decided, "
                              f"dispatcher: {settled} applied")
                now = time.monotonic()
                if settled == len(phases) or now > place_by + DISPATCH_TIMEOUT_S:
                    break
                if decided < len(phases) and now > place_by:
                    break
                await asyncio.sleep(0.3)
        self.console.print(f"placement loop decided {decided}/{len(phases)} and the "
                           f"dispatcher applied {settled} in {time.monotonic() - t0:.1f} s")
        for w in self.workloads:
            pid = w["status"].get("placementId")
            if pid:
                p = await self.api.get(f"/v1/placements/{pid}")
                if p.status_code == 200:
                    self.placements[w["metadata"]["name"]] = p.json()
        return bool(self.placements)

    # ------------------------------------------------------------------ 2
    def _planner_inputs(self, snapshot: Any) -> tuple[PolicyAction, Any]:
        """The fixed-weight action and the live loop's planner config, for a re-solve."""
        from broker.federation.placement_loop import fixed_action, planner_config

        settings = self.stack.settings.placement
        return fixed_action(settings)(snapshot), planner_config(settings)

    def comparison(self) -> Comparison:
        """The live placement loop's own epoch for the submitted batch when there is one
        (compare.py `live_comparison`), else a re-solve that says it is one."""
        loop = self.stack.runtime.placement_loop if self.stack.runtime is not None else None
        ids = {str(w["id"]) for w in self.workloads}
        epoch = batch_epoch(list(loop.solved), ids) if loop is not None else None
        if loop is not None and epoch is not None:
            return live_comparison(epoch, loop.config, loop.policy)
        why = ("the placement loop is not running" if loop is None else
               "no epoch of the placement loop solved the whole batch")
        action, config = self._planner_inputs(demo_snapshot(self.fed))
        return resolved_comparison(self.fed, config, action, why)

    def _data_moves(self) -> list[tuple[str, float, str, str, float, float]]:
        """Input data sets vs where their workload landed, priced and timed by the catalog."""
        from providers.catalog import Catalog
        from providers.errors import ProviderError

        cat = Catalog.load()
        keys = {c.name: c.region_key for c in self.fed.clusters}
        moves = []
        for w in self.fed.workloads:
            p = self.placements.get(w.spec.name)
            if not w.spec.data or not p or not p.get("assignments"):
                continue
            dst = keys.get(p["assignments"][0]["cluster"], p["assignments"][0]["cluster"])
            for d in w.spec.data:
                try:
                    usd = cat.egress_usd_per_gb(d.location, dst) * d.size_gb
                    hours = d.size_gb * 8 / max(cat.throughput_gbps(d.location, dst), 1e-3) / 3600
                except ProviderError:  # an edge site has no catalog region
                    usd, hours = 0.0, 0.0
                moves.append((w.spec.name, d.size_gb, d.location, dst, usd,
                              0.0 if d.location == dst else hours))
        return moves

    def _rows(self) -> list[report.PlacementRow]:
        where = {c.name: (c.provider, c.region) for c in self.fed.clusters}
        where.update({s.name: ("edge", s.name) for s in self.fed.sites})
        rows = []
        for w in self.workloads:
            name = w["metadata"]["name"]
            p = self.placements.get(name, {})
            asg = p.get("assignments") or []
            provider, region = where.get(asg[0]["cluster"], ("?", asg[0]["cluster"])) \
                if asg else ("", "")
            rows.append(report.PlacementRow(
                workload=name, kind=w["spec"]["kind"], status=w["status"]["phase"],
                provider=provider, where=region + ("" if len(asg) < 2 else f" +{len(asg) - 1}"),
                pool=", ".join(sorted({a["pool"] for a in asg})),
                replicas=sum(a["replicas"] for a in asg),
                usd_per_hour=p.get("costUsdPerHour"), rtt_ms=p.get("rttMs"),
                slo_ms=w["spec"].get("latencySloMs"), placement_id=p.get("id")))
        return rows

    async def show_placements(self, live: bool) -> None:
        report.step(self.console, 2, "Where everything went, and what it saves")
        cmp = self.comparison()
        if live:
            self.console.print(report.placement_table(
                self._rows(), title=f"Placements (live broker, {cmp.placed_by or 'LP policy'})"))
        else:
            report.skipped(self.console, "live placement table",
                           "nothing was placed by the live broker (loops running: "
                           f"{', '.join(self.stack.loop_names) or 'none'}; the placement loop "
                           "is built in broker/app.py's build_loops)")
        if live:
            for line in report.data_lines(self._data_moves()):
                self.console.print(f"  data: {line}")
        results = await asyncio.to_thread(cmp.results)
        self.console.print(report.comparison_table(results, title=cmp.title))
        self.console.print(f"[dim]{cmp.note}[/]")
        self.console.print(f"[dim]{report.comparison_caption()}[/]")
        names = {w.id: w.spec.name for w in cmp.snapshot.pending}
        for policy in ("greedy", "traditional"):
            diff = differences(results, policy, names)
            if diff:
                self.console.print(f"  {policy} differs on {len(diff)}: " + "; ".join(diff))

    # ------------------------------------------------------------------ 3
    async def explain_and_whatif(self) -> None:
        report.step(self.console, 3, "Why there? Explain one decision, then ask what if")
        name = next((n for n in ("llm-finetune", *self.placements) if n in self.placements), None)
        if name is None:
            await self._local_explain()
            return
        p = self.placements[name]
        r = await self.api.get(f"/v1/placements/{p['id']}/explain")
        rec: Any = r.json() if r.status_code == 200 else p.get("decision") or {}
        if r.status_code != 200:
            report.skipped(self.console, "GET /v1/placements/{id}/explain",
                           f"HTTP {r.status_code}; showing the placement's stored decision record")
        if isinstance(rec, dict) and isinstance(rec.get("decision"), dict):
            rec = rec["decision"]
        self.console.print(f"[bold]skyfed explain {p['id']}[/]  ({name})")
        for line in report.explanation_lines(rec) or [str(rec)[:600]]:
            self.console.print(f"  {line}")
        chosen = {a["cluster"] for a in p.get("assignments", [])}
        gpu = {c.name for c in self.fed.clusters if any(pl.node.gpu >= 8 for pl in c.pools)}
        target = sorted(gpu - chosen) or sorted({c.name for c in self.fed.clusters} - chosen)
        if not target:
            return
        body = {"cluster": target[0]}
        w = await self.api.post(f"/v1/placements/{p['id']}/whatif", json=body)
        self.console.print(f"[bold]skyfed whatif {p['id']} --cluster {target[0]}[/]")
        answer: Any
        if w.status_code == 200:
            answer = w.json()
        else:
            report.skipped(self.console, "POST /v1/placements/{id}/whatif",
                           f"HTTP {w.status_code}; re-solving the same batch with the planner")
            answer = await asyncio.to_thread(self._local_whatif, name, target[0])
        for line in report.whatif_lines(answer):
            self.console.print(f"  {line}")

    async def _local_explain(self) -> None:
        """No live placement: explain the planner's decision on the same snapshot instead."""
        from broker.placement.planner import plan_epoch

        report.skipped(self.console, "live explain (GET /v1/placements/{id}/explain)",
                       "nothing was placed live; explaining the planner's LP decision on the "
                       "same snapshot")
        cmp = self.comparison()
        snapshot = cmp.snapshot
        live = cmp.solved.get("lp")
        plan = live if live is not None else await asyncio.to_thread(
            plan_epoch, snapshot, cmp.action, cmp.config)
        names = {w.id: w.spec.name for w in snapshot.pending}
        chosen = next((p for p in plan.placements if names.get(p.workload_id) == "llm-finetune"),
                      plan.placements[0] if plan.placements else None)
        if chosen is None:
            report.skipped(self.console, "explain and what-if", "the planner placed nothing")
            return
        name = names[chosen.workload_id]
        self.console.print(f"[bold]decision for {name}[/] (planner, policy lp)")
        for line in report.explanation_lines(chosen.decision):
            self.console.print(f"  {line}")
        clusters = {a.cluster for a in chosen.assignments}
        gpu = sorted(c.name for c in self.fed.clusters
                     if c.name not in clusters and any(pl.node.gpu >= 8 for pl in c.pools))
        if gpu:
            self.console.print(f"[bold]what if {name} ran on {gpu[0]}?[/] (planner re-solve)")
            answer = await asyncio.to_thread(self._local_whatif, name, gpu[0])
            for line in report.whatif_lines(answer):
                self.console.print(f"  {line}")

    def _local_whatif(self, name: str, cluster: str) -> dict[str, Any]:
        from broker.placement.explain import whatif

        cmp = self.comparison()
        snapshot = cmp.snapshot
        wid = next(w.id for w in snapshot.pending if w.spec.name == name)
        answer = whatif(snapshot, cmp.action, cmp.config, wid, cluster)
        names = {w.id: w.spec.name for w in snapshot.pending}
        answer["others_moved"] = [names.get(i, i) for i in answer.get("others_moved", [])]
        return answer

    # ------------------------------------------------------------------ 4
    async def failover(self) -> None:
        from broker.demo.failover import RouteWatcher, observe_failover

        report.step(self.console, 4, "Kill an edge agent (kill -9) and watch the failover")
        stack = self.stack
        if stack.fleet is None or stack.hub is None:
            report.skipped(self.console, "edge failover", "; ".join(stack.notes) or "no agents")
            return
        host, port = stack.mqtt_host_port
        # The hub adopts the latency-critical services the LP put on edge sites by
        # itself (broker/federation/edge_services.py), under their workload ids.
        self.display = {str(p["workloadId"]): name for name, p in self.placements.items()}
        names = [str(self.placements[w.spec.name]["workloadId"]) for w in self.fed.workloads
                 if w.edge and w.spec.name in self.placements]
        async with RouteWatcher(host, port).running() as watcher:
            ready = await watcher.wait_for(
                lambda v: any(self._standby_ready(n) and v.route(n) is not None for n in names),
                15.0)
            await asyncio.sleep(0.3)  # let the other services settle too, for the listing
            for n in names:
                r = watcher.route(n)
                standby, warm = self._standby(n)
                self.console.print(f"  route {self._name(n)}: serving at {r.site if r else '?'}, "
                                   f"warm standby at {standby or 'none within the RTT target'}"
                                   f"{'' if warm or not standby else ' (warming)'}")
            victim = next((n for n in names if self._standby_ready(n)), None)
            if not ready or victim is None:
                report.skipped(self.console, "edge failover",
                               "no edge service had a ready warm standby within 15 s")
                return
            obs = await observe_failover(watcher, victim, stack.fleet.kill)
            self._print_failover(victim, obs)
            await self._restart(watcher, victim, obs.killed_site)
        await self._print_event_log()

    async def _print_event_log(self) -> None:
        """What the broker persisted about the edge (the dashboard's failover log source)."""
        await asyncio.sleep(0.2)  # the hub records asynchronously
        async with self.stack.store.unit() as uow:
            events = await uow.events.list(limit=1000)
        edge = [e for e in events if e.kind.startswith(("edge.", "site."))]
        counts: dict[str, int] = {}
        for e in edge:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        if counts:
            self.console.print("  event log: " + ", ".join(f"{k} x{v}" for k, v in
                                                          sorted(counts.items())))

    def _print_failover(self, victim: str, obs: Any) -> None:
        self.console.print(f"  killed the agent of {obs.killed_site} (SIGKILL)")
        self.console.print(f"  detection (Last Will on the broker): {_ms(obs.detect_ms)}")
        self.console.print(f"  standby serving + route published:  {_ms(obs.serving_ms)}")
        if obs.new_site:
            self.console.print(f"  new route: {self._name(victim)} -> {obs.new_site} "
                               f"(epoch {obs.epoch}), new standby {obs.new_standby or '-'}")
        for rec in list(getattr(getattr(self.stack.hub, "core", None), "failovers", []))[-1:]:
            self.console.print(f"  hub's own record: last heard -> declared down "
                               f"{rec.detect_ms:.1f} ms (cause: {rec.cause}), declared down -> "
                               f"standby serving {rec.serving_ms:.1f} ms")

    async def _restart(self, watcher: Any, service: str, site: str) -> None:
        """Bring the killed site back: the hub re-admits it and moves the service back only
        if that pays by more than the hysteresis (edge.rebalance_hysteresis)."""
        fleet = self.stack.fleet
        if fleet is None:
            return
        t0 = time.monotonic()
        await fleet.start(site)
        if not await watcher.wait_for(lambda v: v.online(site), 10.0):
            report.skipped(self.console, "site recovery", f"{site}'s agent did not come back")
            return
        self.console.print(f"  restarted {site}'s agent: online again after "
                           f"{1000 * (time.monotonic() - t0):.0f} ms")
        await watcher.wait_for(lambda v: self._standby(service)[0] != "", 3.0)
        route = watcher.route(service)
        standby, _ = self._standby(service)
        where = route.site if route else "?"
        self.console.print(f"  {self._name(service)} now served at {where}, warm standby "
                           f"{standby or '-'} (moves back only if it beats the hysteresis)")

    def _standby(self, service: str) -> tuple[str, bool]:
        """(standby site, ready) from the hub's own state (it runs in this process)."""
        st = getattr(getattr(self.stack.hub, "core", None), "services", {}).get(service)
        return (str(st.standby), bool(st.standby_ready)) if st is not None else ("", False)

    def _standby_ready(self, service: str) -> bool:
        standby, ready = self._standby(service)
        return bool(standby) and ready

    def _name(self, service: str) -> str:
        """`name (workload id)` for a service the hub knows by its workload id."""
        name = self.display.get(service)
        return f"{name} ({service})" if name else service


def _ms(v: float | None) -> str:
    return "not seen" if v is None else f"{v:.1f} ms"


async def run_demo(opts: DemoOptions, console: Console) -> int:
    t0 = time.monotonic()
    fed = load_demo_federation(opts.config)
    tmp: contextlib.AbstractContextManager[Any]
    if opts.data_dir is None:
        import tempfile

        tmp = tempfile.TemporaryDirectory(prefix="skyfed-demo-", ignore_cleanup_errors=True)
    else:
        tmp = contextlib.nullcontext(str(opts.data_dir))
    with tmp as data_dir:
        settings = demo_settings(Path(data_dir), opts.port)
        console.print(f"[bold]skyfed demo[/]: {fed.name}, data in {data_dir} (SQLite), "
                      f"MQTT {settings.mqtt.url} (in-process)")
        async with DemoStack(settings, fed, agents=opts.agents) as stack:
            console.print(f"broker API {stack.url} · loops: {', '.join(stack.loop_names) or 'none'}"
                          + (f" · {len(stack.fleet.agents)} skyfed-edge agents (pids "
                             f"{', '.join(str(a.pid) for a in stack.fleet.agents.values())})"
                             if stack.fleet else ""))
            for note in stack.notes:
                report.skipped(console, "startup", note)
            n = Narrator(stack, fed, console)
            try:
                await n.submit()
                await stack.start_loops()
                live = await n.wait_placed()
                await n.show_placements(live)
                await n.explain_and_whatif()
                await n.failover()
                await close_the_loop(n, 5)
            finally:
                await n.aclose()
            report.step(console, 6, "Where to look next")
            report.next_steps(console, url=stack.url, data_dir=str(data_dir),
                              token_file=str(stack.token_file()), elapsed_s=time.monotonic() - t0,
                              serve=opts.serve, token=stack.token)
            if opts.serve:
                await _until_signal(console)
    return 0


async def _until_signal(console: Console) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    console.print("serving; press Ctrl-C to stop")
    await stop.wait()
