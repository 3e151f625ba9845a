"""The shard core: what each action means, and what is settled when nothing starts."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

from bigfleet.shard.core import (
    DeleteOp,
    DrainOp,
    Operation,
    ProvisionOp,
    ShardCore,
    Started,
    VerifyOp,
    machines_of,
    run_now,
)
from shard_engine.model import (
    AssignIdle,
    CapacityType,
    MachineRecord,
    MachineState,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Verify,
)


def _record(
    mid: str, provider: str = "simcloud", capacity: CapacityType = CapacityType.SPOT
) -> MachineRecord:
    return MachineRecord(
        id=mid,
        state=MachineState.IDLE,
        provider=provider,
        instance_type="m6i.large",
        zone="z1",
        capacity_type=capacity,
        price_per_hour=0.1,
        interruption_probability=0.0,
        allocatable={"cpu": 2.0},
        host_ref=f"host-{mid}",
    )


@dataclass
class Machines:
    """The state the core reads; settles are recorded."""

    records: dict[str, MachineRecord]
    priorities: dict[str, int] = field(default_factory=dict)
    settled: list[str] = field(default_factory=list)

    def machine(self, machine_id: str) -> MachineRecord | None:
        return self.records.get(machine_id)

    def settle(self, machine_id: str, record: MachineRecord | None) -> None:
        self.settled.append(machine_id)

    def priority(self, machine_id: str) -> int:
        return self.priorities.get(machine_id, 0)


@dataclass
class Recording:
    """An actuator that refuses the machines it is told to and stops acting on cue."""

    refuse: set[str] = field(default_factory=set)
    stop_after: int | None = None
    started: list[Operation] = field(default_factory=list)

    @property
    def acting(self) -> bool:
        return self.stop_after is None or len(self.started) < self.stop_after

    async def start(self, op: Operation) -> Started:
        self.started.append(op)
        refused = tuple(m for m in machines_of(op) if m in self.refuse)
        return Started(len(machines_of(op)) - len(refused), refused)


def _core(ids: list[str], actuator: Recording) -> tuple[ShardCore, Machines]:
    machines = Machines({m: _record(m) for m in ids})
    machines.records["bm-1"] = _record("bm-1", "metal", CapacityType.BARE_METAL)
    return ShardCore(machines, actuator, shard_id="s"), machines


def test_each_action_becomes_its_operation() -> None:
    actuator = Recording()
    core, machines = _core(["m1", "m2", "m3", "m4", "m5"], actuator)
    machines.priorities["m3"] = 250
    run_now(
        core.execute(
            (
                Provision(("m1", "bm-1"), "c", "need", 10),
                AssignIdle("m2", "c", "need", 10),
                Reclaim("m3", "c", 600),
                Preempt("m4", "victim", 100, "urgent", "need-u", 1_000, 30),
                Release("m5"),
                Verify("m1", "c"),
            )
        )
    )
    kinds = [type(op).__name__ for op in actuator.started]
    assert kinds == [
        "ProvisionOp",
        "ProvisionOp",
        "ProvisionOp",
        "DrainOp",
        "DrainOp",
        "DeleteOp",
        "VerifyOp",
    ]
    create_cloud, create_metal, configure = actuator.started[:3]
    assert isinstance(create_cloud, ProvisionOp) and create_cloud.create
    assert isinstance(create_metal, ProvisionOp) and [r.id for r in create_metal.machines] == [
        "bm-1"
    ]
    assert isinstance(configure, ProvisionOp) and not configure.create
    reclaim, preempt = actuator.started[3:5]
    assert isinstance(reclaim, DrainOp) and reclaim.preemptor is None
    assert reclaim.victim_priority == 250 and reclaim.reason == "reclaim"
    assert isinstance(preempt, DrainOp) and preempt.preemptor is not None
    assert preempt.victim_priority == 100 and preempt.grace_seconds == 30
    assert isinstance(actuator.started[5], DeleteOp) and isinstance(actuator.started[6], VerifyOp)
    assert machines.settled == []


def test_a_vanished_machine_is_settled_not_started() -> None:
    actuator = Recording()
    core, machines = _core(["m1"], actuator)
    run_now(core.execute((Release("gone"), Provision(("gone-2", "m1"), "c", "n", 1))))
    assert machines.settled == ["gone", "gone-2"]
    assert [machines_of(op) for op in actuator.started] == [("m1",)]


def test_refused_machines_are_settled_and_the_rest_counted_started() -> None:
    actuator = Recording(refuse={"m2"})
    core, machines = _core(["m1", "m2"], actuator)
    assert run_now(core.execute((Provision(("m1", "m2"), "c", "n", 1),))) == 1
    assert machines.settled == ["m2"]


def test_once_the_actuator_stops_acting_the_rest_of_the_plan_is_settled() -> None:
    actuator = Recording(stop_after=1)
    core, machines = _core(["m1", "m2", "m3"], actuator)
    run_now(core.execute((Release("m1"), Release("m2"), Provision(("m3",), "c", "n", 1))))
    assert [machines_of(op) for op in actuator.started] == [("m1",)]
    assert machines.settled == ["m2", "m3"]


class _Suspends:
    """An awaitable that suspends once, as an actuator waiting on I/O would."""

    def __await__(self) -> Generator[None, None, None]:
        yield None


async def _waits() -> int:
    await _Suspends()
    return 1


def test_run_now_refuses_a_coroutine_that_waits() -> None:
    with pytest.raises(RuntimeError, match="run_now: the coroutine waited"):
        run_now(_waits())
