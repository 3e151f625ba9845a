"""Retiring part of a domain takes machines evenly from every shard, for good."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError

from bigfleet.devstack import DevStack
from bigfleet.shard.process import ShardProcess
from tests.integration.multishard import eventually, options
from workflows import coordinator_contracts as co

pytestmark = pytest.mark.e2e


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def test_a_decommission_takes_the_same_share_from_each_shard(stack: DevStack) -> None:
    assert stack.coordinator is not None and stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    result = await stack.coordinator.decommission(
        co.DecommissionInput(
            provider="simcloud",
            label="node.kubernetes.io/instance-type",
            value="m6i.large",
            count=4,
            reason="hall 3 power work",
        )
    )
    assert result.retired == {"shard-0": 2, "shard-1": 2}
    for process in stack.shards:
        quarantined = await stack.store.quarantined(process.shard_id)
        assert len(quarantined) == 2 and set(quarantined.values()) == {"hall 3 power work"}
        in_engine = {m.id for m in process.engine.machines()}
        assert not (set(quarantined) & in_engine), "a retired machine is still planned with"
        # Nothing of the retired machines comes back on the next observations.

        def stays_out(p: ShardProcess = process, q: Mapping[str, str] = quarantined) -> bool:
            return not (set(q) & {m.id for m in p.engine.machines()})

        await eventually(stays_out, what="retired machines to stay out")


async def test_a_decommission_of_an_unknown_provider_is_refused_by_name(stack: DevStack) -> None:
    assert stack.coordinator is not None and stack.store is not None
    with pytest.raises(WorkflowFailureError) as caught:
        await stack.coordinator.decommission(
            co.DecommissionInput(provider="nope", label="x", value="y", count=1)
        )
    activity_error = caught.value.cause
    assert isinstance(activity_error, ActivityError)
    assert "provider: 'nope' is not configured" in str(activity_error.cause)
    for process in stack.shards:
        assert await stack.store.quarantined(process.shard_id) == {}
