"""The edge hub's core: site health, warm standbys, failover, rebalance. Pure, synchronous.

`HubCore` does no I/O and reads no clock: inputs are decoded protocol messages
plus "now" in ms; outputs are `Send` (a command to an agent), `PublishRoute`
(retained) and `Record` (an event to persist); these and the state it keeps are
the dataclasses of edge_state.py. `broker/federation/edge_hub.py`
is the shell that feeds it from MQTT and carries its actions out; unit tests
drive it directly with a fake clock.

Health: `healthy -> suspect` after `suspect_after_ms` without a heartbeat,
`-> down` after `down_after_ms`, or at once on the retained Last Will
`offline` (Mosquitto sends it ~2 ms after a crashed agent's socket closes; a
frozen or partitioned agent keeps its socket, so only heartbeats reveal it).

Failover of a service whose serving site goes down: bump the route epoch,
promote the warm standby (a role flip on an already-running service; one
batched command per target site), and when its ack arrives publish the new
route and place a new standby (`broker/placement/standby.py`), ordering its
prewarm. Without a ready standby the best feasible site gets a cold start. A
site that comes back is told its current roles again (with the current epoch,
which fences a stale "serving" agent), and services move back to it only when
`should_rebalance` says the gain beats the hysteresis. Commands not acked in
`command_timeout_ms` are re-sent with the same id (agents de-duplicate).

Timings recorded per failover: `detect_ms` (last heard -> declared down) and
`serving_ms` (declared down -> route published with the standby serving).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import replace

from broker.domain import Resources, Site, SiteHealth
from broker.federation.edge_commands import CommandBook
from broker.federation.edge_state import (
    Action,
    EdgeService,
    FailoverRecord,
    PendingCommand,
    PublishRoute,
    Record,
    Send,
    ServiceState,
    SiteState,
)
from broker.placement.standby import plan_standbys, rank_sites, should_rebalance
from broker.settings import EdgeSettings
from edge_agent.protocol import (
    Ack,
    Heartbeat,
    Route,
    Status,
    Telemetry,
    Topics,
)

__all__ = [
    "Action",
    "EdgeService",
    "FailoverRecord",
    "HubCore",
    "PublishRoute",
    "Record",
    "Send",
]


class HubCore:
    """Pure state machine; see the module docstring."""

    def __init__(self, settings: EdgeSettings, *, command_timeout_ms: float = 2000.0,
                 rebalance_every_ms: float = 10_000.0, rebalance_batch: int = 25,
                 history: int = 10_000, rtt_record_every_ms: float = 2000.0) -> None:
        self.settings = settings
        # How often a site's measured RTTs are handed to the recorder (the placement
        # snapshot reads them from the store; heartbeats are far too frequent to persist).
        self.rtt_record_every_ms = rtt_record_every_ms
        self.sites: dict[str, SiteState] = {}
        self.services: dict[str, ServiceState] = {}
        self.commands = CommandBook(timeout_ms=command_timeout_ms)
        self.pending = self.commands.pending  # command id -> what its ack will settle
        self.failovers: deque[FailoverRecord] = deque(maxlen=history)
        self._seen_events: deque[str] = deque(maxlen=history)
        self._seen_set: set[str] = set()
        self._rebalance_every_ms = rebalance_every_ms
        self._last_rebalance_ms = 0.0
        # Services to re-evaluate, a few per tick: a full pass over 500 services x 50
        # sites costs tens of ms, which must not sit in front of a failover.
        self._rebalance_queue: deque[str] = deque()
        self._rebalance_queued: set[str] = set()
        self._rebalance_batch = rebalance_batch
        # The shell's tick interval; set (EdgeHub does) to enable the pause guard in tick().
        self.expected_tick_ms: float | None = None
        # Heard continuously this long, a down site counts as back (0: at once).
        self.rejoin_after_ms = float(settings.suspect_after_ms)
        # Queued, unread heartbeats above this: the silence may be ours; no timeouts.
        self.backlog_limit = 50
        self._standbys_due = False
        self._last_tick_ms = 0.0
        self._route_epochs: dict[str, int] = {}
        self._route_sites: dict[str, str] = {}  # from retained routes: where it runs now

    # registration
    def add_site(self, site: Site, now_ms: float) -> None:
        st = self.sites.get(site.name)
        if st is None:
            self.sites[site.name] = SiteState(site=site, health=SiteHealth.DOWN)
        else:
            st.site = site

    def add_service(self, svc: EdgeService, now_ms: float) -> list[Action]:
        Topics.check_name(svc.spec.name)
        state = self.services.setdefault(svc.spec.name, ServiceState(svc=svc))
        state.svc = svc
        state.epoch = max(state.epoch, self._route_epochs.get(svc.spec.name, 0))
        if state.primary:
            return []
        return self._serve_somewhere(state, now_ms, exclude=set(), cause="placement")

    def health(self, site: str) -> SiteHealth:
        st = self.sites.get(site)
        return SiteHealth.DOWN if st is None else st.health

    def site_values(self) -> list[Site]:
        return [replace(st.site, health=st.health) for st in self.sites.values()
                if st.site is not None]

    def measured_rtt_ms(self) -> dict[tuple[str, str], float]:
        return {(name, key): v for name, st in self.sites.items() for key, v in st.rtt_ms.items()}

    # inputs
    def on_status(self, site: str, status: Status, now_ms: float) -> list[Action]:
        st = self.sites.setdefault(site, SiteState(site=None, health=SiteHealth.DOWN))
        if status.state == "offline":
            if st.health is SiteHealth.DOWN:
                return []
            return self._down(site, st, now_ms, cause="will")
        st.last_seen_ms = now_ms
        new_session = status.session != st.session
        st.session = status.session
        if st.health is SiteHealth.DOWN or new_session:
            return self._up(site, st, now_ms)
        return []

    def mark_sent(self, command_id: str, now_ms: float) -> None:
        """The shell published the command: its ack timeout starts now, not at queueing."""
        self.commands.mark_sent(command_id, now_ms)

    def on_route(self, route: Route) -> None:
        """Retained routes seen at (re)start: never issue an epoch below a published one."""
        if route.epoch >= self._route_epochs.get(route.service, 0):
            self._route_sites[route.service] = route.site
        self._route_epochs[route.service] = max(route.epoch,
                                                self._route_epochs.get(route.service, 0))
        state = self.services.get(route.service)
        if state is not None:
            state.epoch = max(state.epoch, route.epoch)

    def on_heartbeat(self, site: str, hb: Heartbeat, now_ms: float) -> list[Action]:
        st = self.sites.setdefault(site, SiteState(site=None, health=SiteHealth.DOWN))
        st.last_seen_ms = now_ms
        st.rtt_ms = dict(hb.peer_rtt_ms)
        st.load_cpu_frac = hb.cpu_frac
        st.services = dict(hb.services)
        rtt = self._rtt_record(site, st, now_ms)
        if st.health is SiteHealth.DOWN:
            # Rejoin only after heartbeats kept coming for a while: a site flapping
            # on a bad link (or a starved host) must not trigger a storm of moves.
            if not st.rejoin_from_ms or now_ms - st.last_beat_ms > self.settings.suspect_after_ms:
                st.rejoin_from_ms = now_ms
            st.last_beat_ms = now_ms
            if now_ms - st.rejoin_from_ms < self.rejoin_after_ms:
                return rtt
            return rtt + self._up(site, st, now_ms)
        st.last_beat_ms = now_ms
        st.health = SiteHealth.HEALTHY
        return rtt

    def _rtt_record(self, site: str, st: SiteState, now_ms: float) -> list[Action]:
        """The site's measured RTTs for the store, at most every `rtt_record_every_ms`."""
        if not st.rtt_ms or (st.rtt_recorded_ms is not None
                             and now_ms - st.rtt_recorded_ms < self.rtt_record_every_ms):
            return []
        st.rtt_recorded_ms = now_ms
        return [Record("edge_site_rtt", {"site": site, "rtt_ms": dict(st.rtt_ms),
                                         "at_ms": now_ms})]

    def on_telemetry(self, t: Telemetry, now_ms: float) -> list[Action]:
        """Journal events: recorded once even when an agent replays them."""
        if t.event_id:
            if t.event_id in self._seen_set:
                return []
            if len(self._seen_events) == self._seen_events.maxlen:
                self._seen_set.discard(self._seen_events[0])
            self._seen_events.append(t.event_id)
            self._seen_set.add(t.event_id)
        elif t.kind == "prewarm_progress":
            return []
        return [Record("edge_event", {"site": t.site, "kind": t.kind, "event_id": t.event_id,
                                      "ts_ms": t.ts_ms, "replayed": t.replayed, **t.data})]

    def on_ack(self, ack: Ack, now_ms: float) -> list[Action]:
        p = self.commands.take(ack.command_id)
        if p is None:
            return []
        out: list[Action] = []
        failed = set(ack.failed) if ack.failed else (set() if ack.ok else {*p.batch, p.service})
        for name in p.batch or (p.service,):
            state = self.services.get(name)
            if state is not None:
                out += self._ack_one(state, p, ack, name not in failed, now_ms)
        return out

    def _ack_one(self, state: ServiceState, p: PendingCommand, ack: Ack, ok: bool,
                 now_ms: float) -> list[Action]:
        epoch = p.command.services.get(state.svc.spec.name, p.command.epoch)
        if not ok:
            out: list[Action] = [Record("edge_command_failed", {
                "site": ack.site, "service": state.svc.spec.name, "kind": p.command.kind,
                "message": ack.message})]
            if ack.epoch > state.epoch and p.purpose in ("serve", "standby"):
                # the agent saw a newer epoch (this hub restarted): catch up and retry there
                state.epoch = ack.epoch
                role_site = state.primary if p.purpose == "serve" else state.standby
                if role_site == ack.site:
                    out.append(self.commands.start(state, ack.site, standby=p.purpose == "standby",
                                           now_ms=now_ms))
                return out
            if p.purpose == "serve" and state.primary == ack.site and epoch == state.epoch:
                state.primary = ""
                out += self._serve_somewhere(state, now_ms, exclude={ack.site}, cause=p.cause,
                                             detected_ms=p.detected_ms,
                                             last_seen_ms=p.last_seen_ms)
            elif p.purpose == "standby" and state.standby == ack.site:
                state.standby, state.standby_ready = "", False
            return out
        if p.purpose == "standby":
            if state.standby == ack.site and epoch == state.epoch:
                state.standby_ready = True
                if state.moving_to == ack.site:  # a rebalance warmed it: finish the move
                    self._enqueue_rebalance((state.svc.spec.name,))
            return []
        if p.purpose != "serve" or epoch != state.epoch or state.primary != ack.site:
            return []
        return self._serving(state, p, now_ms, agent_done_ms=ack.done_ms,
                             ack_sent_ms=ack.ts_ms)

    def tick(self, now_ms: float, *, heartbeat_backlog: int = 0) -> list[Action]:
        """Time-driven work: timeouts, re-sends, rebalancing. `heartbeat_backlog` is
        how many heartbeats the shell has received but not yet fed in."""
        out: list[Action] = []
        s = self.settings
        # If the hub itself was paused (GC, CPU starvation, a suspended VM), the
        # silence is ours, not the sites': shift their last-heard times by the pause.
        pause_ms = now_ms - self._last_tick_ms - (self.expected_tick_ms or 0.0)
        if self.expected_tick_ms and self._last_tick_ms and pause_ms > s.suspect_after_ms / 2:
            for st in self.sites.values():
                st.last_seen_ms += pause_ms
        self._last_tick_ms = now_ms
        for name, st in self.sites.items():
            if st.health is SiteHealth.DOWN:
                continue
            age = now_ms - st.last_seen_ms
            if age > s.down_after_ms and heartbeat_backlog <= self.backlog_limit:
                out += self._down(name, st, now_ms, cause="heartbeat")
            elif age > s.suspect_after_ms and st.health is SiteHealth.HEALTHY:
                st.health = SiteHealth.SUSPECT
                out.append(Record("edge_site_health", {"site": name, "health": "suspect",
                                                       "silent_ms": round(age, 1)}))
        out += self.commands.resends(now_ms,
                                     lambda site: self.health(site) is SiteHealth.DOWN)
        if now_ms - self._last_rebalance_ms >= self._rebalance_every_ms:
            self._last_rebalance_ms = now_ms
            self._enqueue_rebalance(self.services)
            out += self._serve_unserved(now_ms)
        if self._standbys_due:
            self._standbys_due = False
            out += self._place_standbys(now_ms)
        if self._rebalance_queue:
            out += self._rebalance(now_ms)
        return out

    def _enqueue_rebalance(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self._rebalance_queued:
                self._rebalance_queued.add(name)
                self._rebalance_queue.append(name)

    # transitions
    def _down(self, name: str, st: SiteState, now_ms: float, *, cause: str) -> list[Action]:
        st.health = SiteHealth.DOWN
        out: list[Action] = [Record("edge_site_health", {
            "site": name, "health": "down", "cause": cause,
            "silent_ms": round(now_ms - st.last_seen_ms, 1)})]
        moves: list[Action] = []
        for state in self.services.values():
            if state.primary == name:
                moves += self._failover(state, now_ms, cause=cause, last_seen_ms=st.last_seen_ms)
        out += self.commands.batch_promotes(moves)
        for state in self.services.values():
            if state.standby == name:
                state.standby, state.standby_ready = "", False
        self._standbys_due = True  # next tick: the promotions go out first
        return out

    def _up(self, name: str, st: SiteState, now_ms: float) -> list[Action]:
        st.health = SiteHealth.HEALTHY
        st.rejoin_from_ms = 0.0
        out: list[Action] = [Record("edge_site_health", {"site": name, "health": "healthy"})]
        for state in self.services.values():  # tell it its roles again (fences stale serving)
            if state.primary == name:
                out.append(self.commands.start(state, name, standby=False, now_ms=now_ms))
            elif state.standby == name:
                out.append(self.commands.start(state, name, standby=True, now_ms=now_ms))
            elif name in state.told:
                state.told.discard(name)
                out.append(self.commands.command(state, name, "stop", now_ms, purpose=""))
        out += self._place_standbys(now_ms)
        out += self._serve_unserved(now_ms)
        self._enqueue_rebalance(self.services)  # a returned site may serve some better
        return out

    def _serve_unserved(self, now_ms: float) -> list[Action]:
        """Services left without a site (nothing was feasible) get another try."""
        out: list[Action] = []
        for state in self.services.values():
            if not state.primary:
                state.epoch += 1
                out += self._serve_somewhere(state, now_ms, exclude=set(), cause="retry")
        return out

    def _failover(self, state: ServiceState, now_ms: float, *, cause: str,
                  last_seen_ms: float) -> list[Action]:
        old = state.primary
        state.epoch += 1
        target = state.standby if (state.standby and state.standby_ready
                                   and self.health(state.standby) is SiteHealth.HEALTHY) else ""
        if target:
            state.primary, state.standby, state.standby_ready = target, "", False
            send = self.commands.command(state, target, "promote", now_ms, purpose="serve")
            p = self.pending[send.command.command_id]
            p.detected_ms, p.last_seen_ms, p.cause = now_ms, last_seen_ms, cause
            return [send]
        state.primary = ""
        out = self._serve_somewhere(state, now_ms, exclude={old}, cause=cause,
                                    detected_ms=now_ms, last_seen_ms=last_seen_ms)
        if not state.primary:
            out.append(Record("edge_service_unserved", {"service": state.svc.spec.name,
                                                        "from_site": old}))
        return out

    def _serve_somewhere(self, state: ServiceState, now_ms: float, *, exclude: set[str],
                         cause: str, detected_ms: float | None = None,
                         last_seen_ms: float | None = None) -> list[Action]:
        ranked = rank_sites(state.svc.need, self.site_values(),
                            measured_rtt_ms=self.measured_rtt_ms(), exclude=exclude,
                            free=self._free())
        if not ranked:
            return [Record("edge_no_feasible_site", {"service": state.svc.spec.name})]
        # after a hub restart, keep serving where the retained route says it runs
        keep = self._route_sites.pop(state.svc.spec.name, "") or state.svc.prefer_site
        state.primary = next((c.site for c in ranked if c.site == keep), ranked[0].site)
        if state.standby == state.primary:
            state.standby, state.standby_ready = "", False
        send = self.commands.start(state, state.primary, standby=False, now_ms=now_ms)
        p = self.pending[send.command.command_id]
        p.detected_ms, p.last_seen_ms, p.cause = detected_ms, last_seen_ms, cause
        return [send]

    def _serving(self, state: ServiceState, p: PendingCommand, now_ms: float,
                 agent_done_ms: float | None = None,
                 ack_sent_ms: float | None = None) -> list[Action]:
        name = state.svc.spec.name
        old = state.routed
        state.routed = state.primary
        out: list[Action] = [PublishRoute(Route(service=name, site=state.primary,
                                                epoch=state.epoch, ts_ms=now_ms,
                                                endpoint=state.svc.spec.endpoint,
                                                standby_site=state.standby))]
        if p.detected_ms is not None:
            rec = FailoverRecord(
                service=name, from_site=old, to_site=state.primary, cause=p.cause,
                detected_ms=p.detected_ms,
                detect_ms=round(p.detected_ms - (p.last_seen_ms or p.detected_ms), 3),
                serving_ms=round(now_ms - p.detected_ms, 3), epoch=state.epoch,
                agent_ack_ms=None if agent_done_ms is None else round(
                    agent_done_ms - p.created_ms, 3),
                ack_transit_ms=None if ack_sent_ms is None else round(now_ms - ack_sent_ms, 3))
            self.failovers.append(rec)
            out.append(Record("edge_failover", rec.__dict__.copy()))
        if old and old != state.primary and self.health(old) is not SiteHealth.DOWN:
            # planned move (rebalance): the old primary becomes the warm standby
            state.standby, state.standby_ready = old, False
            out.append(self.commands.start(state, old, standby=True, now_ms=now_ms))
        self._standbys_due = True  # next tick, for all the routes of a burst at once
        return out

    def _place_standbys(self, now_ms: float) -> list[Action]:
        needy = [s for s in self.services.values() if s.primary and not s.standby]
        if not needy:
            return []
        plan = plan_standbys([s.svc.need for s in needy], self.site_values(),
                             {s.svc.spec.name: s.primary for s in needy},
                             measured_rtt_ms=self.measured_rtt_ms(), free=self._free())
        out: list[Action] = []
        for state in needy:
            choice = plan.get(state.svc.spec.name)
            if choice is None:
                continue
            state.standby, state.standby_ready = choice.site, False
            out.append(self.commands.start(state, choice.site, standby=True, now_ms=now_ms))
            if state.svc.data or state.svc.images:
                out.append(self.commands.command(state, choice.site, "prewarm", now_ms,
                                                 purpose="prewarm"))
        return out

    def _rebalance(self, now_ms: float) -> list[Action]:
        """Re-evaluate the next few queued services; move one only when it pays."""
        out: list[Action] = []
        sites, measured = self.site_values(), self.measured_rtt_ms()
        busy = {n for p in self.pending.values() if p.purpose == "serve"
                for n in (p.service, *p.batch)}
        base_free = self._free()
        for _ in range(min(self._rebalance_batch, len(self._rebalance_queue))):
            name = self._rebalance_queue.popleft()
            self._rebalance_queued.discard(name)
            state = self.services.get(name)
            if (state is None or not state.primary or state.routed != state.primary
                    or not state.standby_ready or name in busy):
                continue
            # room for it elsewhere, counting its own reservations as free
            free = dict(base_free)
            for site in (state.primary, state.standby):
                if site in free:
                    free[site] = free[site] + state.svc.need.resources
            ranked = rank_sites(state.svc.need, sites, measured_rtt_ms=measured, free=free)
            cur = next((c for c in ranked if c.site == state.primary), None)
            best = ranked[0] if ranked else None
            if best is None or not should_rebalance(cur, best, self.settings.rebalance_hysteresis):
                state.moving_to = ""
                continue
            if best.site != state.standby:  # warm it first; promote once it is ready
                if state.standby:
                    state.told.discard(state.standby)
                    out.append(self.commands.command(state, state.standby, "stop", now_ms,
                                                     purpose=""))
                state.standby, state.standby_ready, state.moving_to = best.site, False, best.site
                out.append(self.commands.start(state, best.site, standby=True, now_ms=now_ms))
                continue
            state.epoch += 1
            state.primary, state.standby, state.standby_ready = best.site, "", False
            state.moving_to = ""
            out.append(self.commands.command(state, best.site, "promote", now_ms, purpose="serve"))
            out.append(Record("edge_rebalance", {"service": name, "to_site": best.site}))
        return out

    # helpers
    def _free(self) -> dict[str, Resources]:
        free = {name: st.site.capacity for name, st in self.sites.items() if st.site is not None}
        for state in self.services.values():
            for site in (state.primary, state.standby):
                if site in free:
                    free[site] = free[site] - state.svc.need.resources
        return free
