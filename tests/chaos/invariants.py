"""What must hold after every fault, checked against the real parts.

    bindings   every provider binding equals the ownership record, and back
    demand     no cluster holds more than its demand plus one machine
    deadlines  no machine sits in a transitional state past its deadline without a
               visible FAILED or AwaitingOperator workflow
    node view  what each operator was told equals what the provider says (issue 9, item 5)
    serving    every process that should serve does: its process is alive, the
               shard's lease is held, every operator is connected, the provider
               answers, the coordinator's workflow runs
    outcomes   no completed machine workflow's outcome is missing from assignment_log,
               and none failed because the store or the lease was unavailable

``violations`` returns what does not hold (empty: all hold); ``settle`` polls
it until it is empty and returns how long that took — the recovery time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from bigfleet.v1alpha1 import provider_pb2
from shard_engine.quantity import parse_quantity
from tests.chaos.stack import DEADLINE_SCALE, SHARD, ChaosStack
from workflows import search_attributes as sa
from workflows.contracts import Deadlines, MachineResult, ProvisionResult
from workflows.errors import LEASE_LOST

M = provider_pb2
BOUND = (M.MACHINE_STATE_CONFIGURING, M.MACHINE_STATE_CONFIGURED, M.MACHINE_STATE_DRAINING)
HOLDING = (M.MACHINE_STATE_CONFIGURING, M.MACHINE_STATE_CONFIGURED)
_D = Deadlines()
DEADLINES = {
    M.MACHINE_STATE_CREATING: _D.creating_s * DEADLINE_SCALE,
    M.MACHINE_STATE_CONFIGURING: _D.configuring_s * DEADLINE_SCALE,
    M.MACHINE_STATE_DELETING: _D.deleting_s * DEADLINE_SCALE,
}
# Time for a workflow to notice a passed deadline (its next poll) and show it.
SLACK_S = 20.0
RECORDED_TYPES = ("ProvisionWorkflow", "DrainWorkflow", "DeleteWorkflow", "RecoverWorkflow")


@dataclass
class StateAges:
    """Samples the provider every second: since when each machine is in its state."""

    stack: ChaosStack
    since: dict[str, tuple[int, float]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        assert self.stack.provider is not None
        while True:
            try:
                for m in (await self.stack.provider.list()).machines:
                    seen = self.since.get(m.id)
                    if seen is None or seen[0] != m.state:
                        self.since[m.id] = (int(m.state), time.monotonic())
            except Exception:
                pass  # the provider is down or stopped: ages keep running
            await asyncio.sleep(1.0)


async def violations(stack: ChaosStack, ages: StateAges, *, serving: tuple[str, ...]) -> list[str]:
    """Every invariant that does not hold right now, in words."""
    out: list[str] = []
    for part in serving:
        if not stack.parts[part].alive:
            out.append(f"serving: process {part} is not running")
    assert stack.provider is not None and stack.client is not None
    try:
        listing = list((await stack.provider.list()).machines)
    except Exception as err:
        return [*out, f"serving: the provider does not answer List ({err})"]
    store = stack.store
    rows = {r.machine_id: r for r in await store.machines()}

    # bindings
    for m in listing:
        bound = m.cluster if m.state in BOUND else ""
        row = rows.get(m.id)
        recorded = (row.cluster_id or "") if row is not None else ""
        if bound != recorded:
            out.append(
                f"bindings: {m.id} is {M.MachineState.Name(m.state)} for {bound or '-'} at the "
                f"provider, recorded for {recorded or '-'}"
            )

    # demand
    holding: dict[str, list[provider_pb2.Machine]] = defaultdict(list)
    for m in listing:
        if m.state in HOLDING:
            holding[m.cluster].append(m)
    for cluster_id, cluster in stack.clusters.items():
        held = holding.get(cluster_id, [])
        if not held:
            continue
        cpu, mem = cluster.demand.at(0)
        per_cpu = min(_alloc(m, "cpu") for m in held)
        per_mem = min(_alloc(m, "memory") for m in held)
        needed = max(math.ceil(cpu / per_cpu - 1e-9), math.ceil(mem * 2**30 / per_mem - 1e-9))
        # The shard counts machines so the need's units fit (ADR 0127): a machine
        # hosts as many whole min_units as its tightest resource allows.
        pattern = cluster.demand
        unit_cpu, unit_mem = pattern.min_unit_cpu, pattern.min_unit_memory_gib * 2**30
        per_machine = min(
            math.floor(per_cpu / unit_cpu + 1e-9) if unit_cpu > 0 else math.inf,
            math.floor(per_mem / unit_mem + 1e-9) if unit_mem > 0 else math.inf,
        )
        if 0 < per_machine < math.inf:
            units = max(
                math.ceil(cpu / unit_cpu - 1e-9) if unit_cpu > 0 else 0,
                math.ceil(mem * 2**30 / unit_mem - 1e-9) if unit_mem > 0 else 0,
            )
            needed = max(needed, math.ceil(units / per_machine))
        if len(held) > needed + 1:
            out.append(
                f"demand: {cluster_id} holds {len(held)} machines; its demand needs {needed}"
            )

    # deadlines
    now = time.monotonic()
    for m in listing:
        limit = DEADLINES.get(m.state)
        seen = ages.since.get(m.id)
        if limit is None or seen is None or seen[0] != m.state:
            continue
        if now - seen[1] <= limit + SLACK_S:
            continue
        phases = await _running_phases(stack, m.id)
        if not phases & {"FAILED", sa.AWAITING_OPERATOR}:
            out.append(
                f"deadlines: {m.id} is {M.MachineState.Name(m.state)} for {now - seen[1]:.0f} s "
                f"(deadline {limit:g} s) with no FAILED or AwaitingOperator workflow "
                f"(running phases: {sorted(phases) or 'none'})"
            )

    # node view: what each operator was told equals what the provider says
    for cluster_id, cluster in stack.clusters.items():
        nodes = dict(cluster.nodes)
        for m in listing:
            if m.cluster == cluster_id and m.state in BOUND:
                told = nodes.get(m.id)
                if told is None or told.state != m.state:
                    out.append(
                        f"node view: {cluster_id} sees {m.id} as "
                        f"{told.state_name if told else 'nothing'}, the provider "
                        f"says {M.MachineState.Name(m.state)}"
                    )
        at_provider = {m.id: m for m in listing}
        for machine_id, node in nodes.items():
            actual = at_provider.get(machine_id)
            if node.state in BOUND and (actual is None or actual.cluster != cluster_id):
                out.append(
                    f"node view: {cluster_id} still counts {machine_id} as "
                    f"{node.state_name}; the provider has it "
                    + (
                        f"{M.MachineState.Name(actual.state)} for {actual.cluster or '-'}"
                        if actual
                        else "not at all"
                    )
                )

    # serving
    shard = await store.shard(SHARD)
    if shard is None or not shard.lease_holder or shard.lease_expires_at is None:
        out.append("serving: nobody holds the shard's lease")
    elif shard.lease_expires_at < datetime.now(UTC):
        out.append(f"serving: the shard's lease expired at {shard.lease_expires_at}")
    for cluster_id, cluster in stack.clusters.items():
        if not cluster.connected.is_set():
            out.append(f"serving: cluster {cluster_id} has no session")
    try:
        desc = await stack.client.get_workflow_handle("bigfleet-coordinator").describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            out.append(f"serving: the coordinator workflow is {desc.status}")
    except Exception as err:
        out.append(f"serving: the coordinator workflow cannot be described ({err})")

    # outcomes
    out.extend(await _missing_outcomes(stack))
    return out


async def uncovered(stack: ChaosStack) -> list[str]:
    """Clusters whose demand is not met yet by configured machines (not an invariant: the
    work a fault interrupted is still finishing)."""
    assert stack.provider is not None
    listing = (await stack.provider.list(states=[M.MACHINE_STATE_CONFIGURED])).machines
    out: list[str] = []
    for cluster_id, cluster in stack.clusters.items():
        held = [m for m in listing if m.cluster == cluster_id]
        cpu, mem = cluster.demand.at(0)
        have_cpu = sum(_alloc(m, "cpu") for m in held)
        have_mem = sum(_alloc(m, "memory") for m in held)
        if have_cpu < cpu - 1e-6 or have_mem < mem * 2**30 - 1:
            out.append(f"settling: {cluster_id} has {have_cpu:.2f} of {cpu:g} cores")
    return out


async def settle(
    stack: ChaosStack,
    ages: StateAges,
    *,
    serving: tuple[str, ...],
    within: float,
    steady_s: float = 3.0,
) -> float:
    """Poll until every cluster's demand is met and every invariant holds (and still holds
    ``steady_s`` later); returns the seconds until then."""
    started = time.monotonic()
    last: list[str] = []
    while True:
        last = await uncovered(stack) or await violations(stack, ages, serving=serving)
        if not last:
            held_at = time.monotonic()
            await asyncio.sleep(steady_s)
            last = await violations(stack, ages, serving=serving)
            if not last:
                return held_at - started
        if time.monotonic() - started > within:
            raise AssertionError(
                f"invariants still broken after {within:g} s:\n  "
                + "\n  ".join(last)
                + "\n"
                + stack.logs()
            )
        await asyncio.sleep(1.0)


def _alloc(m: provider_pb2.Machine, resource: str) -> float:
    raw = m.allocatable.resources if m.HasField("allocatable") else m.resources.resources
    return parse_quantity(raw.get(resource, "0")) or 1.0


async def _running_phases(stack: ChaosStack, machine_id: str) -> set[str]:
    assert stack.client is not None
    phases: set[str] = set()
    query = f"{sa.MACHINE_IDS.name} = '{machine_id}' AND ExecutionStatus = 'Running'"
    async for wf in stack.client.list_workflows(query):
        phase = wf.typed_search_attributes.get(sa.PHASE)
        if phase:
            phases.add(phase)
    return phases


async def _missing_outcomes(stack: ChaosStack) -> list[str]:
    """Completed machine workflows whose outcome is not in assignment_log; failures for
    lack of a lease."""
    assert stack.client is not None
    out: list[str] = []
    logged: dict[str, set[int]] = {}
    query = f"{sa.SHARD_ID.name} = '{SHARD}' AND ExecutionStatus != 'Running'"
    async for wf in stack.client.list_workflows(query):
        if wf.workflow_type not in RECORDED_TYPES:
            continue
        seq = int(wf.id.rsplit("/", 1)[1])
        handle = stack.client.get_workflow_handle(wf.id, run_id=wf.run_id)
        if wf.status == WorkflowExecutionStatus.FAILED:
            try:
                await handle.result()
            except WorkflowFailureError as err:
                cause = err.cause
                if isinstance(cause, ApplicationError) and cause.type == LEASE_LOST:
                    out.append(f"outcomes: {wf.id} failed for lack of a lease: {cause.message}")
            continue
        if wf.status != WorkflowExecutionStatus.COMPLETED:
            out.append(f"outcomes: {wf.id} ended {wf.status}")
            continue
        if wf.workflow_type == "ProvisionWorkflow":
            batch = await stack.client.get_workflow_handle(
                wf.id, run_id=wf.run_id, result_type=ProvisionResult
            ).result()
            machines = [
                o.machine_id for o in batch.outcomes if o.machine_id not in batch.handed_off
            ]
        else:
            single = await stack.client.get_workflow_handle(
                wf.id, run_id=wf.run_id, result_type=MachineResult
            ).result()
            machines = [single.machine_id]
        for machine_id in machines:
            if machine_id not in logged:
                rows = await stack.store.assignment_log(machine_id)
                logged[machine_id] = {s for _, s, _ in rows}
            if seq not in logged[machine_id]:
                out.append(f"outcomes: {wf.id}: {machine_id} at sequence {seq} is not logged")
    return out
