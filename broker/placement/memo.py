"""What one epoch's plan may reuse from the last one's: speed only, never a value.

A shell that plans every epoch (the twin every 30 s, the live loop) may pass the same
`PlanMemo` to each `plan_epoch`; without one, plan_epoch makes a fresh memo per call, so the
parts of one epoch (SLO sizing, the batch's candidate build, the migration rules' build)
still share what they resolved. Every entry is keyed on everything its value is computed
from, and a key that differs drops the entry: a plan made with a memo equals the plan made
without one (tests/unit/test_plan_memo.py).

What is kept:

- RTTs user region -> cluster (network.RttResolver: measured first, else the great-circle
  estimate) and each region's row over the clusters, while the snapshot's RTT map is the
  same mapping object (the twin's merge hands out last epoch's map while no measurement
  changed it, placement/snapshot.py `MergeMemo`) and the user regions and the clusters'
  names, region keys and coordinates are equal. A caller must not change a mapping it
  passed in a snapshot.
- The options of the snapshot and their table (candidates.options_and_table): the same
  objects while the snapshot's clusters are the same Cluster objects, and the part of each
  cluster that is the same object as at the last call (values, so identity suffices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from broker.domain import Cluster, FederationSnapshot

FloatArray = npt.NDArray[np.float64]
Pair = tuple[str, str]
Geometry = tuple[tuple[str, str, float | None, float | None], ...]


@dataclass(slots=True, eq=False)
class PlanMemo:
    """Reusable parts of earlier plans (module docstring). Not shared between threads."""

    # The RTT map (by identity) and the user regions and cluster geometry (by value) the
    # RTT entries below were resolved from.
    rtt_map: Mapping[Pair, float] | None = None
    rtt_places: tuple[object, ...] = ()
    # (user region, cluster name) -> ms (None: unknown), as RttResolver resolved it.
    rtt: dict[Pair, float | None] = field(default_factory=dict)
    # (user region, cluster names in order) -> per-cluster RTT row (nan: unknown), read-only.
    rtt_rows: dict[tuple[str, tuple[str, ...]], FloatArray] = field(default_factory=dict)
    # The last snapshot's clusters (by identity) and its options and option table
    # (candidates.options_and_table), and per cluster name the part of the table made from
    # one Cluster value (candidates._ClusterBlock).
    option_table: tuple[tuple[Cluster, ...], object] | None = None
    option_blocks: dict[str, object] = field(default_factory=dict)

    def rtts(self, snapshot: FederationSnapshot) -> dict[Pair, float | None]:
        """The RTT cache valid for `snapshot` (emptied first when what it was resolved from
        differs)."""
        places = (snapshot.user_regions, geometry(snapshot.clusters))
        if snapshot.rtt_ms is not self.rtt_map or places != self.rtt_places:
            self.rtt_map, self.rtt_places = snapshot.rtt_ms, places
            self.rtt.clear()
            self.rtt_rows.clear()
        return self.rtt


def geometry(clusters: Sequence[Cluster]) -> Geometry:
    """What an RTT to each cluster is resolved from besides the maps: name, region key,
    coordinates."""
    return tuple([(c.name, c.region_key, c.lat, c.lon) for c in clusters])
