"""Whether a shard has news for the coordinator that should not wait for its next report.

A shard reports to the coordinator every report interval (30 s by
default), and the coordinator plans a round as soon as a report comes
in. A need that only another shard's machines can meet (a gang whose rack
the other shard holds, a need waiting for a remote idle machine) waits for
that report: up to a whole interval, on average half of one, before any
machine moves toward it. On the simulated ``mixed`` day that wait was most
of the difference between BigFleet's GPU gangs' p99 and the per-cluster
baseline's (ADR 0184).

So after each cycle a shard asks :class:`ReportNews` whether its report
would now tell the coordinator something it can act on and has not been
told:

* a **shortfall** whose (cluster, need) was not in the last report: a new
  need for the fleet's help; or
* **more free idle machines** of some profile than the last report held:
  machines another shard's shortfall may be waiting for; or
* **no report yet**: a shard that has just started (or taken its lease
  over) is known to the coordinator after its first cycle, not an
  interval later.

If so, it reports at once, no sooner than ``early_report_gap_s`` after its
last report. A shortfall that was already reported, an idle count that
fell, and a change of speculative capacity (which only the shard itself
claims) are not news: they wait for the periodic report, so a busy fleet
does not report every cycle.

Production's reporter (``bigfleet.shard``) and the simulator's
coordinator keep one :class:`ReportNews` per shard and apply the same
rule. Pure and clock-free: the caller passes ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from shard_engine.model import Shortfall

__all__ = ["ReportNews"]

ShortfallKey = tuple[str, str]


class ReportNews:
    """What one shard last told the coordinator, and whether it has news since."""

    def __init__(self, *, gap_s: float) -> None:
        if not gap_s >= 0:
            raise ValueError(f"gap_s: must be a number of seconds >= 0, got {gap_s!r}")
        self.gap_s = gap_s
        self._shortfalls: frozenset[ShortfallKey] = frozenset()
        self._idle: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._sent_at = -math.inf
        self._told = False  # a report has gone out since this shard started

    @property
    def sent_at(self) -> float:
        """When the last report (or failed attempt) went out; -inf before the first."""
        return self._sent_at

    @property
    def carried(self) -> frozenset[tuple[str, str]]:
        """(cluster, need key) of every shortfall the last report carried."""
        return self._shortfalls

    def sent(
        self, shortfalls: Iterable[Shortfall], idle: npt.NDArray[np.int64], now: float
    ) -> None:
        """A report went out at ``now`` with these shortfalls and free idle counts."""
        self._shortfalls = frozenset(_keys(shortfalls))
        self._idle = np.array(idle, dtype=np.int64, copy=True)
        self._sent_at = now
        self._told = True

    def attempted(self, now: float) -> None:
        """A report was tried at ``now`` and did not arrive: the next early one waits the gap."""
        self._sent_at = now

    def due(self, shortfalls: Iterable[Shortfall], idle: npt.NDArray[np.int64], now: float) -> bool:
        """True if the report should go now rather than at its interval.

        ``idle`` is the free idle count per profile index (the engine's
        ``free_counters()[1]``); a profile the last report did not know of
        counts from zero.
        """
        if now - self._sent_at < self.gap_s:
            return False
        if not self._told:
            return True
        if not self._shortfalls.issuperset(_keys(shortfalls)):
            return True
        known = min(len(idle), len(self._idle))
        if np.count_nonzero(idle[known:]):  # profiles the last report did not know of
            return True
        return bool(np.count_nonzero(idle[:known] > self._idle[:known]))


def _keys(shortfalls: Iterable[Shortfall]) -> Iterable[ShortfallKey]:
    return ((sf.cluster_id, sf.need_key) for sf in shortfalls)
