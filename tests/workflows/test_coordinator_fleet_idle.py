"""Each shard learns, after its report, what the other shards hold idle (ADR 0129).

The real ``CoordinatorWorkflow`` on the time-skipping server, the real
``CoordinatorReporter`` of a shard querying it; the coordinator's planner and
the shards' halves of a transfer are scripted activities under their real
names, as in the replay histories.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.reporter import CoordinatorReporter, remote_idle
from bigfleet.shard.state import ShardState
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.config import EngineConfig
from shard_engine.coordination import RemoteIdle, RemoteWant
from shard_engine.engine import ShardEngine
from shard_engine.model import Operator
from tests.rollups import apply
from tests.unit.engine.engine_fleet import need, rollup, same
from tests.waiting import eventually
from tests.workflows.harness import PROVIDER
from tests.workflows.histories.coordinator import DONOR, RECEIVER, _spec, report
from tests.workflows.rig import time_skipping_server
from workflows import coordinator as co
from workflows import coordinator_contracts as cc
from workflows import membership_contracts as ms
from workflows.contracts import MachineTarget
from workflows.registry import COORDINATOR_WORKFLOWS

GPU_LABELS = {"node.kubernetes.io/instance-type": "g5.xlarge", "zone": "z1"}
GPU = {"nvidia.com/gpu": 1.0}
OFFER = cc.IdleOffer(DONOR, GPU_LABELS, GPU, 2)


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A server of the test's own: it reads the server's clock."""
    async with time_skipping_server() as server:
        yield server


class Planner:
    """The coordinator's activities, scripted: the n-th plan is ``plans[n]``, and once
    they run out no transfer, with the last plan's offers."""

    def __init__(
        self,
        plans: list[cc.PlanResult],
        rebalance: list[cc.TransferSpec] | None = None,
        *,
        hold: asyncio.Event | None = None,
    ) -> None:
        self.plans = plans
        self.planned: list[int] = []  # shortfalls each plan call saw
        # What the distribution proposes to even out, every round after the first.
        self.rebalance = rebalance or []
        # Every distribution after the first waits for it, if given (holding a round
        # before it plans).
        self.hold = hold
        self.distributed = 0
        self.recorded: list[str] = []  # the need of each instruction, in order

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name=co.DISTRIBUTE)
        async def distribute(inp: cc.DistributeInput) -> cc.DistributeResult:
            self.distributed += 1
            if self.hold is not None and self.distributed > 1:
                await self.hold.wait()
            later = self.rebalance if self.distributed > 1 else []
            return cc.DistributeResult(adoptions=[], rebalance=list(later))

        @activity.defn(name=co.PLAN)
        async def plan(inp: cc.PlanInput) -> cc.PlanResult:
            self.planned.append(sum(len(r.shortfalls) for r in inp.reports))
            if len(self.planned) <= len(self.plans):
                return self.plans[len(self.planned) - 1]
            last = self.plans[-1]
            return cc.PlanResult([], idle=last.idle, receivers=last.receivers)

        @activity.defn(name=ms.PLAN_MEMBERSHIP)
        async def plan_membership(inp: ms.MembershipPlanInput) -> ms.MembershipPlan:
            return ms.MembershipPlan()

        @activity.defn(name=co.RECORD_INSTRUCTION)
        async def record_instruction(inp: cc.InstructionRecord) -> None:
            self.recorded.append(inp.spec.need_key)

        @activity.defn(name=co.FINISH_INSTRUCTION)
        async def finish_instruction(inp: cc.InstructionOutcome) -> None:
            return None

        return [distribute, plan, plan_membership, record_instruction, finish_instruction]


def _reporter(
    env: WorkflowEnvironment, shard_id: str, now: list[float]
) -> tuple[CoordinatorReporter, ShardEngine]:
    engine = ShardEngine(EngineConfig())
    reporter = CoordinatorReporter(
        env.client,
        lease=cast(LeaseKeeper, SimpleNamespace(shard_id=shard_id, epoch=1)),
        state=ShardState(engine, clock=lambda: now[0]),
        terms=CoordinatorTerms(),
        clock=lambda: now[0],
        stale_after_s=90.0,
    )
    return reporter, engine


def _coordinator(env: WorkflowEnvironment, planner: Planner) -> Worker:
    """The coordinator's worker with ``planner``'s activities."""
    return Worker(
        env.client,
        task_queue=co.COORDINATOR_QUEUE,
        workflows=list(COORDINATOR_WORKFLOWS),
        activities=planner.activities(),
    )


@contextlib.asynccontextmanager
async def _workers(
    env: WorkflowEnvironment,
    planner: Planner,
    *,
    donor: list[Callable[..., Any]],
    receiver: list[Callable[..., Any]],
) -> AsyncIterator[None]:
    """The coordinator's worker with ``planner``'s activities, and each shard's halves."""
    async with (
        _coordinator(env, planner),
        Worker(env.client, task_queue=f"shard-{DONOR}", activities=donor),
        Worker(env.client, task_queue=f"shard-{RECEIVER}", activities=receiver),
    ):
        yield


async def _start(
    env: WorkflowEnvironment, *, rounds_per_run: int = 200
) -> WorkflowHandle[Any, Any]:
    return await env.client.start_workflow(
        co.CoordinatorWorkflow.run,
        cc.CoordinatorInput(term=3, interval_s=30.0, max_share=0.5, rounds_per_run=rounds_per_run),
        id=co.COORDINATOR_ID,
        task_queue=co.COORDINATOR_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
    )


async def test_after_its_report_a_shard_takes_the_offers_planned_for_it(
    env: WorkflowEnvironment,
) -> None:
    planner = Planner([cc.PlanResult([], idle=[OFFER], receivers=[DONOR, RECEIVER])])
    now = [(await env.get_current_time()).timestamp()]
    receiver, engine = _reporter(env, RECEIVER, now)
    donor, donor_engine = _reporter(env, DONOR, now)
    async with _coordinator(env, planner):
        handle = await _start(env)
        assert await receiver.send_report()
        offers = await eventually(
            receiver.read_fleet_idle, within=60.0, what="the receiver's offers after a round"
        )
        assert await donor.send_report()
        status = await handle.query("status")
        # A shard the round did not name a receiver (draining, say) is offered nothing.
        stranger = await handle.query(co.CoordinatorWorkflow.fleet_idle, cc.FleetIdleQuery("z"))

        # The coordinator stops planning (its worker is gone, say): offers older than
        # stale_after_s are dropped rather than waited for.
        now[0] = (await env.get_current_time()).timestamp() + 91.0
        stale = await receiver.read_fleet_idle()
        await handle.terminate("the coordinator is gone")
    now[0] -= 91.0  # fresh again: only the coordinator's absence clears the offers now
    engine.set_fleet_idle(offers)
    gone = await receiver.send_report()

    assert offers == (RemoteIdle(DONOR, GPU_LABELS, GPU, 2),)
    assert donor_engine.fleet_idle_offers == (), "a shard is offered none of its own"
    # No shard reported a shortfall, yet rounds planned: the offers are wanted every round.
    assert planner.planned and set(planner.planned) == {0}
    assert status["idle_offered"] == {RECEIVER: 2, DONOR: 0}
    assert stranger.offers == []
    assert stale == ()
    assert not gone and engine.fleet_idle_offers == (), "no coordinator: nothing to wait for"


async def test_a_coordinator_that_continued_as_new_offers_the_last_rounds_idle_before_its_first(
    env: WorkflowEnvironment,
) -> None:
    # One round per run: the first run plans the offer and continues as new; the next
    # run's first round is held before it plans. A shard asking in between must read
    # the offer (with the round that planned it), not an empty fleet it would buy for.
    hold = asyncio.Event()
    planner = Planner([cc.PlanResult([], idle=[OFFER], receivers=[DONOR, RECEIVER])], hold=hold)
    query = co.CoordinatorWorkflow.fleet_idle
    async with _coordinator(env, planner):
        first = await _start(env, rounds_per_run=1)
        await env.sleep(31)  # past the first round's wait for reports
        await eventually(lambda: planner.distributed >= 2 or None, what="the second run")
        latest = env.client.get_workflow_handle(co.COORDINATOR_ID)
        run = (await latest.describe()).run_id
        between = await latest.query(query, cc.FleetIdleQuery(RECEIVER))
        status = await latest.query("status")
        hold.set()
        await latest.terminate("done")

    assert run != first.result_run_id, "the coordinator continued as new"
    assert planner.planned == [0], "the new run has not planned yet"
    assert between.offers == [OFFER]
    assert between.seq > 0 and between.planned_at > 0, "the round that planned them"
    assert status["idle_offered"] == {RECEIVER: 2, DONOR: 0}


async def test_the_machines_of_an_idle_transfer_under_way_stay_on_offer_to_its_receiver(
    env: WorkflowEnvironment,
) -> None:
    # The round plans two of the donor's idle GPU machines for the receiver's waiting
    # need; the round's offers leave them out (they are taken). Until the transfer
    # ends the receiver must still see them, or its need stops waiting and buys.
    idle = _spec(cc.TransferKind.IDLE, count=2)
    planner = Planner([cc.PlanResult([idle], idle=[], receivers=[DONOR, RECEIVER])])
    release_may_finish = asyncio.Event()
    adopted: list[int] = []

    @activity.defn(name=co.RELEASE_MACHINES)
    async def release(inp: cc.ReleaseInput) -> cc.ReleaseResult:
        await release_may_finish.wait()
        return cc.ReleaseResult([MachineTarget(f"gpu-{i}", PROVIDER) for i in range(2)])

    @activity.defn(name=co.ADOPT_MACHINES)
    async def adopt(inp: cc.AdoptInput) -> cc.AdoptResult:
        adopted.append(len(inp.machines))
        return cc.AdoptResult(len(inp.machines))

    donor_report = cc.ShardReport(
        shard_id=DONOR,
        epoch=1,
        sent_at=1.0,
        total_machines=10,
        profiles=[
            cc.ProfileReport(PROVIDER, "g5.xlarge", "z1", 2, GPU_LABELS, GPU, idle=2),
            cc.ProfileReport(PROVIDER, "g5.xlarge", "z2", 2, {"zone": "z2"}, GPU, idle=1),
        ],
    )
    query = co.CoordinatorWorkflow.fleet_idle
    async with _workers(env, planner, donor=[release], receiver=[adopt]):
        handle = await _start(env)
        await handle.signal(co.CoordinatorWorkflow.report, donor_report)
        await handle.signal(co.CoordinatorWorkflow.report, report())

        async def under_way() -> cc.FleetIdleReply | None:
            reply = await handle.query(query, cc.FleetIdleQuery(RECEIVER))
            return reply if reply.offers else None

        moving = await eventually(under_way, within=60.0, what="the transfer under way")
        elsewhere = await handle.query(query, cc.FleetIdleQuery(DONOR))
        release_may_finish.set()

        async def ended() -> cc.FleetIdleReply | None:
            reply = await handle.query(query, cc.FleetIdleQuery(RECEIVER))
            return reply if adopted and not reply.offers else None

        after = await eventually(ended, within=60.0, what="the transfer's end")
        await handle.terminate("done")

    assert remote_idle(moving) == (RemoteIdle(DONOR, GPU_LABELS, GPU, 2),), (
        "the z1 profile the machines come from, with the transfer's count"
    )
    assert elsewhere.offers == [], "only the receiver waits for them"
    assert adopted == [2] and after.seq >= moving.seq


def test_a_gangs_quota_transfer_under_way_is_offered_as_slots_and_a_rebalance_is_not() -> None:
    """A mixed answer (ADR 0173): the rack's idle machines and its slots both stay on
    offer to the receiver while they move, so the gang waits for the whole rack."""
    rack = {**GPU_LABELS, "topology.kubernetes.io/rack": "r1"}
    donor = cc.ShardReport(
        DONOR,
        1,
        1.0,
        10,
        [cc.ProfileReport(PROVIDER, "g5.xlarge", "z1", 2, rack, GPU, idle=2, speculative=5)],
    )
    idle = dataclasses.replace(_spec(cc.TransferKind.IDLE, count=2), domain="r1")
    slots = dataclasses.replace(_spec(cc.TransferKind.SPECULATIVE, count=1), domain="r1")
    rebalance = dataclasses.replace(slots, cluster_id="", need_key="rebalance:g5")

    assert co._arriving(idle, donor) == cc.IdleOffer(DONOR, rack, GPU, 2, 0)
    assert co._arriving(slots, donor) == cc.IdleOffer(DONOR, rack, GPU, 0, 1)
    assert co._arriving(rebalance, donor) is None
    assert co._arriving(idle, None) is None


async def test_quota_a_shortfall_answer_just_gave_is_not_rebalanced_away(
    env: WorkflowEnvironment,
) -> None:
    """ADR 0174. The answer moves the donor's last GPU slots to the receiver; until the
    receiver uses them they look spare, and the donor, owning none of the group, looks
    like a shard that just joined. The rebalance that would hand one back (and leave the
    receiver short again) waits until the answer has cooled down."""
    answer = _spec(cc.TransferKind.SPECULATIVE, count=2)
    back = dataclasses.replace(
        answer, donor=RECEIVER, receiver=DONOR, count=1, cluster_id="", need_key="rebalance:g"
    )
    planner = Planner([cc.PlanResult([answer])], rebalance=[back])

    @activity.defn(name=co.RELEASE_MACHINES)
    async def release(inp: cc.ReleaseInput) -> cc.ReleaseResult:
        count = inp.spec.count
        return cc.ReleaseResult([MachineTarget(f"slot-{i}", PROVIDER) for i in range(count)])

    @activity.defn(name=co.ADOPT_MACHINES)
    async def adopt(inp: cc.AdoptInput) -> cc.AdoptResult:
        return cc.AdoptResult(len(inp.machines))

    async with _workers(env, planner, donor=[release, adopt], receiver=[release, adopt]):
        handle = await _start(env)
        await handle.signal(co.CoordinatorWorkflow.report, report())
        await env.sleep(45)  # rounds every 30 s; the answer's cooldown is 60 s
        during = list(planner.recorded)
        await env.sleep(120)
        after = list(planner.recorded)
        await handle.terminate("done")

    assert during == ["need-speculative"], during
    assert after[0] == "need-speculative" and "rebalance:g" in after[1:], after


async def test_with_its_offers_a_shard_learns_the_other_shards_shortfalls(
    env: WorkflowEnvironment,
) -> None:
    # ADR 0176: a need leaves its shard's idle machines to an older shortfall of
    # another shard; the shard learns those from the same query as the offers.
    planner = Planner([cc.PlanResult([], idle=[], receivers=[DONOR, RECEIVER])])
    now = [(await env.get_current_time()).timestamp()]
    receiver, engine = _reporter(env, RECEIVER, now)
    donor, donor_engine = _reporter(env, DONOR, now)
    gang = need(gpu=16.0, priority=900_000, requirements=[same("topology.kubernetes.io/rack")])
    apply(donor_engine, rollup("train", 1, gang), now=0)
    donor_engine.cycle(now=1)  # it holds nothing: short of the whole gang
    [short] = donor_engine.shortfalls()

    async def wanted() -> tuple[RemoteWant, ...]:
        await receiver.read_fleet_idle()
        return engine.fleet_wants

    async with _coordinator(env, planner):
        handle = await _start(env)
        assert await donor.send_report()
        assert await receiver.send_report()
        wants = await eventually(wanted, within=60.0, what="the donor's shortfall as a want")
        assert await donor.send_report()
        own = donor_engine.fleet_wants
        await handle.terminate("done")

    [want] = wants
    assert (want.shard_id, want.priority, want.age_cycles) == (DONOR, 900_000, short.age_cycles)
    assert dict(want.deficit) == dict(short.deficit)
    assert [(r.key, r.operator) for r in want.requirements] == [
        ("topology.kubernetes.io/rack", Operator.SAME)
    ]
    assert own == (), "a shard is told none of its own shortfalls"


async def test_a_report_is_news_only_for_what_it_has_not_told_and_after_the_gap(
    env: WorkflowEnvironment,
) -> None:
    # ADR 0184, with the real coordinator taking the reports.
    planner = Planner([cc.PlanResult([], idle=[], receivers=[RECEIVER])])
    now = [(await env.get_current_time()).timestamp()]
    reporter, engine = _reporter(env, RECEIVER, now)
    assert reporter.news_due(), "a shard that has not reported yet"
    async with _coordinator(env, planner):
        handle = await _start(env)
        assert await reporter.send_report()
        assert not reporter.news_due(), "told"

        apply(engine, rollup("c", 1, need(cpu=4.0, memory=8.0)), now=now[0])
        engine.cycle(now=now[0])
        assert [sf.cluster_id for sf in engine.shortfalls()] == ["c"]
        assert not reporter.news_due(), "a new shortfall within the gap waits for it"
        now[0] += 10.0
        assert reporter.news_due()
        assert await reporter.send_report()
        assert reporter.news.carried == {("c", engine.shortfalls()[0].need_key)}
        now[0] += 10.0
        assert not reporter.news_due(), "the same shortfall again is not news"

        apply(engine, rollup("d", 2, need(cpu=4.0, memory=8.0)), now=now[0])
        engine.cycle(now=now[0])
        await handle.terminate("the coordinator is gone")
    assert reporter.news_due()
    assert not await reporter.send_report()
    assert not reporter.news_due(), "a failed attempt waits the gap too"
    now[0] += 10.0
    assert reporter.news_due(), "and then tries again"
