"""The shard core with production's actuator (the Executor) turns each engine action into the
right workflow, id, input and search attributes.

No worker serves the task queue here: the workflows are only started, then
inspected through the server (description and first history event).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from bigfleet.shard.core import ShardCore
from bigfleet.shard.executor import Executor
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.sequences import OperationSequences
from bigfleet.temporal import start_time_skipping
from shard_engine.model import (
    CapacityType,
    MachineRecord,
    MachineState,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Verify,
)
from workflows import search_attributes as sa
from workflows.contracts import (
    DeadlinePolicy,
    DeleteInput,
    DrainInput,
    ProvisionInput,
    VerifyInput,
)

_RUN = itertools.count(1)


@dataclass
class StubEngine:
    """The shard state the core reads: machines, the priority each serves; settles recorded."""

    records: dict[str, MachineRecord]
    settled: list[tuple[str, MachineRecord | None]] = field(default_factory=list)
    priorities: dict[str, int] = field(default_factory=dict)

    def machine(self, machine_id: str) -> MachineRecord | None:
        return self.records.get(machine_id)

    def settle(self, machine_id: str, record: MachineRecord | None) -> None:
        self.settled.append((machine_id, record))

    def priority(self, machine_id: str) -> int:
        return self.priorities.get(machine_id, 0)


@dataclass
class StubShard:
    """What the executor is built from: a Temporal client, the engine, sequences."""

    temporal: Client
    engine: StubEngine
    shard_id: str = field(default_factory=lambda: f"shard-x{next(_RUN)}")
    options: ShardOptions = field(default_factory=ShardOptions)
    seqs: OperationSequences = field(default_factory=OperationSequences)


def _record(machine_id: str, capacity: CapacityType = CapacityType.ON_DEMAND) -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=MachineState.CONFIGURED,
        provider="simcloud" if capacity is not CapacityType.BARE_METAL else "bm",
        instance_type="m6i.large",
        zone="z1",
        capacity_type=capacity,
        price_per_hour=0.1,
        interruption_probability=0.0,
        allocatable={"cpu": 2.0},
        cluster="victim",
    )


@pytest.fixture(scope="module")
async def own_env() -> AsyncIterator[WorkflowEnvironment]:
    """A server of its own: the workflows started here are never run, and a workflow
    task nobody polls would stop the shared server from skipping time for later tests."""
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def shard(own_env: WorkflowEnvironment) -> StubShard:
    records = {m: _record(m) for m in ("m-1", "m-2", "m-3", "m-4", "m-5")} | {
        "bm-1": _record("bm-1", CapacityType.BARE_METAL)
    }
    return StubShard(own_env.client, StubEngine(records))


def _executor(shard: StubShard, priorities: Mapping[str, int] | None = None) -> ShardCore:
    """The shard core acting through production's actuator."""
    shard.engine.priorities.update(priorities or {})
    executor = Executor(
        shard.temporal,
        shard_id=shard.shard_id,
        task_queue=f"nobody-serves-{uuid.uuid4()}",
        sequences=shard.seqs,
        deadlines=DeadlinePolicy(shard.options.deadlines, dict(shard.options.deadline_overrides)),
        poll=shard.options.poll,
    )
    return ShardCore(shard.engine, executor, shard_id=shard.shard_id)


async def _started(
    shard: StubShard, wf_id: str
) -> tuple[WorkflowHandle[Any, Any], Any, Mapping[str, Any]]:
    handle = shard.temporal.get_workflow_handle(wf_id)
    described = await handle.describe()
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (payload,) = started.input.payloads
    attrs = described.typed_search_attributes
    values = {pair.key.name: pair.value for pair in attrs.search_attributes}
    return handle, (described.workflow_type, payload), values


def _decode(shard: StubShard, payload: Any, cls: type) -> Any:
    (value,) = shard.temporal.data_converter.payload_converter.from_payloads([payload], [cls])
    return value


async def test_a_preemption_becomes_a_drain_with_the_victims_priority_and_its_reason(
    shard: StubShard,
) -> None:
    plan = Plan(
        now=1_000.0,
        actions=(Preempt("m-1", "victim", 100_000, "urgent", "need-u", 1_000_000, 30),),
    )
    assert await _executor(shard).execute(plan.actions) == 1
    _, (wf_type, payload), attrs = await _started(shard, f"{shard.shard_id}/drain/m-1/1")
    assert wf_type == "DrainWorkflow"
    inp = _decode(shard, payload, DrainInput)
    assert inp.grace_seconds == 30 and inp.cluster_id == "victim"
    assert inp.waiter.priority == 1_000_000 and inp.waiter.cluster_id == "urgent"
    assert inp.waiter.need_key == "need-u" and inp.victim_priority == 100_000
    assert inp.reason == "preempt"
    # BigFleetPriority is the victim's; the preemptor's rides in the waiter.
    assert attrs["BigFleetPriority"] == 100_000 and attrs["BigFleetGraceSeconds"] == 30
    assert attrs["BigFleetReason"] == "preempt"
    assert attrs["BigFleetMachineId"] == "m-1" and attrs["BigFleetOperation"] == "drain"
    assert attrs["BigFleetPhase"] == "DRAINING" and attrs["BigFleetClusterId"] == "victim"
    assert attrs["BigFleetShardId"] == shard.shard_id
    assert attrs["BigFleetShardMode"] == "active"
    described = await shard.temporal.get_workflow_handle(f"{shard.shard_id}/drain/m-1/1").describe()
    assert await described.static_summary() == (
        "drain m-1 from victim: preempt (for urgent at priority 1000000)"
    )
    details = await described.static_details() or ""
    assert "**victim priority**: 100000" in details and "**grace**: 30 s" in details


async def test_a_reclaim_becomes_a_drain_nobody_waits_for(shard: StubShard) -> None:
    executor = _executor(shard, priorities={"m-2": 250_000})
    await executor.execute((Reclaim("m-2", "victim", 600),))
    _, (_, payload), attrs = await _started(shard, f"{shard.shard_id}/drain/m-2/1")
    inp = _decode(shard, payload, DrainInput)
    assert inp.waiter is None and inp.reason == "reclaim" and inp.grace_seconds == 600
    assert inp.victim_priority == 250_000
    assert attrs["BigFleetPriority"] == 250_000 and attrs["BigFleetReason"] == "reclaim"


async def test_a_decommission_drain_carries_its_reason(shard: StubShard) -> None:
    retire = Reclaim("m-5", "victim", 600, reason="decommission")
    await _executor(shard).execute((retire,))
    _, (_, payload), attrs = await _started(shard, f"{shard.shard_id}/drain/m-5/1")
    assert _decode(shard, payload, DrainInput).reason == "decommission"
    assert attrs["BigFleetReason"] == "decommission"


async def test_release_and_verify_get_their_own_workflows(shard: StubShard) -> None:
    plan = Plan(1_000.0, (Release("m-3"), Verify("m-4", "victim")))
    assert await _executor(shard).execute(plan.actions) == 2
    _, (wf_type, payload), attrs = await _started(shard, f"{shard.shard_id}/delete/m-3/1")
    assert wf_type == "DeleteWorkflow" and attrs["BigFleetPhase"] == "DELETING"
    assert attrs["BigFleetReason"] == "release"
    assert _decode(shard, payload, DeleteInput).machine.provider == "simcloud"
    _, (wf_type, payload), attrs = await _started(shard, f"{shard.shard_id}/verify/m-4/1")
    assert wf_type == "VerifyWorkflow" and attrs["BigFleetClusterId"] == "victim"
    assert _decode(shard, payload, VerifyInput).cluster_id == "victim"


async def test_deadlines_follow_the_capacity_type(shard: StubShard) -> None:
    plan = Plan(1_000.0, (Provision(("m-1", "bm-1"), "c", "need", 10),))
    started = await _executor(shard).execute(plan.actions)
    assert started == 2, "one batch per provider and capacity type"
    _, (_, cloud), _ = await _started(shard, f"{shard.shard_id}/provision/m-1/1")
    _, (_, metal), _ = await _started(shard, f"{shard.shard_id}/provision/bm-1/1")
    assert _decode(shard, cloud, ProvisionInput).deadlines.creating_s == 600
    assert _decode(shard, metal, ProvisionInput).deadlines.creating_s == 6 * 3600


async def test_the_same_action_at_the_same_sequence_finds_the_running_workflow(
    shard: StubShard,
) -> None:
    await _executor(shard).execute((Reclaim("m-2", "victim", 600),))
    shard.seqs = OperationSequences()  # a restarted shard that had not recorded the drain yet
    await _executor(shard).execute((Reclaim("m-2", "victim", 600),))
    handle = shard.temporal.get_workflow_handle(f"{shard.shard_id}/drain/m-2/1")
    history = await handle.fetch_history()
    starts = [
        e for e in history.events if e.HasField("workflow_execution_started_event_attributes")
    ]
    assert len(starts) == 1


async def test_an_action_on_a_vanished_machine_is_settled_not_started(shard: StubShard) -> None:
    assert await _executor(shard).execute((Release("gone"),)) == 0
    assert shard.engine.settled == [("gone", None)]


async def test_a_large_provision_is_split_into_batches_whose_ids_fit_one_search_attribute(
    own_env: WorkflowEnvironment,
) -> None:
    ids = [f"simcloud-fleet-a-us-east-1a-m6i-large-od-{i:03d}" for i in range(100)]
    shard = StubShard(own_env.client, StubEngine({m: _record(m) for m in ids}))
    started = await _executor(shard).execute((Provision(tuple(ids), "c", "need", 10),))
    assert started >= 3, "100 ids of 45 characters cannot share one 2 KiB attribute"
    listed: list[str] = []
    first = 0
    for _ in range(started):
        left = min(64, len(ids) - first)
        size = next(n for n in range(left, 0, -1) if sa.fits(ids[first : first + n]))
        wf_id = f"{shard.shard_id}/provision/{ids[first]}+{size - 1}/1"
        _, (_, payload), attrs = await _started(shard, wf_id)
        batch = [m.machine_id for m in _decode(shard, payload, ProvisionInput).machines]
        assert attrs["BigFleetMachineIds"] == batch
        listed += batch
        first += size
    assert listed == ids


async def test_a_workflow_started_during_a_pause_says_so_from_its_start(shard: StubShard) -> None:
    # Only an operator's command starts anything while a shard is paused (ADR 0142).
    mode = "paused"
    executor = Executor(
        shard.temporal,
        shard_id=shard.shard_id,
        task_queue=f"nobody-serves-{uuid.uuid4()}",
        sequences=shard.seqs,
        deadlines=DeadlinePolicy(shard.options.deadlines, dict(shard.options.deadline_overrides)),
        poll=shard.options.poll,
        mode=lambda: mode,
    )
    wf_id = await executor.start_operator_drain(shard.engine.records["m-4"], grace_seconds=60)
    _, _, attrs = await _started(shard, wf_id)
    assert attrs["BigFleetShardMode"] == "paused" and attrs["BigFleetReason"] == "operator"
