"""Distances and estimated RTTs between places given by coordinates. Pure.

Where the catalog has no measured RTT (Skyplane's 2022 matrix) or an edge agent
has not probed one, skyfed estimates it (SCENARIO.md's contract):

    rtt_ms = 2 * d_km / V_FIBER_KM_PER_MS * ROUTE_INFLATION + RTT_FLOOR_MS

- d_km: great-circle (haversine) distance, mean Earth radius 6371.0088 km (IUGG).
- V_FIBER_KM_PER_MS = 199.86: light in fibre at c / 1.5 (refractive index of
  silica ~1.47-1.5), i.e. about 2/3 c.
- ROUTE_INFLATION: real fibre routes are longer than the great circle; Singla et
  al., "The Internet at the Speed of Light" (HotNets 2014) report a median
  inflation of ~1.5x-2x for fibre paths. The constant below is refitted against
  Skyplane's measured inter-region RTTs by `scripts/build_catalog.py` (see
  docs/providers.md for the fit).
- RTT_FLOOR_MS: per-path switching/serialisation floor seen even between
  neighbouring data centres.
"""

from __future__ import annotations

import math

EARTH_RADIUS_KM = 6371.0088
V_FIBER_KM_PER_MS = 299_792.458 / 1.5 / 1000.0
# Refitted by scripts/build_catalog.py (least squares, Skyplane 2022 PREMIUM-tier avg RTTs):
#   pairs < 3000 km (381 pairs): inflation 1.881, floor 8.48 ms, RMSE 12.7 ms  <- used here
#   all pairs      (2346 pairs): inflation 1.544, floor 25.3 ms, RMSE 44.8 ms (intercontinental
#   detours inflate the intercept; wrong for the short paths where RTT SLOs bind).
# See docs/providers.md ("RTT model").
ROUTE_INFLATION = 1.881
RTT_FLOOR_MS = 8.48


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


def estimate_rtt_ms(
    lat1: float, lon1: float, lat2: float, lon2: float,
    *, inflation: float = ROUTE_INFLATION, floor_ms: float = RTT_FLOOR_MS,
) -> float:
    """Estimated round-trip time in ms between two points (see module docstring)."""
    d = haversine_km(lat1, lon1, lat2, lon2)
    return 2.0 * d / V_FIBER_KM_PER_MS * inflation + floor_ms
