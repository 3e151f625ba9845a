"""The shard core: a plan's actions become operations, carried out through an Actuator.

    engine.cycle ──Plan──▶ ShardCore.execute ──Operation──▶ Actuator.start ──▶ Started
                              │                                   │
                              │ vanished machine: settled         ├ production: Executor
                              │ refused / not acting: settled     │   (Temporal workflow starts)
                              ▼                                   └ simulator: provider cores
                           ShardState                                 in virtual time

    Provision / AssignIdle  -> ProvisionOp  one per (provider, capacity type) of the action
    Preempt                 -> DrainOp      the preemptor waits; the victim's priority
    Reclaim                 -> DrainOp      nobody waits; the priority the machine serves
    Release                 -> DeleteOp
    Verify                  -> VerifyOp

What an operation *means* is decided here, once, for production and the
simulator alike (Nomad's scheduler over its ``Planner`` port, whose
``Harness`` runs the same scheduler for tests and simulation). How it is
carried out is the actuator's: the production actuator starts Temporal
workflows (batched to fit a search attribute, with deterministic ids); the
simulator's calls the simulated providers' cores. An actuator that wraps
another (recording, shadow mode, pause) sees every operation before it
reaches the world and may answer for it: that is the seam for gating.

An action whose machine vanished, an operation the actuator refused and
the rest of a plan after the actuator stopped acting are settled at once,
so the engine plans those machines again rather than holding them in
flight forever.

The core awaits only its actuator. An actuator that never waits (the
simulator's) is driven without an event loop by :func:`run_now`.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, assert_never

from shard_engine.model import (
    Action,
    AssignIdle,
    MachineRecord,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Requirement,
    Verify,
)
from workflows.contracts import REASON_PREEMPT, REASON_RECLAIM, REASON_RELEASE

log = logging.getLogger(__name__)

__all__ = [
    "Actuator",
    "CoreState",
    "DeleteOp",
    "DrainOp",
    "Operation",
    "Preemptor",
    "ProvisionOp",
    "ShardCore",
    "Started",
    "VerifyOp",
    "machines_of",
    "run_now",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProvisionOp:
    """Create (from speculative) or configure (from idle) machines for one need."""

    machines: tuple[MachineRecord, ...]
    cluster_id: str
    need_key: str
    priority: int
    requirements: tuple[Requirement, ...]
    #: True: Create, then Configure; False: the machines are idle, Configure only.
    create: bool


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The need a preemption drain frees its machine for."""

    cluster_id: str
    need_key: str
    priority: int


@dataclass(frozen=True, slots=True)
class DrainOp:
    """Drain one machine from the cluster it serves, with a grace."""

    machine: MachineRecord
    cluster_id: str
    grace_seconds: int
    reason: str
    #: The priority of the workload taken away.
    victim_priority: int
    #: Who waits for the machine (None: it goes back to idle for nobody).
    preemptor: Preemptor | None = None


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """Give an idle cloud machine back to its provider."""

    machine: MachineRecord
    reason: str = REASON_RELEASE


@dataclass(frozen=True, slots=True)
class VerifyOp:
    """Ask the provider whether a machine its cluster stopped reporting is alive."""

    machine: MachineRecord
    cluster_id: str


Operation = ProvisionOp | DrainOp | DeleteOp | VerifyOp


def machines_of(op: Operation) -> tuple[str, ...]:
    """The machines one operation acts on."""
    if isinstance(op, ProvisionOp):
        return tuple(r.id for r in op.machines)
    return (op.machine.id,)


@dataclass(frozen=True, slots=True)
class Started:
    """What an actuator did with one operation."""

    #: Units of work started (workflows in production, operations in the simulator).
    started: int = 0
    #: Machines whose part did not start: the core settles them.
    refused: tuple[str, ...] = ()


class Actuator(Protocol):
    """How a shard's operations reach the world (see the module docstring)."""

    @property
    def acting(self) -> bool:
        """False once the shard may not act (lease lost, fenced): nothing more starts."""
        ...

    async def start(self, op: Operation) -> Started:
        """Start ``op``; its refused machines are named in the answer, not raised."""
        ...


class CoreState(Protocol):
    """What the core needs of the shard's state (:class:`~bigfleet.shard.state.ShardState`)."""

    def machine(self, machine_id: str) -> MachineRecord | None: ...

    def settle(self, machine_id: str, record: MachineRecord | None) -> None: ...

    def priority(self, machine_id: str) -> int: ...


class ShardCore:
    """Turns a plan's actions into operations and hands them to one actuator."""

    def __init__(self, state: CoreState, actuator: Actuator, *, shard_id: str) -> None:
        self._state = state
        self._actuator = actuator
        self._shard_id = shard_id

    @property
    def actuator(self) -> Actuator:
        return self._actuator

    async def execute(self, actions: Sequence[Action]) -> int:
        """Carry out every action (in plan order); returns the units of work started."""
        started = 0
        for i, action in enumerate(actions):
            if not self._actuator.acting:
                rest = actions[i:]
                log.warning(
                    "shard %s stopped acting mid-plan; %d actions not started",
                    self._shard_id,
                    len(rest),
                )
                for left in rest:
                    self._give_back(_planned(left))
                break
            for op in self.operations(action):
                answer = await self._actuator.start(op)
                started += answer.started
                self._give_back(answer.refused)
        return started

    def operations(self, action: Action) -> list[Operation]:
        """The operations one action means; a machine that vanished is settled instead."""
        if isinstance(action, Provision | AssignIdle):
            ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
            return list(self._provisions(ids, action))
        record = self._state.machine(action.machine_id)
        if record is None:
            log.warning("machine %s vanished before its operation started", action.machine_id)
            self._state.settle(action.machine_id, None)
            return []
        match action:
            case Preempt():
                return [
                    DrainOp(
                        machine=record,
                        cluster_id=action.victim_cluster_id,
                        grace_seconds=action.grace_seconds,
                        reason=REASON_PREEMPT,
                        victim_priority=action.victim_priority,
                        preemptor=Preemptor(
                            action.preemptor_cluster_id,
                            action.preemptor_need_key,
                            action.preemptor_priority,
                        ),
                    )
                ]
            case Reclaim():
                return [
                    DrainOp(
                        machine=record,
                        cluster_id=action.cluster_id,
                        grace_seconds=action.grace_seconds,
                        reason=action.reason or REASON_RECLAIM,
                        victim_priority=self._state.priority(record.id),
                    )
                ]
            case Release():
                return [DeleteOp(record)]
            case Verify():
                return [VerifyOp(record, action.cluster_id)]
            case _:
                assert_never(action)

    def _provisions(
        self, machine_ids: Iterable[str], action: Provision | AssignIdle
    ) -> Iterable[ProvisionOp]:
        """One operation per (provider, capacity type): each is one provider's batch."""
        groups: dict[tuple[str, int], list[MachineRecord]] = {}
        for mid in machine_ids:
            record = self._state.machine(mid)
            if record is None:
                log.warning("planned machine %s vanished before its operation started", mid)
                self._state.settle(mid, None)
                continue
            groups.setdefault((record.provider, int(record.capacity_type)), []).append(record)
        for records in groups.values():
            yield ProvisionOp(
                machines=tuple(records),
                cluster_id=action.cluster_id,
                need_key=action.need_key,
                priority=action.priority,
                requirements=action.requirements,
                create=isinstance(action, Provision),
            )

    def _give_back(self, machine_ids: Iterable[str]) -> None:
        for mid in machine_ids:
            self._state.settle(mid, self._state.machine(mid))


def _planned(action: Action) -> tuple[str, ...]:
    """The machines an action marked in flight."""
    if isinstance(action, Provision):
        return tuple(action.machine_ids)
    return (action.machine_id,)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never waits (an actuator that acts at once).

    Cheaper than an event loop by orders of magnitude, which the simulator's
    thousands of cycles a virtual hour need. Raises ``RuntimeError`` if the
    coroutine suspends: such an actuator needs an event loop.
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coroutine.close()
    raise RuntimeError("run_now: the coroutine waited; drive it on an event loop")
