"""What a simulated member cluster is made of: its pools, and the faults it injects.

Split from simulated.py (the driver), which re-exports both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from providers.base import Interconnect, Offer


@dataclass(frozen=True, slots=True)
class SimPool:
    name: str
    nodes: int
    cpu_per_node: float
    memory_gib_per_node: float
    gpu_per_node: int = 0
    gpu_model: str | None = None
    interconnect: Interconnect = Interconnect.NONE
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    instance_type: str = ""

    @classmethod
    def from_offer(cls, name: str, offer: Offer, *, nodes: int,
                   labels: Mapping[str, str] | None = None,
                   taints: tuple[str, ...] = ()) -> SimPool:
        """A pool of `nodes` nodes shaped like a catalog offer (GPU pools get the usual taint)."""
        if offer.gpu_count and not taints:
            taints = ("nvidia.com/gpu=present:NoSchedule",)
        return cls(name=name, nodes=nodes, cpu_per_node=offer.vcpu,
                   memory_gib_per_node=offer.memory_gib, gpu_per_node=offer.gpu_count,
                   gpu_model=offer.gpu_model, interconnect=offer.interconnect,
                   labels=dict(labels or {}), taints=taints, instance_type=offer.instance_type)


@dataclass(slots=True)
class FailureInjection:
    """Probabilities (0..1) that a call fails before touching state."""

    apply_error_rate: float = 0.0
    delete_error_rate: float = 0.0
    status_error_rate: float = 0.0
    throttle_share: float = 0.5  # of the injected errors, this share are 429s, the rest 5xx
    # of the injected errors on apply, delete and status, this share are timeouts drawn
    # first: the call hangs `timeout_s` (wall clock, as a real API would), then fails
    timeout_share: float = 0.0
    timeout_s: float = 1.0
