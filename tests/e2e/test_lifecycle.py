"""A preemption on the real stack: the engine's Preempt becomes a DrainWorkflow end to end.

Dev server, PostgreSQL, the simulated tiny cloud over gRPC, one shard, two
simulated clusters. ``low`` holds all four GPU machines at priority 100000;
``high`` asks for one at priority 1000000. The shard drains one of ``low``'s
machines (its operator gets a ReclaimInstruction carrying the preemptor's
priority), records the drain, and the machine — promised to the preemptor —
is configured for ``high``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bigfleet.devstack import DevStack
from clusters.operator import SimulatedCluster
from tests.integration.multishard import configured_for, gpu_demand, options
from tests.waiting import eventually
from workflows import search_attributes as sa

pytestmark = pytest.mark.e2e

T = TypeVar("T")


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url, shards=1))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


def _connect(dev: DevStack, cluster_id: str, machines: int, priority: int) -> SimulatedCluster:
    assert dev.shard is not None
    cluster = SimulatedCluster(
        cluster_id,
        dev.shard.address,
        gpu_demand(machines, priority=priority),
        rollup_interval_s=0.5,
    )
    cluster.start()
    dev.clusters.append(cluster)
    return cluster


async def test_a_higher_priority_need_drains_a_lower_priority_machine_and_gets_it(
    stack: DevStack,
) -> None:
    assert stack.store is not None and stack.client is not None and stack.shard is not None
    client = stack.client
    low = _connect(stack, "low", machines=4, priority=100_000)

    async def low_has_four() -> bool:
        return len(await configured_for(stack, "low")) == 4

    await eventually(low_has_four, what="low to hold all four GPU machines")
    high = _connect(stack, "high", machines=1, priority=1_000_000)

    async def high_has_one() -> list[str]:
        return [m.id for m in await configured_for(stack, "high")]

    (moved,) = await eventually(high_has_one, what="high to get a GPU machine", within=90)
    assert len(await configured_for(stack, "low")) == 3

    # The victim's operator was told, with the preemptor's priority and the engine's grace.
    (instruction,) = [r for r in low.reclaims if moved in r.nodes]
    assert instruction.preemptor_priority == 1_000_000
    assert instruction.grace_period_seconds == 30  # gap 900000: "> 500000" -> 30 s
    assert not high.reclaims

    # The drain ran as its own workflow, findable by machine, and was recorded once.
    query = f"BigFleetMachineId = '{moved}' AND BigFleetOperation = 'drain'"

    async def drains() -> list[Any]:
        return [wf async for wf in client.list_workflows(query)]

    (drain,) = await eventually(drains, what="the drain to be visible")
    described = await client.get_workflow_handle(drain.id).describe()
    attrs = described.typed_search_attributes
    # BigFleetPriority on a drain is the victim's (ADR 0091); the reason says why.
    assert attrs.get(sa.PRIORITY) == 100_000 and attrs.get(sa.CLUSTER_ID) == "low"
    assert attrs.get(sa.REASON) == "preempt"
    assert attrs.get(sa.PHASE) == "IDLE" and attrs.get(sa.GRACE_SECONDS) == 30
    store = stack.store

    async def reconfigured() -> list[str]:
        log = [op for op, _, _ in await store.assignment_log(moved)]
        return log if log[-1:] == ["configure"] else []

    log = await eventually(reconfigured, what="the configure for high to be recorded")
    assert log == ["provision", "drain", "configure"], log
    assert stack.shard.lifecycle.blocked() == [], "a finished drain blocks nobody"
