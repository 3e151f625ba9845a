"""Pending needs: what a cycle still owes a need after each phase, and why.

Phase 1 creates one :class:`PendingNeed` for every need it could not fully
cover; Phase 2 works through them; shortfalls and why-not reasons are read
off whatever is left. Keeping the evidence here (was topology the obstacle?
were there victims at all?) is what lets the explanation be specific.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shard_engine.model import Need
from shard_engine.needs import Demand

__all__ = [
    "REASON_AWAITING_TRANSFER",
    "REASON_NO_SUPPLY",
    "REASON_PAUSED",
    "REASON_PREEMPTION_EXHAUSTED",
    "REASON_PRIORITY_STARVED",
    "REASON_TOPOLOGY",
    "PendingNeed",
]

REASON_PRIORITY_STARVED = "priority-starved"
REASON_NO_SUPPLY = "no matching supply"
REASON_TOPOLOGY = "topology unsatisfiable"
REASON_PREEMPTION_EXHAUSTED = "preemption exhausted"
REASON_PAUSED = "actuation paused"
REASON_AWAITING_TRANSFER = "awaiting another shard's idle machine"


@dataclass(slots=True)
class PendingNeed:
    """One need with a residual deficit, plus the evidence for explaining it."""

    demand: Demand
    index: int
    deficit: npt.NDArray[np.float64]
    mask: npt.NDArray[np.bool_]
    topology_block: str = ""
    victims_available: int = 0
    victims_taken: int = 0
    # Phase 1 left it for an idle machine another shard holds (``fleet_idle``):
    # Phase 2 does not preempt for it and the coordinator is asked for a transfer.
    awaiting_transfer: bool = False
    # The domain a gang holding part of it is short in, named in its shortfall (ADR 0180).
    domain: str = ""

    @property
    def cluster(self) -> int:
        """Cluster index of the need."""
        return self.demand.cluster

    @property
    def need(self) -> Need:
        """The need itself."""
        return self.demand.needs[self.index]

    @property
    def key(self) -> str:
        """The need's key."""
        return self.demand.keys[self.index]

    @property
    def priority(self) -> int:
        """The need's priority."""
        return int(self.demand.priority[self.index])

    @property
    def unsatisfied(self) -> bool:
        """True while any resource is still short."""
        return bool((self.deficit > 0).any())
