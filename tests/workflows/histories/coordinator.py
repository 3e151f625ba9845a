"""Coordinator scenarios for the replay histories (``python -m tests.workflows.histories.record``).

The coordinator's workflows run on the time-skipping server with their real
definitions on their real task queues. What stands in for the coordinator's
store and planner, and for each shard's half of an instruction, is a
scripted :class:`Shards` registered under the real activity names: a replay
test needs the commands a workflow issues, not a database behind them. The
one drain a cross-shard preemption starts is the real ``DrainWorkflow`` with
its real activities over the provider fake, on the donor's task queue.

    coordinator_rounds      CoordinatorWorkflow, two rounds, then continue-as-new;
                            its children: an idle transfer, a cross-shard
                            preemption (with its drain), a cluster move, a handover
    decommission_two_shards DecommissionWorkflow retiring from two shards
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowContinuedAsNewError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.registry import activities_for
from providers.fake import default_fake_config
from providers.model import FencingToken
from tests.workflows.harness import PROVIDER, AdvancingProvider, HarnessContext
from tests.workflows.rig import FAST_POLL
from workflows import coordinator as co
from workflows import membership_contracts as ms
from workflows.contracts import DrainInput, MachineTarget
from workflows.registry import ALL_WORKFLOWS, COORDINATOR_WORKFLOWS

DONOR, RECEIVER = "a", "b"
TERM = 3


def _spec(kind: co.TransferKind, *, count: int = 1, below: int = 0) -> co.TransferSpec:
    return co.TransferSpec(
        kind=kind,
        donor=DONOR,
        receiver=RECEIVER,
        provider=PROVIDER,
        instance_type="g5.xlarge",
        zone="z1",
        capacity_type=2,
        count=count,
        cluster_id="gpu-c",
        need_key=f"need-{kind}",
        priority=900_000,
        below_priority=below,
    )


def report() -> co.ShardReport:
    """Shard b is short of GPUs; shard a holds some idle and some at low priority."""
    return co.ShardReport(
        shard_id=RECEIVER,
        epoch=1,
        sent_at=1_000.0,
        total_machines=4,
        profiles=[co.ProfileReport(PROVIDER, "g5.xlarge", "z1", 2, {}, {"nvidia.com/gpu": 1.0})],
        shortfalls=[
            co.ShortfallReport("gpu-c", "need-idle", 900_000, {"nvidia.com/gpu": 2.0}),
        ],
    )


def offer() -> co.IdleOffer:
    """What the first round offers shard b: two idle GPU machines of shard a."""
    return co.IdleOffer(DONOR, {"zone": "z1"}, {"nvidia.com/gpu": 1.0}, 2)


@dataclass
class Shards:
    """The coordinator's store and planner and both shards' halves, scripted and recorded."""

    fake: AdvancingProvider
    victim: str = ""
    calls: list[str] = field(default_factory=list)
    _rounds: int = 0

    def coordinator(self) -> list[Callable[..., Any]]:
        @activity.defn(name=co.DISTRIBUTE)
        async def distribute(inp: co.DistributeInput) -> co.DistributeResult:
            self._rounds += 1
            self.calls.append(f"distribute {inp.seq}")
            if self._rounds > 1:
                return co.DistributeResult(adoptions=[])
            return co.DistributeResult(
                adoptions=[co.Adoption(DONOR, [MachineTarget("spec-1", PROVIDER)])]
            )

        @activity.defn(name=co.PLAN)
        async def plan(inp: co.PlanInput) -> co.PlanResult:
            self.calls.append("plan")
            if self._rounds > 1:
                return co.PlanResult([])
            return co.PlanResult(
                [_spec(co.TransferKind.IDLE), _spec(co.TransferKind.PREEMPT, below=900_000)],
                idle=[offer()],
                receivers=[DONOR, RECEIVER],
            )

        @activity.defn(name=ms.PLAN_MEMBERSHIP)
        async def plan_membership(inp: ms.MembershipPlanInput) -> ms.MembershipPlan:
            if self._rounds > 1:
                return ms.MembershipPlan()
            return ms.MembershipPlan(
                moves=[ms.ClusterMoveSpec("web", DONOR, RECEIVER)],
                handovers=[ms.HandoverSpec(DONOR, RECEIVER, [MachineTarget("idle-9", PROVIDER)])],
            )

        @activity.defn(name=co.RECORD_INSTRUCTION)
        async def record_instruction(inp: co.InstructionRecord) -> None:
            self.calls.append(f"record {inp.seq} {inp.kind}")

        @activity.defn(name=ms.RECORD_MEMBERSHIP)
        async def record_membership(inp: ms.MembershipRecord) -> None:
            self.calls.append(f"record {inp.seq} {inp.kind}")

        @activity.defn(name=co.FINISH_INSTRUCTION)
        async def finish_instruction(inp: co.InstructionOutcome) -> None:
            self.calls.append(f"finish {inp.seq} {inp.status}")

        @activity.defn(name=co.PLAN_DECOMMISSION)
        async def plan_decommission(inp: co.DecommissionInput) -> co.DecommissionPlan:
            return co.DecommissionPlan({DONOR: ["rack-1", "rack-2"], RECEIVER: ["rack-3"]})

        return [
            distribute,
            plan,
            plan_membership,
            record_instruction,
            record_membership,
            finish_instruction,
            plan_decommission,
        ]

    def shard(self, shard_id: str) -> list[Callable[..., Any]]:
        @activity.defn(name=co.ADOPT_MACHINES)
        async def adopt(inp: co.AdoptInput) -> co.AdoptResult:
            self.calls.append(f"{shard_id} adopt {len(inp.machines)}")
            return co.AdoptResult(len(inp.machines))

        @activity.defn(name=co.RELEASE_MACHINES)
        async def release(inp: co.ReleaseInput) -> co.ReleaseResult:
            moved = self.victim if inp.spec.kind == "preempt" else "idle-1"
            return co.ReleaseResult([MachineTarget(moved, PROVIDER)])

        @activity.defn(name=co.PREPARE_PREEMPTION)
        async def prepare(inp: co.ReleaseInput) -> co.PreemptionPlan:
            drain = DrainInput(
                shard_id=shard_id,
                machine=MachineTarget(self.victim, PROVIDER),
                cluster_id="c1",
                grace_seconds=30,
                operation_seq=7,
                reason="preempt",
                victim_priority=100_000,
                poll=FAST_POLL,
            )
            return co.PreemptionPlan([co.DrainStart(f"shard-{shard_id}/drain/victim/7", drain)])

        @activity.defn(name=co.RETIRE_MACHINES)
        async def retire(inp: co.RetireInput) -> co.RetireResult:
            return co.RetireResult(len(inp.machine_ids), 0)

        busy = [1]

        @activity.defn(name=ms.RELEASE_CLUSTER)
        async def release_cluster(inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
            if busy:  # one machine still settling: the move waits and retries
                busy.pop()
                raise ApplicationError("1 machine(s) in motion", type=ms.MACHINES_IN_MOTION)
            return ms.ReleaseClusterResult([MachineTarget("web-1", PROVIDER)], inp.receiver)

        @activity.defn(name=ms.HAND_OVER)
        async def hand_over(inp: ms.HandOverInput) -> ms.HandOverResult:
            return ms.HandOverResult(inp.machines)

        return [adopt, release, prepare, retire, release_cluster, hand_over]


@contextlib.asynccontextmanager
async def _workers(env: WorkflowEnvironment, shards: Shards) -> Any:
    ctx = HarnessContext(shards.fake, shard_id=DONOR, client=env.client, task_queue="shard-a")
    workers = [
        Worker(
            env.client,
            task_queue=co.COORDINATOR_QUEUE,
            workflows=list(COORDINATOR_WORKFLOWS),
            activities=shards.coordinator(),
        ),
        Worker(
            env.client,
            task_queue=f"shard-{DONOR}",
            workflows=list(ALL_WORKFLOWS),
            activities=[*activities_for(ctx), *shards.shard(DONOR)],
        ),
        Worker(env.client, task_queue=f"shard-{RECEIVER}", activities=shards.shard(RECEIVER)),
    ]
    async with workers[0], workers[1], workers[2]:
        yield


def _shards() -> Shards:
    fake = AdvancingProvider(config=default_fake_config())
    fake.step_s = 5.0
    victim = fake.speculative()[0].id
    token = iter(range(2, 100))
    fake.provider.create(victim, FencingToken("setup", 1, next(token)))
    fake.advance(3600)
    fake.provider.configure(victim, "c1", b"blob", FencingToken("setup", 1, next(token)), {})
    fake.advance(3600)
    return Shards(fake, victim=victim)


def _children(history_events: Any) -> list[str]:
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history_events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]


async def coordinator_rounds(env: WorkflowEnvironment) -> dict[str, WorkflowHandle[Any, Any]]:
    """Two rounds with every kind of instruction, then continue-as-new."""
    shards = _shards()
    async with _workers(env, shards):
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=TERM, interval_s=30.0, max_share=0.5, rounds_per_run=2),
            id="coordinator_rounds",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            start_signal="report",
            start_signal_args=[report()],
        )
        with contextlib.suppress(WorkflowContinuedAsNewError):
            # The first run ends in continue-as-new; time skips while we wait for it.
            await handle.result(follow_runs=False)
        first = env.client.get_workflow_handle("coordinator_rounds", run_id=handle.result_run_id)
        history = await first.fetch_history()
        out: dict[str, WorkflowHandle[Any, Any]] = {"coordinator_rounds": first}
        for child in _children(history.events):
            child_handle = env.client.get_workflow_handle(child)
            await child_handle.result()
            kind = child.rsplit("/", 1)[-1]
            name = {"idle": "transfer_idle", "preempt": "transfer_preempt"}.get(kind)
            if name is None:
                name = "cluster_move" if "/move/" in child else "handover"
            out[name] = child_handle
        with contextlib.suppress(Exception):
            await env.client.get_workflow_handle("coordinator_rounds").terminate("recorded")
    return out


async def decommission_two_shards(
    env: WorkflowEnvironment,
) -> dict[str, WorkflowHandle[Any, Any]]:
    shards = _shards()
    async with _workers(env, shards):
        handle = await env.client.start_workflow(
            co.DecommissionWorkflow.run,
            co.DecommissionInput(PROVIDER, "topology.kubernetes.io/rack", "r1", 3, "hall 3"),
            id="decommission_two_shards",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        )
        await handle.result()
    return {"decommission_two_shards": handle}


SCENARIOS = {
    "coordinator_rounds": coordinator_rounds,
    "decommission_two_shards": decommission_two_shards,
}
