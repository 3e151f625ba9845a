"""Shards joining a running fleet, and two processes started for one shard.

A third shard process started into a running two-shard stack registers
itself by taking its lease; the coordinator's next distribution gives it its
even share of every quota group — exactly once, however many rounds pass
while the transfers are in flight. Two processes for one shard id with
different holders: one acts, the other stands by and takes over when the
first stops.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.devstack import DevStack
from bigfleet.shard.process import ShardOptions, ShardProcess
from tests.integration.multishard import coordinator_settled, eventually, options, shard

pytestmark = pytest.mark.e2e


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(options(tmp_path, empty_database_url))
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


def _process(
    dev: DevStack, shard_id: str, holder: str, *, lease_ttl_s: float = 30.0
) -> ShardProcess:
    """A shard process configured like the stack's own, with its own identity."""
    assert dev.store is not None and dev.client is not None
    o = dev.options
    return ShardProcess(
        ShardOptions(
            shard_id=shard_id,
            listen="127.0.0.1:0",
            holder=holder,
            lease_ttl_s=lease_ttl_s,
            cycle_interval_s=o.cycle_interval_s,
            observe_interval_s=o.observe_interval_s,
            report_interval_s=o.report_interval_s,
            max_instruction_share=o.max_instruction_share,
            deadlines=o.deadlines,
            poll=o.poll,
        ),
        store=dev.store,
        temporal=dev.client,
        providers=dev.provider_clients,
    )


def _types(process: ShardProcess) -> Counter[str]:
    """Machines the process owns, by instance type (machine ids carry it)."""
    return Counter("p5" if "p5-48xlarge" in m else "m6i" for m in process.owned)


async def test_a_new_shard_receives_its_even_share_once_on_the_next_distribution(
    stack: DevStack,
) -> None:
    assert stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")

    newcomer = _process(stack, "shard-2", holder="newcomer")
    await newcomer.start()
    stack.shards.append(newcomer)

    assert "shard-2" in await stack.store.active_shards(), "its lease registered it"
    # Four GPU and eight small machines over three shards: one and two each at least.
    await eventually(
        lambda: _types(newcomer) == {"p5": 1, "m6i": 2}, what="the newcomer's even share"
    )
    # Three more rounds, all they decided carried out: no second share.
    await coordinator_settled(stack, more_rounds=3)
    assert _types(newcomer) == {"p5": 1, "m6i": 2}
    owners = await stack.store.owners()
    assert len(owners) == 12
    in_memory = {m: p.shard_id for p in stack.shards for m in p.owned}
    assert sum(len(p.owned) for p in stack.shards) == len(in_memory) == 12
    assert in_memory == owners
    received = [
        i
        for i in await stack.store.instructions(limit=100)
        if i.receiver_shard == "shard-2" and i.status == "applied"
    ]
    assert {i.kind for i in received} == {"speculative"}


async def test_of_two_processes_for_one_shard_one_acts_and_the_other_takes_over(
    stack: DevStack,
) -> None:
    assert stack.store is not None
    await eventually(lambda: all(len(p.owned) == 6 for p in stack.shards), what="distribution")
    first = shard(stack, "shard-1")
    second = _process(stack, "shard-1", holder="second", lease_ttl_s=1.5)

    starting = asyncio.create_task(second.start())
    try:
        await eventually(lambda: second.standing_by, within=60, what="the second to stand by")
        refused = second.lease.refusals
        await eventually(
            lambda: second.lease.refusals >= refused + 3, within=60, what="three more refusals"
        )
        assert not starting.done()
        assert first.active and not second.active
        assert second.cycles == 0 and second.address == "" and not second.owned
        row = await stack.store.shard("shard-1")
        assert row is not None and row.lease_holder == first.options.holder

        owned_before, epoch_before = dict(first.owned), first.epoch
        await first.stop()
        stack.shards.remove(first)
        await asyncio.wait_for(asyncio.shield(starting), timeout=30)
    finally:
        if not starting.done():
            starting.cancel()
    stack.shards.append(second)

    assert second.active and not second.standing_by
    assert second.epoch > epoch_before
    assert second.owned == owned_before
    await eventually(lambda: second.cycles > 0, within=60, what="the successor to cycle")
    row = await stack.store.shard("shard-1")
    assert row is not None
    assert (row.lease_holder, row.epoch, row.address) == ("second", second.epoch, second.address)
