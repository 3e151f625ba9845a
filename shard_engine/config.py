"""Every tuning knob of the engine, with the paper's values as defaults.

One frozen, keyword-only value: the shard process builds it once from its
configuration and hands it to :class:`~shard_engine.engine.ShardEngine`.
Nothing in the engine reads configuration from anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from shard_engine.model import CapacityType
from shard_engine.quarantine import QuarantineRule

__all__ = ["EngineConfig", "VictimWeights"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VictimWeights:
    """Weights of the four victim-score terms; each term lies in [0, 1]."""

    priority: float
    drain_speed: float
    interruption: float
    reclamation: float


def _default_hold() -> Mapping[CapacityType, float | None]:
    return MappingProxyType(
        {
            CapacityType.ON_DEMAND: 600.0,
            CapacityType.SPOT: 60.0,
            CapacityType.RESERVED: None,
            CapacityType.BARE_METAL: None,
            CapacityType.UNSPECIFIED: None,
        }
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Tuning of the shard decision engine.

    Grace thresholds are strict ``gap > threshold`` tests evaluated in order,
    exactly like the paper's ``drainGracePeriod``; the first match wins and
    ``grace_default_seconds`` applies below them all.

    ``idle_hold_seconds`` is how long an idle machine of each capacity type
    is held before it is released (Delete); ``None`` means never (bare metal
    cannot be deleted and reserved capacity is paid for either way).

    Reclaim waits for excess to persist (see ``reclaim``): it is judged
    against each need's peak over ``reclaim_window_seconds``, must be found in
    ``reclaim_hysteresis_cycles`` consecutive cycles, and only machines
    configured at least ``reclaim_min_age_seconds`` ago are reclaimed.
    ``reclaim_hysteresis_cycles=1`` with ``reclaim_min_age_seconds=0`` and
    ``reclaim_window_seconds=0`` reclaims on the first sight of excess.
    """

    # Phase 2: preemption.
    grace_thresholds: tuple[tuple[int, int], ...] = ((900_000, 10), (500_000, 30), (100_000, 120))
    grace_default_seconds: int = 600
    victim_weights_normal: VictimWeights = field(
        default_factory=lambda: VictimWeights(
            priority=0.70, drain_speed=0.10, interruption=0.10, reclamation=0.10
        )
    )
    victim_weights_saturated: VictimWeights = field(
        default_factory=lambda: VictimWeights(
            priority=0.10, drain_speed=0.70, interruption=0.10, reclamation=0.10
        )
    )
    priority_gap_scale: float = 100_000.0
    drain_scale_seconds: float = 60.0
    penalty_scale_dollars: float = 100.0
    default_drain_seconds: float = 60.0
    drain_estimate_smoothing: float = 0.3

    # Phase 3: reclaim and release.
    reclaim_grace_seconds: int = 600
    reclaim_fraction_per_cycle: float = 0.05
    reclaim_minimum_per_cycle: int = 1
    reclaim_clusters_per_cycle: int = 8
    reclaim_hysteresis_cycles: int = 3
    reclaim_min_age_seconds: float = 600.0
    reclaim_window_seconds: float = 600.0
    reclaim_swing_margin: float = 0.5
    idle_hold_seconds: Mapping[CapacityType, float | None] = field(default_factory=_default_hold)
    demand_window_seconds: float = 600.0
    max_releases_per_cycle: int = 100

    # Announced interruptions (``interruptions``): a configured machine at or above
    # this probability is drained and replaced at once, with this grace.
    interruption_drain_threshold: float = 0.99
    interruption_grace_seconds: int = 90

    # Fleet-wide idle: how long a need waits for another shard's idle machine
    # (handed over by the coordinator) before it creates or claims one (ADR 0129).
    fleet_idle_wait_seconds: float = 60.0

    # Shortfalls.
    max_shortfalls: int = 100
    escalate_after_cycles: int = 5

    # Safety rails and health.
    quarantine: QuarantineRule = field(default_factory=QuarantineRule)
    # A roll-up stamped further ahead of ``now`` than this is rejected (one bad
    # clock must not make every later roll-up of its cluster stale). None: no bound.
    rollup_max_skew_seconds: float | None = 300.0
    health_miss_threshold: int = 3

    # Topology: bound on per-machine placement steps for one spread need per cycle.
    max_spread_steps: int = 10_000

    # Memory: machines to reserve room for up front (0: grow on demand). Growing
    # by doubling leaves outgrown columns with the allocator; a shard that knows
    # its inventory size at startup avoids that by reserving it.
    expected_machines: int = 0

    def __reduce__(self) -> tuple[object, tuple[dict[str, object]]]:
        """Pickle as its fields, the read-only hold table as a plain dict.

        The simulator hands the config to engines in worker processes (a
        cross-shard victim choice carries it), and a mapping proxy does not
        pickle.
        """
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        values["idle_hold_seconds"] = dict(self.idle_hold_seconds)
        return (_rebuilt, (values,))

    def __post_init__(self) -> None:
        if self.max_shortfalls < 0:
            raise ValueError("max_shortfalls: must not be negative")
        if self.escalate_after_cycles < 0:
            raise ValueError("escalate_after_cycles: must not be negative")
        if not 0.0 <= self.reclaim_fraction_per_cycle <= 1.0:
            raise ValueError("reclaim_fraction_per_cycle: must be within [0, 1]")
        if self.rollup_max_skew_seconds is not None and not self.rollup_max_skew_seconds >= 0:
            raise ValueError("rollup_max_skew_seconds: must not be negative")
        if self.reclaim_hysteresis_cycles < 1:
            raise ValueError("reclaim_hysteresis_cycles: must be at least 1")
        if not self.reclaim_min_age_seconds >= 0:
            raise ValueError("reclaim_min_age_seconds: must not be negative")
        if not self.reclaim_swing_margin >= 0:
            raise ValueError("reclaim_swing_margin: must not be negative")
        if not self.reclaim_window_seconds >= 0:
            raise ValueError("reclaim_window_seconds: must not be negative")
        if not self.fleet_idle_wait_seconds >= 0:
            raise ValueError("fleet_idle_wait_seconds: must not be negative")
        if not 0.0 < self.interruption_drain_threshold <= 1.0:
            raise ValueError("interruption_drain_threshold: must be within (0, 1]")
        if self.interruption_grace_seconds < 0:
            raise ValueError("interruption_grace_seconds: must not be negative")
        if self.health_miss_threshold < 1:
            raise ValueError("health_miss_threshold: must be at least 1")
        thresholds = [t for t, _ in self.grace_thresholds]
        if thresholds != sorted(thresholds, reverse=True):
            raise ValueError("grace_thresholds: thresholds must be in descending order")

    def hold_seconds(self, capacity_type: int) -> float | None:
        """Idle hold period for a capacity type; None means never release."""
        try:
            return self.idle_hold_seconds.get(CapacityType(capacity_type))
        except ValueError:
            return None


def _rebuilt(values: dict[str, object]) -> EngineConfig:
    """An unpickled :class:`EngineConfig`: its hold table read-only again."""
    hold = values["idle_hold_seconds"]
    assert isinstance(hold, Mapping)
    return EngineConfig(**{**values, "idle_hold_seconds": MappingProxyType(dict(hold))})  # type: ignore[arg-type]
