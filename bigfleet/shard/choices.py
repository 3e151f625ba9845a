"""A donor shard's choices for a coordinator instruction, over its engine.

    donations   unbound idle or speculative machines of one profile to give away
    victims     configured machines of one profile serving a lower priority, best
                first by local preemption's victim score, with their grace

Both read the engine as it is now: what is in flight or promised is never
chosen (nor anything in ``extra_busy``, the caller's own machines in
motion), and victims are scored with the drain times the engine learned and
the shard's saturation, as Phase 2 scores local ones. The pure choosing is
``shard_engine.transfers``; this module is the one place that gathers its
inputs from an engine, for the production donor (``transfers.py``) and for
the simulator's engines wherever they live, so both choose alike. (The
simulator used to score victims without the learned drain times.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineRecord, MachineState
from shard_engine.transfers import (
    CrossShardVictim,
    TransferProfile,
    VictimTerms,
    choose_cross_shard_victims,
    choose_donations,
    saturation_of,
)

__all__ = [
    "CrossShardVictim",
    "DonorChoices",
    "EngineChoices",
    "TransferProfile",
    "VictimTerms",
    "busy",
    "donations",
    "victims",
]


def busy(engine: ShardEngine, extra_busy: Collection[str] = ()) -> set[str]:
    """Machines no instruction may take: in flight, promised to a preemptor, or ``extra_busy``."""
    return set(engine.in_flight()) | set(engine.promised()) | set(extra_busy)


def donations(
    engine: ShardEngine,
    *,
    profile: TransferProfile,
    state: MachineState,
    count: int,
    extra_busy: Collection[str] = (),
) -> tuple[MachineRecord, ...]:
    """Up to ``count`` unbound machines of ``profile`` in ``state`` to give away.

    Chosen among the engine's free machines of that shape (its free pools),
    which hold every machine ``choose_donations`` may take.
    """
    return choose_donations(
        engine.free_machines(
            state,
            provider=profile.provider,
            instance_type=profile.instance_type,
            zone=profile.zone,
            capacity_type=profile.capacity_type,
        ),
        profile=profile,
        state=state,
        count=count,
        busy=busy(engine, extra_busy),
    )


def victims(
    engine: ShardEngine,
    *,
    profile: TransferProfile,
    below_priority: int,
    count: int,
    priorities: Mapping[str, int],
    terms: Mapping[str, VictimTerms],
    config: EngineConfig,
    extra_busy: Collection[str] = (),
) -> tuple[CrossShardVictim, ...]:
    """Up to ``count`` victims for another shard's need at ``below_priority``, best first."""
    machines = list(engine.machines())
    taken = busy(engine, extra_busy)
    return choose_cross_shard_victims(
        machines,
        profile=profile,
        preemptor_priority=below_priority,
        count=count,
        busy=taken,
        priorities=priorities,
        terms=terms,
        drain_seconds=engine.drain_estimates(),
        saturation=saturation_of(machines, busy=taken),
        config=config,
    )


class DonorChoices(Protocol):
    """How a donor's carry-out (``bigfleet.shard.transfers``) reaches these choices.

    :class:`EngineChoices` over an engine in this process (production); the
    simulator's answers from wherever its engines live.
    """

    def donations(
        self, *, profile: TransferProfile, state: MachineState, count: int
    ) -> Sequence[MachineRecord]: ...

    def victims(
        self,
        *,
        profile: TransferProfile,
        below_priority: int,
        count: int,
        priorities: Mapping[str, int],
        terms: Mapping[str, VictimTerms],
        config: EngineConfig,
    ) -> Sequence[CrossShardVictim]: ...


@dataclass(frozen=True, slots=True)
class EngineChoices:
    """:func:`donations` and :func:`victims` over one engine in this process."""

    engine: ShardEngine

    def donations(
        self, *, profile: TransferProfile, state: MachineState, count: int
    ) -> tuple[MachineRecord, ...]:
        return donations(self.engine, profile=profile, state=state, count=count)

    def victims(
        self,
        *,
        profile: TransferProfile,
        below_priority: int,
        count: int,
        priorities: Mapping[str, int],
        terms: Mapping[str, VictimTerms],
        config: EngineConfig,
    ) -> tuple[CrossShardVictim, ...]:
        return victims(
            self.engine,
            profile=profile,
            below_priority=below_priority,
            count=count,
            priorities=priorities,
            terms=terms,
            config=config,
        )
