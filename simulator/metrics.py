"""What a run measures: sampled time series and the summary figures built from them.

Sampled every ``sample_s`` virtual seconds (a step function between samples):

* `cost_rate`: $/h of every machine holding a host (creating, idle,
  configuring, configured, draining, deleting); `billed_machines` counts them;
* `util_<dim>`: fleet utilisation, expected use (guaranteed pods'
  reservations + best-effort limits) ÷ allocatable of billed machines;
* `pending`, `fragmented`: pods waiting; of those, the pods their matching
  nodes hold in total but no one node fits.

Summary: cost in dollars (exact, from every machine's billed time), the
time averages of the utilisations, time-to-capacity (arrival → first
placement) p50/p99 per priority over every pod that arrived, pods never
placed (gone before they ran, while the replay went on) and pods the
replay's end found still waiting (the waits of both, as long as they had
lasted, count in the percentiles as lower bounds: ADR 0175),
evictions by cause
(preemption, reclaim and consolidation, spot interruption, gap closing),
flaps (a node drained within 10 minutes of joining), stranded capacity
(allocatable of billed machines not holding a placed pod, in core-, GiB-
and GPU-hours) and unschedulable pod-minutes (of which fragmentation). Gangs (pods of one
co-location group): how many arrived, their pods and how many of those were
ever placed, and which gangs were placed whole (every member that arrived
placed at least once), by ``cluster/gang``, so two policies' runs of one
trace can be compared gang by gang; how long each gang placed whole took
(its first member's arrival to its last member's first placement) and how
long each gang the replay's end found with a member never placed had
waited by then (ADR 0182).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clusters.pods import DIMENSIONS
from simulator.cluster import ClusterModel

__all__ = ["Recorder", "tier_name"]

GI = float(2**30)
_SHORT = ("cpu", "memory", "gpu")


def tier_name(priority: int) -> str:
    """A readable label for a priority value."""
    return f"p{priority}"


@dataclass(slots=True)
class Recorder:
    """Collects samples during a run and reduces them to a summary."""

    sample_s: float
    series: dict[str, list[float]] = field(default_factory=dict)
    _pending_minutes: float = 0.0
    _fragment_minutes: float = 0.0
    _stranded: np.ndarray = field(default_factory=lambda: np.zeros(len(DIMENSIONS)))
    _used: np.ndarray = field(default_factory=lambda: np.zeros(len(DIMENSIONS)))
    _billed: np.ndarray = field(default_factory=lambda: np.zeros(len(DIMENSIONS)))

    def _put(self, name: str, value: float) -> None:
        self.series.setdefault(name, []).append(float(value))

    def sample(
        self,
        now: float,
        *,
        cost_rate: float,
        billed_machines: int,
        billed_alloc: np.ndarray,
        clusters: Mapping[str, ClusterModel],
    ) -> None:
        """Take one sample of the fleet."""
        placed = np.zeros(len(DIMENSIONS))
        used = np.zeros(len(DIMENSIONS))
        pending = fragmented = 0
        for cluster in clusters.values():
            _, p, u = cluster.usage()
            placed += p
            used += u
            waiting, frag = cluster.pending_counts()
            pending += waiting
            fragmented += frag
        self._put("t", now)
        self._put("cost_rate", cost_rate)
        self._put("billed_machines", billed_machines)
        for i, short in enumerate(_SHORT):
            ratio = used[i] / billed_alloc[i] if billed_alloc[i] > 0 else 0.0
            self._put(f"util_{short}", ratio)
        self._put("pending", pending)
        self._put("fragmented", fragmented)
        hours = self.sample_s / 3600.0
        self._stranded += np.maximum(billed_alloc - placed, 0.0) * hours
        self._used += used * hours
        self._billed += billed_alloc * hours
        self._pending_minutes += pending * self.sample_s / 60.0
        self._fragment_minutes += fragmented * self.sample_s / 60.0

    def summary(
        self,
        *,
        cost: float,
        clusters: Mapping[str, ClusterModel],
        stats: Mapping[str, int],
        ended_at: float,
    ) -> dict[str, Any]:
        """The run's figures (see the module docstring); the replay ended at ``ended_at``."""
        waits: dict[int, list[float]] = {}
        gone: dict[int, list[float]] = {}  # waits of pods deleted before they ran
        cut: dict[int, list[float]] = {}  # waits so far of pods the end found waiting
        totals = {"preempt": 0, "reclaim": 0, "interrupt": 0, "gap": 0}
        flaps = joined = 0
        gangs = {"total": 0, "pods": 0, "pods_placed": 0}
        whole: list[str] = []
        whole_s: dict[str, float] = {}  # gang -> its first arrival to its last member placed
        cut_s: dict[str, float] = {}  # gang not whole that the end found waiting -> wait so far
        for cluster in clusters.values():
            c = cluster.counters
            gangs_cut = set(c.gangs_cut)
            for state in cluster.pending_pods():  # a trace whose pods outlive the replay
                if state.first_placed is None:
                    cut.setdefault(state.spec.priority, []).append(ended_at - state.arrived)
                    if state.spec.colocation:
                        gangs_cut.add(state.spec.colocation)
            for gang, (arrived, placed) in c.gangs.items():
                gangs["total"] += 1
                gangs["pods"] += arrived
                gangs["pods_placed"] += placed
                name = f"{cluster.cluster_id}/{gang}"
                first, last = c.gang_times[gang]
                if placed >= arrived:
                    whole.append(name)
                    whole_s[name] = round(last - first, 1)
                elif gang in gangs_cut:
                    cut_s[name] = round(ended_at - first, 1)
            for priority, wait in c.waits:
                waits.setdefault(priority, []).append(wait)
            for priority, wait in c.abandoned:
                gone.setdefault(priority, []).append(wait)
            for priority, wait in c.cut_off:
                cut.setdefault(priority, []).append(wait)
            totals["preempt"] += c.evicted_preempt
            totals["reclaim"] += c.evicted_reclaim
            totals["interrupt"] += c.evicted_interrupt
            totals["gap"] += c.evicted_gap
            flaps += c.flaps
            joined += c.nodes_joined
        ttc: dict[str, dict[str, float]] = {}
        for priority in sorted(set(waits) | set(gone) | set(cut), reverse=True):
            # A wait that never ended in a placement (the pod was deleted, or the replay
            # ended) counts as long as it had lasted: a lower bound, so the percentiles
            # leave out no pod that arrived (ADR 0175). Every tier here has some wait.
            values = np.array(
                waits.get(priority, []) + gone.get(priority, []) + cut.get(priority, [])
            )
            ttc[tier_name(priority)] = {
                "p50_s": round(float(np.percentile(values, 50)), 1),
                "p99_s": round(float(np.percentile(values, 99)), 1),
                "placed": len(waits.get(priority, [])),
                "never_placed": len(gone.get(priority, [])),
                "waiting_at_end": len(cut.get(priority, [])),
            }
        utilisation = {
            short: round(float(self._used[i] / self._billed[i]), 4) if self._billed[i] > 0 else 0.0
            for i, short in enumerate(_SHORT)
        }
        stranded = {
            "cpu_core_hours": round(float(self._stranded[0]), 1),
            "memory_gib_hours": round(float(self._stranded[1] / GI), 1),
            "gpu_hours": round(float(self._stranded[2]), 1),
        }
        return {
            "cost_usd": round(cost, 2),
            "utilisation": utilisation,
            "time_to_capacity": ttc,
            "evictions": totals,
            "preempted_pods": totals["preempt"],
            "flaps": flaps,
            "nodes_joined": joined,
            "stranded": stranded,
            "unschedulable_pod_minutes": round(self._pending_minutes, 1),
            "fragmentation_pod_minutes": round(self._fragment_minutes, 1),
            "gangs": {
                **gangs,
                "placed_whole": len(whole),
                "whole": sorted(whole),
                "whole_s": dict(sorted(whole_s.items())),
                "cut_off_s": dict(sorted(cut_s.items())),
            },
            "actions": {k: int(v) for k, v in sorted(stats.items())},
        }
