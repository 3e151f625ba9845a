"""Builders for engine tests: machines, needs, roll-ups, and a fake that carries plans out.

:class:`Carrier` plays provider and workflows: it turns every action of a
plan into the observation a well-behaved provider would report when the
operation finishes, and settles it. Tests that need a failure settle by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from shard_engine.engine import ShardEngine
from shard_engine.model import (
    Action,
    AppClass,
    AssignIdle,
    CapacityType,
    MachineRecord,
    MachineState,
    Need,
    Operator,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Requirement,
    Rollup,
    TopologySpread,
    Verify,
    WhenUnsatisfiable,
)

GI = 2.0**30

A = TypeVar("A", AssignIdle, Provision, Preempt, Reclaim, Release, Verify)


def machine(
    machine_id: str,
    *,
    state: MachineState = MachineState.IDLE,
    instance_type: str = "m.xlarge",
    zone: str = "zone-a",
    capacity_type: CapacityType = CapacityType.ON_DEMAND,
    price: float = 1.0,
    probability: float = 0.0,
    cpu: float = 4.0,
    memory: float = 16 * GI,
    gpu: float = 0.0,
    cluster: str = "",
    labels: Mapping[str, str] | None = None,
    provider: str = "sim",
) -> MachineRecord:
    """A machine record with sensible defaults (an idle 4-core on-demand box)."""
    allocatable = {"cpu": cpu, "memory": memory}
    if gpu:
        allocatable["nvidia.com/gpu"] = gpu
    return MachineRecord(
        id=machine_id,
        state=state,
        provider=provider,
        instance_type=instance_type,
        zone=zone,
        capacity_type=capacity_type,
        price_per_hour=price,
        interruption_probability=probability,
        allocatable=allocatable,
        labels=dict(labels or {}),
        cluster=cluster if state.has_host else "",
        host_ref=f"host-{machine_id}" if state.has_host else "",
    )


def need(
    *,
    cpu: float = 0.0,
    memory: float = 0.0,
    gpu: float = 0.0,
    priority: int = 1000,
    requirements: Iterable[Requirement] = (),
    min_cpu: float = 0.0,
    min_memory: float = 0.0,
    min_gpu: float = 0.0,
    spread: Iterable[TopologySpread] = (),
    interruption_penalty: float = 0.0,
    reclamation_penalty: float = 0.0,
    app_class: AppClass = AppClass.BATCH,
) -> Need:
    """A need for an aggregate of resources (only non-zero amounts are listed)."""
    aggregate = {
        k: v for k, v in (("cpu", cpu), ("memory", memory), ("nvidia.com/gpu", gpu)) if v != 0
    }
    unit = {
        k: v
        for k, v in (("cpu", min_cpu), ("memory", min_memory), ("nvidia.com/gpu", min_gpu))
        if v > 0
    }
    return Need(
        requirements=tuple(requirements),
        aggregate=aggregate,
        priority=priority,
        min_unit=unit,
        spread=tuple(spread),
        interruption_penalty=interruption_penalty,
        reclamation_penalty=reclamation_penalty,
        app_class=app_class,
    )


def zone_in(*zones: str) -> Requirement:
    """Requirement: the machine's zone is one of ``zones``."""
    return Requirement("topology.kubernetes.io/zone", Operator.IN, tuple(zones))


def same(key: str, *values: str) -> Requirement:
    """Requirement: every machine of the need shares one value of ``key``."""
    return Requirement(key, Operator.SAME, tuple(values))


def spread_over(key: str, max_skew: int = 1, *, hard: bool = True) -> TopologySpread:
    """A topology spread over ``key``."""
    when = WhenUnsatisfiable.DO_NOT_SCHEDULE if hard else WhenUnsatisfiable.SCHEDULE_ANYWAY
    return TopologySpread(key, max_skew, when)


def rollup(
    cluster: str, timestamp: int, *needs: Need, reported: Iterable[str] | None = None
) -> Rollup:
    """A roll-up of ``needs`` from ``cluster`` at ``timestamp`` (nanoseconds)."""
    return Rollup(
        cluster_id=cluster,
        timestamp_ns=timestamp,
        needs=tuple(needs),
        reported_nodes=None if reported is None else frozenset(reported),
    )


def machine_ids(actions: Iterable[Action]) -> list[str]:
    """Every machine id named by ``actions``, in order (duplicates kept)."""
    out: list[str] = []
    for action in actions:
        if isinstance(action, Provision):
            out.extend(action.machine_ids)
        else:
            out.append(action.machine_id)
    return out


def of_kind(plan: Plan, kind: type[A]) -> list[A]:
    """The plan's actions of one type."""
    return [a for a in plan.actions if isinstance(a, kind)]


@dataclass
class Carrier:
    """A well-behaved provider and workflow layer: carries every action out and settles it."""

    engine: ShardEngine
    dead: set[str] = field(default_factory=set)

    def outcome(self, action: Action, machine_id: str) -> MachineRecord | None:
        """The observation the provider would report once ``action`` finished."""
        record = self.engine.machine(machine_id)
        assert record is not None, machine_id
        if isinstance(action, AssignIdle | Provision):
            return replace(
                record,
                state=MachineState.CONFIGURED,
                cluster=action.cluster_id,
                host_ref=record.host_ref or f"host-{machine_id}",
            )
        if isinstance(action, Preempt | Reclaim):
            return replace(record, state=MachineState.IDLE, cluster="")
        if isinstance(action, Release):
            return replace(record, state=MachineState.SPECULATIVE, cluster="", host_ref="")
        if isinstance(action, Verify):
            if machine_id in self.dead:
                return replace(record, state=MachineState.FAILED, last_error="host unreachable")
            return record
        raise AssertionError(f"unknown action {action!r}")

    def carry(self, plan: Plan, *, now: float) -> None:
        """Settle every action of ``plan`` as finished."""
        for action in plan.actions:
            ids = action.machine_ids if isinstance(action, Provision) else (action.machine_id,)
            for machine_id in ids:
                self.engine.settle(machine_id, self.outcome(action, machine_id), now=now)

    def run(self, *, now: float, cycles: int = 1) -> list[Plan]:
        """Cycle and carry out ``cycles`` times, one second apart."""
        plans = []
        for i in range(cycles):
            plan = self.engine.cycle(now=now + i)
            self.carry(plan, now=now + i)
            plans.append(plan)
        return plans


def fleet(
    engine: ShardEngine,
    count: int,
    *,
    prefix: str = "m",
    now: float = 0.0,
    **kwargs: object,
) -> list[str]:
    """Add ``count`` identical machines; returns their ids."""
    ids = [f"{prefix}-{i:04d}" for i in range(count)]
    for machine_id in ids:
        engine.upsert_machine(machine(machine_id, **kwargs), now=now)  # type: ignore[arg-type]
    return ids
