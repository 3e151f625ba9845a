"""ClusterMoveWorkflow and HandoverWorkflow on the time-skipping server, with recording fakes
registered under the real activity names on the real task queues."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio import activity
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from workflows import coordinator_contracts as co
from workflows import membership as ms
from workflows import search_attributes as sa
from workflows.contracts import REASON_SHARD_DRAIN, MachineTarget

MACHINES = [MachineTarget("m1", "sim"), MachineTarget("m2", "sim")]


@dataclass
class Recorder:
    """Plays both shards and the coordinator's store; records what each was asked."""

    busy_attempts: int = 0
    refuse: str = ""
    records: list[ms.MembershipRecord] = field(default_factory=list)
    outcomes: list[co.InstructionOutcome] = field(default_factory=list)
    adopted: list[tuple[str, list[str]]] = field(default_factory=list)
    release_attempts: int = 0

    def activities(self, queue: str) -> list[Callable[..., Any]]:
        @activity.defn(name=ms.RELEASE_CLUSTER)
        async def release_cluster(inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
            self.release_attempts += 1
            if self.release_attempts <= self.busy_attempts:
                raise ApplicationError("1 machine(s) in motion", type=ms.MACHINES_IN_MOTION)
            if self.refuse:
                return ms.ReleaseClusterResult(refused=self.refuse)
            return ms.ReleaseClusterResult(MACHINES, inp.receiver)

        @activity.defn(name=ms.HAND_OVER)
        async def hand_over(inp: ms.HandOverInput) -> ms.HandOverResult:
            return ms.HandOverResult(inp.machines[:1])

        @activity.defn(name=co.ADOPT_MACHINES)
        async def adopt(inp: co.AdoptInput) -> co.AdoptResult:
            self.adopted.append((queue, [m.machine_id for m in inp.machines]))
            return co.AdoptResult(len(inp.machines))

        @activity.defn(name=ms.RECORD_MEMBERSHIP)
        async def record(inp: ms.MembershipRecord) -> None:
            self.records.append(inp)

        @activity.defn(name=co.FINISH_INSTRUCTION)
        async def finish(inp: co.InstructionOutcome) -> None:
            self.outcomes.append(inp)

        if queue == co.COORDINATOR_QUEUE:
            return [record, finish]
        return [release_cluster, hand_over, adopt]


@pytest.fixture
def env(time_skipping_env: WorkflowEnvironment) -> WorkflowEnvironment:
    return time_skipping_env


async def _run(
    env: WorkflowEnvironment,
    rec: Recorder,
    workflow: str,
    arg: object,
    attributes: list[TypedSearchAttributes] | None = None,
) -> object:
    """Run one membership workflow; ``attributes`` receives its final search attributes."""
    workers = [
        Worker(
            env.client,
            task_queue=queue,
            workflows=[ms.ClusterMoveWorkflow, ms.HandoverWorkflow]
            if queue == co.COORDINATOR_QUEUE
            else [],
            activities=rec.activities(queue),
        )
        for queue in (co.COORDINATOR_QUEUE, "shard-old", "shard-new")
    ]
    async with workers[0], workers[1], workers[2]:
        handle = await env.client.start_workflow(
            workflow,
            arg,
            id=f"test-{uuid.uuid4()}",
            task_queue=co.COORDINATOR_QUEUE,
            result_type=ms.MembershipResult,
        )
        result = await handle.result()
        if attributes is not None:
            attributes.append((await handle.describe()).typed_search_attributes)
        return result


MOVE = ms.ClusterMoveInput(4, 9, ms.ClusterMoveSpec("web", "old", "new"))


async def test_a_cluster_move_waits_for_machines_in_motion_then_the_receiver_adopts(
    env: WorkflowEnvironment,
) -> None:
    rec = Recorder(busy_attempts=3)
    attributes: list[TypedSearchAttributes] = []

    result = await _run(env, rec, "ClusterMoveWorkflow", MOVE, attributes)

    assert isinstance(result, ms.MembershipResult)
    assert (result.status, result.moved) == ("applied", 2)
    assert rec.release_attempts == 4
    assert rec.adopted == [("shard-new", ["m1", "m2"])]
    assert [(r.kind, r.cluster_id, r.term, r.seq) for r in rec.records] == [
        ("cluster-move", "web", 4, 9)
    ]
    assert [(o.status, o.term, o.seq) for o in rec.outcomes] == [("applied", 4, 9)]
    (attrs,) = attributes
    assert (attrs.get(sa.REASON), attrs.get(sa.SHARD_ID), attrs.get(sa.CLUSTER_ID)) == (
        REASON_SHARD_DRAIN,
        "old",
        "web",
    )


async def test_a_refused_cluster_move_adopts_nothing_and_says_why(
    env: WorkflowEnvironment,
) -> None:
    rec = Recorder(refuse="shard old is active, not draining")

    result = await _run(env, rec, "ClusterMoveWorkflow", MOVE)

    assert isinstance(result, ms.MembershipResult)
    assert result.status == "refused" and "not draining" in result.outcome
    assert rec.adopted == []
    assert [o.status for o in rec.outcomes] == ["refused"]


async def test_a_handover_adopts_only_what_the_donor_released(env: WorkflowEnvironment) -> None:
    rec = Recorder()
    attributes: list[TypedSearchAttributes] = []

    result = await _run(
        env,
        rec,
        "HandoverWorkflow",
        ms.HandoverInput(4, 10, ms.HandoverSpec("old", "new", MACHINES)),
        attributes,
    )

    assert isinstance(result, ms.MembershipResult)
    assert (result.status, result.moved) == ("applied", 1)
    assert rec.adopted == [("shard-new", ["m1"])]
    assert rec.records[0].machine_ids == ["m1", "m2"]
    (attrs,) = attributes
    assert (attrs.get(sa.REASON), attrs.get(sa.SHARD_ID)) == (REASON_SHARD_DRAIN, "old")
