"""The cost floor: what no policy can go below, worked out from the trace alone.

Most of a ``mixed`` day's bill is bare-metal GPU servers, and the simulated
bare-metal site has no Delete: a server claimed stays billed (at its
amortised price) until the run ends, idle or not. A GPU pod that only such a
server can hold, one pod per server, therefore forces a server to be claimed
by the time it arrives and keeps it on the bill from then on. However well
a policy reuses servers, the number it has claimed by time ``t`` is at least
the largest number of those pods running at once up to ``t``; so its GPU
bill is at least

    price × ∫₀ᵀ max_{s ≤ t} running(s) dt

with ``price`` the cheapest server that can hold such a pod. Every other
machine of the run is left out (counted as free), so this is a lower bound
on the *whole* bill of any policy that starts every pod when it arrives and
runs it until it leaves: a cost goal below it cannot be met by better
decisions (issue 18 asks for 0.85× the baseline's cost; on several seeds
the baseline itself is within a few per cent of this floor).

The bound is for policies that place every pod when it arrives: the trace
fixes when a pod leaves, so one placed later runs for less and could share
a server over time with another. Those delays are what the time-to-capacity
goals measure; a policy that meets them moves the bound by seconds. Where
more of those pods run at once than the fleet has servers for them (the
scarce fleet), no policy places them on arrival and there is no floor
(``usd`` is None).

A GPU pod counts only when every machine of the fleet that could hold it
(resources, requirements, and the label its gang shares) belongs to a
provider without Delete and none of them holds two of it; any other pod
adds nothing, which keeps the bound a bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from clusters.pods import DIMENSIONS, PodSpec
from providers.bare_metal import BareMetalProvider
from shard_engine.coordination import labels_satisfy
from shard_engine.model import MachineRecord
from simulator.fleet import Fleet, FleetOptions
from simulator.trace import Arrive, Trace

__all__ = ["CostFloor", "cost_floor", "fleet_floor"]

_GPU = DIMENSIONS.index("nvidia.com/gpu")


@dataclass(frozen=True, slots=True)
class CostFloor:
    """The floor and what it was built from."""

    #: The floor in dollars; None where the fleet cannot hold the peak on arrival, so no
    #: policy can place every pod when it arrives and the bound says nothing.
    usd: float | None
    #: GPU pods that can only run one to a server of a provider without Delete.
    pods: int
    #: Most of them running at once.
    peak: int
    #: Cheapest $/h of a server able to hold one of them (0 when ``pods`` is 0).
    price: float
    #: Servers of the fleet able to hold one of them.
    servers: int = 0

    def to_json(self) -> dict[str, float | int | None]:
        """As written into ``summary.json``."""
        return {
            "usd": None if self.usd is None else round(self.usd, 2),
            "pods": self.pods,
            "peak_servers": self.peak,
            "servers": self.servers,
            "price_per_hour": self.price,
        }


def _vector(allocatable: Mapping[str, float]) -> np.ndarray:
    return np.array([float(allocatable.get(name, 0.0)) for name in DIMENSIONS])


def _price_if_counted(
    pod: PodSpec, machines: list[tuple[np.ndarray, MachineRecord]], undeletable: frozenset[str]
) -> tuple[float, frozenset[str]] | None:
    """The cheapest server for ``pod`` and every server able to hold it, if only undeletable
    servers, one pod each, hold it."""
    need = np.array(pod.placement(gap=False), dtype=np.float64)
    best: float | None = None
    able: set[str] = set()
    for alloc, record in machines:
        if not (alloc + 1e-9 >= need).all():
            continue
        if pod.colocation_key and pod.colocation_key not in record.labels:
            continue
        if not labels_satisfy(pod.requirements, record.labels):
            continue
        if record.provider not in undeletable or (alloc + 1e-9 >= 2 * need).all():
            return None
        best = record.price_per_hour if best is None else min(best, record.price_per_hour)
        able.add(record.id)
    return None if best is None else (best, frozenset(able))


def cost_floor(
    trace: Trace, machines: Iterable[MachineRecord], undeletable: Iterable[str]
) -> CostFloor:
    """The floor of ``trace`` on a fleet of ``machines`` (see the module docstring).

    ``undeletable`` names the providers without Delete (their machines bill
    from claim to the end of the run).
    """
    no_delete = frozenset(undeletable)
    fleet = [(_vector(m.allocatable), m) for m in machines if m.allocatable]
    gpu_fleet = [(a, m) for a, m in fleet if a[_GPU] > 0]
    verdicts: dict[tuple[object, ...], tuple[float, frozenset[str]] | None] = {}
    able: set[str] = set()
    counted: set[tuple[str, str]] = set()
    steps: list[tuple[float, int]] = []
    price: float | None = None
    for event in trace.events:
        if isinstance(event, Arrive):
            pod = event.pod
            if pod.limit[_GPU] <= 0:
                continue
            key = (pod.limit, pod.reservation, pod.app_class, pod.requirements, pod.colocation_key)
            if key not in verdicts:
                verdicts[key] = _price_if_counted(pod, gpu_fleet, no_delete)
            verdict = verdicts[key]
            if verdict is None:
                continue
            server, holders = verdict
            able |= holders
            price = server if price is None else min(price, server)
            counted.add((event.cluster, pod.name))
            steps.append((event.t, 1))
        elif (event.cluster, event.pod) in counted:
            counted.discard((event.cluster, event.pod))
            steps.append((event.t, -1))
    running = peak = 0
    server_seconds = 0.0
    last = 0.0
    for t, change in steps:
        t = min(max(t, 0.0), trace.duration)
        server_seconds += peak * (t - last)
        last = t
        running += change
        peak = max(peak, running)
    server_seconds += peak * (trace.duration - last)
    pods = sum(1 for _, change in steps if change > 0)
    hourly = price or 0.0
    # More of them at once than servers that hold them: no policy places every pod on
    # arrival, and the bound, made for those that do, says nothing.
    usd = hourly * server_seconds / 3600.0 if peak <= len(able) else None
    return CostFloor(usd=usd, pods=pods, peak=peak, price=hourly, servers=len(able))


def fleet_floor(trace: Trace, *, quota_scale: float, seed: int) -> CostFloor:
    """The floor of ``trace`` on the simulated fleet a run of it gets (``simulator.fleet``)."""
    fleet = Fleet.build(FleetOptions(quota_scale=quota_scale, seed=seed))
    try:
        undeletable = [
            name for name, core in fleet.providers.items() if isinstance(core, BareMetalProvider)
        ]
        return cost_floor(trace, list(fleet.records()), undeletable)
    finally:
        fleet.close()
