"""Load-dependent service latency: an M/M/c queue per replica set. Pure.

One formula for both shells: the twin's SLO metric (sim/metrics.py) measures with it and
the planner (which may not import broker.sim) needs it to plan for SLOs, so it lives here.

Why: without queueing an under-provisioned service (fewer replicas than its load needs,
e.g. while a scale-out is still booting nodes) never violates its SLO in the twin, so a
policy that answers scale requests slowly looks as good as one that answers at once.

Model (Erlang C; Kleinrock, *Queueing Systems* vol. 1, 1975, section 3.5):
- the trace says how many replicas a service wants, not its request rate, so the offered
  load is what its desired replica count was sized for: lambda = desired x mu x
  `TARGET_UTILIZATION` (a Horizontal Pod Autoscaler sizes replicas to a target utilisation;
  Kubernetes' HPA walkthrough uses 50 %), with service time 1/mu = `SERVICE_TIME_MS`
  (an assumption: a few milliseconds of work per request);
- the load balancer spreads requests evenly over the running replicas; the replicas of one
  cluster form an M/M/c queue with c = their count and lambda_c = lambda x c / n;
- the waiting time W_q = C(c, a) / (c mu - lambda_c), a = lambda_c / mu, C = Erlang C computed
  through the Erlang B recursion B(0) = 1, B(j) = a B(j-1) / (j + a B(j-1)),
  C = c B / (c - a (1 - B)); infinite when lambda_c >= c mu (the queue grows without bound);
- a replica set serves inside the SLO when RTT(user region, cluster) + W_q <= the SLO (the
  SLO bounds network plus waiting; the service time itself is the application's own).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

TARGET_UTILIZATION = 0.5
SERVICE_TIME_MS = 5.0


def erlang_c(servers: int, offered: float) -> float:
    """Probability that a request waits in an M/M/c queue (offered load a = lambda/mu)."""
    if servers <= 0 or offered >= servers:
        return 1.0
    if offered <= 0:
        return 0.0
    b = 1.0
    for j in range(1, servers + 1):
        b = offered * b / (j + offered * b)
    return servers * b / (servers - offered * (1.0 - b))


@functools.lru_cache(maxsize=65536)
def queue_wait_ms(servers: int, offered: float, service_ms: float = SERVICE_TIME_MS) -> float:
    """Mean waiting time (ms) of M/M/c with `servers` replicas and offered load `offered`.
    Memoised (a pure function of its arguments): the twin's SLO metric asks it again for
    every change of a service, and the Erlang B recursion runs once per replica."""
    if servers <= 0 or offered >= servers:
        return math.inf
    if offered <= 0:
        return 0.0
    mu = 1.0 / service_ms
    return erlang_c(servers, offered) / (servers * mu - offered * mu)


def offered_load(desired: int) -> float:
    """Offered load (in replicas' worth of work) of a service that asked for `desired`."""
    return max(0, desired) * TARGET_UTILIZATION


# The most replicas the planner runs for a service's SLO, as a multiple of those it asked
# for (feasibility.size_for_slo): per-replica utilisation no lower than
# TARGET_UTILIZATION / 4 = 12.5 %. An assumption (a cost guard, not measured): past it the
# service keeps its asked count and the SLO bounds RTT alone, as before sizing existed.
MAX_SLO_REPLICA_FACTOR = 4


# Replicas of one service that SLO sizing counts on sharing a cluster, where it asked for
# at least that many (`sizing_pool`): sizing plans the wait of a cluster holding this many,
# not of one replica alone. Why not 1 (the worst case of any split, used before
# 2026-12-06): at a tight slack it asked for 2-4x the replicas, which on scarce edge room did
# not fit, so the service was placed short and served nothing, and elsewhere cost replicas
# that pooled ones did not need (M/M/2 at rho 0.5 waits 1.7 ms, M/M/1 5 ms). 2, 3 and 4 were
# compared on 160 held-out trace drafts (seeds 9,200,000-159) and 2 then checked on 160
# others (9,300,000-159; docs/twin.md "Serving when room is scarce"); the shipped scenarios did
# not choose it. A cluster that ends up with fewer replicas than this may wait longer than
# planned; its replicas then count as violating in the twin, as they would live.
SLO_POOL_REPLICAS = 2


def sizing_pool(asked: int, domains: int = 1) -> int:
    """Replicas per cluster SLO sizing plans the wait of: SLO_POOL_REPLICAS, but no more
    than a service that asked for `asked` replicas spread over at least `domains` domains
    can put in each (asked // domains), and at least 1."""
    return max(1, min(asked // max(1, domains), SLO_POOL_REPLICAS))


def planned_wait_ms(pool: int, utilization: float, service_ms: float = SERVICE_TIME_MS
                    ) -> float:
    """The wait SLO sizing plans for a cluster holding `pool` replicas (`sizing_pool`) at
    per-replica `utilization`: M/M/pool at offered load pool x utilization (more replicas in
    one cluster at the same utilisation wait less)."""
    return queue_wait_ms(pool, pool * utilization, service_ms)


def asked_replicas(replicas: int, utilization: float | None) -> int:
    """The replicas a service asked for, from a spec SLO sizing planned with `replicas` at
    per-replica `utilization` (size_for_slo sets it to TARGET_UTILIZATION x asked /
    replicas); `replicas` where it carries none."""
    if utilization is None:
        return replicas
    return max(1, round(utilization * replicas / TARGET_UTILIZATION))


def replicas_for_slack(asked: int, slack_ms: float, service_ms: float = SERVICE_TIME_MS,
                       max_factor: int = MAX_SLO_REPLICA_FACTOR, domains: int = 1
                       ) -> int | None:
    """Fewest replicas n >= `asked` at which a cluster holding `sizing_pool(asked, domains)`
    of them waits at most `slack_ms`.

    The load is what `asked` replicas were sized for (`offered_load(asked)`), spread evenly
    over n replicas: rho = TARGET_UTILIZATION x asked / n. A cluster with k replicas is an
    M/M/k queue at offered load k x rho; more replicas in one cluster at the same rho wait
    less, so every cluster holding at least k serves within the slack. For k = 1 (M/M/1:
    W_q = service_ms x rho / (1 - rho)): rho <= slack / (service_ms + slack); else the
    fewest n by bisection (the wait falls as n grows). None when `asked` <= 0, the slack is
    not positive, or n would exceed `max_factor` x asked.
    """
    if asked <= 0 or not slack_ms > 0:
        return None
    k = sizing_pool(asked, domains)
    if k == 1:
        rho_max = slack_ms / (service_ms + slack_ms)
        n = max(asked, math.ceil(TARGET_UTILIZATION * asked / rho_max - 1e-9))
        return n if n <= max_factor * asked else None

    def fits(n: int) -> bool:
        return planned_wait_ms(k, TARGET_UTILIZATION * asked / n, service_ms) \
            <= slack_ms + 1e-12

    lo, hi = asked, max_factor * asked
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def served_in_slo(per_cluster: Iterable[tuple[float, int]], load: float, slo_ms: float) -> int:
    """Replicas that serve inside a latency SLO: `per_cluster` gives (RTT from the users,
    replicas) per cluster; the load balancer spreads `load` (offered_load of the replicas
    asked) over all of them evenly, and a cluster's c replicas serve when RTT + the M/M/c
    wait at load x c / n fits. The twin's SLO metric (sim/metrics.py) and the planner's
    release of placements that cannot serve (rounding.release_unserving) count with it."""
    sets = [(rtt, c) for rtt, c in per_cluster if c > 0]
    n = sum(c for _, c in sets)
    if n == 0:
        return 0
    return sum(c for rtt, c in sets if rtt + queue_wait_ms(c, load * c / n) <= slo_ms)
