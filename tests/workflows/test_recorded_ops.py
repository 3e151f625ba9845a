"""The recorded-ops golden: for the plans of a simulated day, production's shard core and its
Temporal actuator start exactly the operations the simulator's core issued.

The golden trace is replayed under the BigFleet policy with a tap on every
shard's core: each plan it was given, and the operations it issued for it,
with the machine records those operations were made from. Each plan is
then given to a production ``ShardCore`` over a ``ShardState`` holding those
machines (on a real ``ShardEngine``), acting through the production
``Executor`` on the time-skipping Temporal server. A client interceptor
reads every workflow start as the server receives it; its input, one row
per machine, must equal the simulator's operation, one row per machine.
No worker serves the task queue: the workflows are only started.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client, Interceptor, OutboundInterceptor, StartWorkflowInput
from temporalio.client import WorkflowHandle as Handle
from temporalio.testing import WorkflowEnvironment

from bigfleet.shard.core import DrainOp, ProvisionOp, ShardCore
from bigfleet.shard.executor import Executor
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.state import ShardState, Workload
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineRecord
from simulator.golden import CorePlan, op_rows, record_ops
from tests.workflows.rig import time_skipping_server
from workflows.contracts import DeadlinePolicy, DeleteInput, DrainInput, ProvisionInput, VerifyInput

Row = tuple[Any, ...]


class _Starts(Interceptor):
    """Keeps the input of every workflow start this client sends (and sends it on)."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        starts = self

        class _Outbound(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> Handle[Any, Any]:
                (arg,) = input.args
                starts.inputs.append(arg)
                return await super().start_workflow(input)

        return _Outbound(next)


def _rows(inp: Any) -> list[Row]:
    """A started workflow's input, one row per machine (as ``simulator.golden.op_rows``)."""
    if isinstance(inp, ProvisionInput):
        kind = "provision" if inp.create else "configure"
        return [
            (kind, m.machine_id, inp.cluster_id, inp.need_key, inp.priority) for m in inp.machines
        ]
    if isinstance(inp, DrainInput):
        w = inp.waiter
        waiter = None if w is None else (w.cluster_id, w.need_key, w.priority)
        return [
            (
                "drain",
                inp.machine.machine_id,
                inp.cluster_id,
                inp.grace_seconds,
                inp.reason,
                inp.victim_priority,
                waiter,
            )
        ]
    if isinstance(inp, DeleteInput):
        return [("delete", inp.machine.machine_id, inp.reason)]
    assert isinstance(inp, VerifyInput), inp
    return [("verify", inp.machine.machine_id, inp.cluster_id)]


def _machines(plan: CorePlan) -> dict[str, tuple[MachineRecord, Workload]]:
    """The machines the simulator's core read for the plan, with the workload each serves."""
    out: dict[str, tuple[MachineRecord, Workload]] = {}
    for op in plan.operations:
        if isinstance(op, ProvisionOp):
            for record in op.machines:
                out[record.id] = (record, Workload())
        elif isinstance(op, DrainOp):
            out[op.machine.id] = (op.machine, Workload(priority=op.victim_priority))
        else:
            out[op.machine.id] = (op.machine, Workload())
    return out


@pytest.fixture(scope="module")
async def own_env() -> AsyncIterator[WorkflowEnvironment]:
    """A server of its own: workflows nobody polls would stop a shared one skipping time."""
    async with time_skipping_server() as env:
        yield env


async def test_production_starts_the_operations_the_simulator_issued_for_the_same_plans(
    own_env: WorkflowEnvironment,
) -> None:
    recorded = record_ops()
    kinds = {row[0] for row in recorded.rows()}
    assert {"provision", "drain"} <= kinds, "OPS_TRACE must exercise drains as well"
    starts = _Starts()
    client = Client(
        own_env.client.service_client,
        namespace=own_env.client.namespace,
        data_converter=own_env.client.data_converter,
        interceptors=[starts],
    )
    options = ShardOptions()
    sequences: dict[str, OperationSequences] = {}
    run = uuid.uuid4().hex[:8]
    for plan in recorded.plans:
        shard_id = f"{plan.shard_id}-{run}"
        state = ShardState(ShardEngine(EngineConfig()), clock=functools.partial(float, plan.now))
        for record, workload in _machines(plan).values():
            state.hold(record.id, record.provider)
            state.observe(record, workload)
        executor = Executor(
            client,
            shard_id=shard_id,
            task_queue=f"nobody-serves-{run}",
            sequences=sequences.setdefault(shard_id, OperationSequences()),
            deadlines=DeadlinePolicy(options.deadlines, dict(options.deadline_overrides)),
            poll=options.poll,
        )
        started_before = len(starts.inputs)
        await ShardCore(state, executor, shard_id=shard_id).execute(plan.actions)
        production = [row for inp in starts.inputs[started_before:] for row in _rows(inp)]
        simulated = [row for op in plan.operations for row in op_rows(op)]
        assert production == simulated, f"{plan.shard_id} at {plan.now:.0f} s"
    assert sum(len(_rows(i)) for i in starts.inputs) == len(recorded.rows())
