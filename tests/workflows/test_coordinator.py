"""CoordinatorWorkflow on the time-skipping server.

With the scripted shards of the replay histories (``histories/coordinator.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio import activity
from temporalio.client import WorkflowContinuedAsNewError, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.reporter import CoordinatorReporter
from bigfleet.shard.state import ShardState
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.budgets import Budget
from shard_engine.config import EngineConfig
from shard_engine.engine import ShardEngine
from tests.workflows.histories.coordinator import (
    DONOR,
    RECEIVER,
    _shards,
    _spec,
    _workers,
    report,
)
from tests.workflows.rig import time_skipping_server
from workflows import coordinator as co
from workflows import coordinator_contracts as cc
from workflows import membership_contracts as ms
from workflows.registry import COORDINATOR_WORKFLOWS


@pytest.fixture(scope="module")
async def own_env() -> AsyncIterator[WorkflowEnvironment]:
    """A server of its own: the coordinator continues as new into a run that is then
    terminated, and the shared server's clock must not wait on anything it left."""
    async with time_skipping_server() as env:
        yield env


async def test_a_report_waiting_when_the_coordinator_starts_is_planned_in_its_first_round(
    own_env: WorkflowEnvironment,
) -> None:
    env = own_env
    shards = _shards()
    async with _workers(env, shards):
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=3, interval_s=30.0, max_share=0.5, rounds_per_run=1),
            id="coordinator-early-report",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            start_signal="report",
            start_signal_args=[report()],
        )
        with contextlib.suppress(WorkflowContinuedAsNewError):
            await handle.result(follow_runs=False)
        await handle.terminate("done")
    assert shards.calls[:2] == ["distribute 1", "a adopt 1"]
    assert "plan" in shards.calls, "the shortfall that arrived with the start was planned"
    finished = sorted(c for c in shards.calls if c.startswith("finish"))
    # seq 3 the cluster move, 4 the handover, 5 the idle transfer, 6 the preemption
    assert finished == [f"finish {seq} applied" for seq in (3, 4, 5, 6)]


async def test_the_coordinator_deals_count_budgets_to_shards_and_never_past_the_cap(
    own_env: WorkflowEnvironment,
) -> None:
    env = own_env
    async with _workers(env, _shards()):
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=4, interval_s=30.0, rounds_per_run=50),
            id="coordinator-budget-shares",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        )

        def ask(shard: str, in_scope: int, draining: int = 0) -> cc.BudgetShareAsk:
            return cc.BudgetShareAsk(shard, 1, [cc.BudgetCount("gpu", 5, in_scope, draining)])

        update = co.CoordinatorWorkflow.budget_shares
        # Alone, a gets the whole cap; b's arrival leaves it what a does not hold yet.
        first = await handle.execute_update(update, ask("a", 30))
        b_first = await handle.execute_update(update, ask("b", 10))
        # a asks again and gets its fair share of 5 over 30 + 10 machines (3.75 -> 4).
        again = await handle.execute_update(update, ask("a", 30))
        b_again = await handle.execute_update(update, ask("b", 10))
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(update, ask("c", 10, draining=-1))
        status = await handle.query("status")
        await handle.terminate("done")

    assert (first.term, first.shards, first.shares) == (4, 1, {"gpu": 5})
    assert (b_first.shards, b_first.shares) == (2, {"gpu": 0})
    assert (again.shares, b_again.shares) == ({"gpu": 4}, {"gpu": 1})
    assert "counts[0].draining: -1 is negative" in str(refused.value.cause)
    assert status["budget_shares"] == {"a": {"gpu": 4}, "b": {"gpu": 1}}


async def test_a_shard_uses_its_dealt_share_then_a_safe_default_once_the_coordinator_is_gone(
    own_env: WorkflowEnvironment,
) -> None:
    env = own_env
    now = [1_000.0]
    engine = ShardEngine(EngineConfig())
    engine.budgets = (Budget("gpu", count=5),)
    lease = cast(LeaseKeeper, SimpleNamespace(shard_id="a", epoch=1))
    reporter = CoordinatorReporter(
        env.client,
        lease=lease,
        state=ShardState(engine, clock=lambda: now[0]),
        terms=CoordinatorTerms(),
        clock=lambda: now[0],
        stale_after_s=90.0,
    )
    assert engine.budget_shares == {"gpu": 0}, "never heard from the coordinator: nothing"
    update = co.CoordinatorWorkflow.budget_shares
    b = cc.BudgetShareAsk("b", 1, [cc.BudgetCount("gpu", 5, 0, 0)])
    async with _workers(env, _shards()):
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=4, interval_s=30.0, rounds_per_run=50),
            id=co.COORDINATOR_ID,
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        )
        await handle.execute_update(update, b)  # b alone: all 5
        assert (await reporter.ask_budget_shares()) is not None
        assert engine.budget_shares == {"gpu": 0}, "b holds all 5 until it asks again"
        await handle.execute_update(update, b)  # b: its part, 2 of 5
        answer = await reporter.ask_budget_shares()
        await handle.terminate("the coordinator is gone")
    # Equal parts of 5 over two shards: a 3 (first by id), b 2.
    assert answer is not None and (answer.term, answer.shards, answer.shares) == (4, 2, {"gpu": 3})
    assert engine.budget_shares == {"gpu": 3}

    now[0] += 60  # no answer, but the last one is still fresh
    assert await reporter.ask_budget_shares() is None
    assert engine.budget_shares == {"gpu": 3}
    now[0] += 60  # stale: the smaller of the last share and floor(5 / 2 shards)
    assert await reporter.ask_budget_shares() is None
    assert engine.budget_shares == {"gpu": 2}


@pytest.fixture
async def quiet_env() -> AsyncIterator[WorkflowEnvironment]:
    """A server nothing else ran on: the test moves its clock and reads it."""
    async with time_skipping_server() as env:
        yield env


async def test_a_shortfall_is_answered_again_only_from_a_cycle_after_the_answer(
    quiet_env: WorkflowEnvironment,
) -> None:
    """A report whose cycle ran before the last answer ended cannot show what it moved.

    The receiver's shortfall is answered once; the same shortfall, reported again
    from a cycle that ran before the answer ended, is not answered again even once
    the cooldown has passed (a loaded shard's cycle can lag its reports); reported
    from a cycle after it, it is.
    """
    env = quiet_env
    shards = _shards()
    planned: list[float] = []  # the cycle each shortfall the planner saw came from

    @activity.defn(name=co.DISTRIBUTE)
    async def distribute(inp: cc.DistributeInput) -> cc.DistributeResult:
        return cc.DistributeResult(adoptions=[])

    @activity.defn(name=co.PLAN)
    async def plan(inp: cc.PlanInput) -> cc.PlanResult:
        specs = []
        for r in inp.reports:
            for _ in r.shortfalls:
                planned.append(r.cycle_at)
                specs.append(_spec(cc.TransferKind.IDLE))
        return cc.PlanResult(specs)

    @activity.defn(name=ms.PLAN_MEMBERSHIP)
    async def plan_membership(inp: ms.MembershipPlanInput) -> ms.MembershipPlan:
        return ms.MembershipPlan()

    @activity.defn(name=co.RECORD_INSTRUCTION)
    async def record_instruction(inp: cc.InstructionRecord) -> None:
        return None

    @activity.defn(name=co.FINISH_INSTRUCTION)
    async def finish_instruction(inp: cc.InstructionOutcome) -> None:
        shards.calls.append(f"finish {inp.seq} {inp.status}")

    def sent(at: float, cycle_at: float) -> cc.ShardReport:
        return dataclasses.replace(report(), sent_at=at, cycle_at=cycle_at)

    coordinator: list[Callable[..., Any]] = [
        distribute,
        plan,
        plan_membership,
        record_instruction,
        finish_instruction,
    ]
    async with (
        Worker(
            env.client,
            task_queue=co.COORDINATOR_QUEUE,
            workflows=list(COORDINATOR_WORKFLOWS),
            activities=coordinator,
        ),
        Worker(env.client, task_queue=f"shard-{DONOR}", activities=shards.shard(DONOR)),
        Worker(env.client, task_queue=f"shard-{RECEIVER}", activities=shards.shard(RECEIVER)),
    ):
        before = (await env.get_current_time()).timestamp()
        handle = await env.client.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(term=3, interval_s=30.0, max_share=0.5),
            id="coordinator-fresh-cycle",
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            start_signal="report",
            start_signal_args=[sent(1.0, before)],
        )
        await env.sleep(90)
        assert planned == [before] and shards.calls == ["b adopt 1", "finish 2 applied"], (
            shards.calls
        )
        # The cooldown (two report intervals) is long past; the cycle is still old.
        await handle.signal(co.CoordinatorWorkflow.report, sent(2.0, before))
        await env.sleep(180)
        assert planned == [before]
        after = (await env.get_current_time()).timestamp()
        await handle.signal(co.CoordinatorWorkflow.report, sent(3.0, after))
        await env.sleep(90)
        await handle.terminate("done")
    assert planned == [before, after]
