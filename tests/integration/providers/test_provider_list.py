"""List: state filters, max_results, and since_revision cursors that return
exactly the machines changed since (a cursor we did not issue: everything)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from tests.integration.providers.provider_harness import KINDS, Harness, serve


@pytest.fixture(scope="module", params=KINDS)
async def quiet(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A provider no other test touches and nothing changes by itself (no
    rack finishes commissioning), so deltas are exactly ours."""
    running = await serve(request.param, commission_s=1e9)
    client = ProviderClient(running.address)
    try:
        yield Harness(request.param, running, client)
    finally:
        await client.close()
        await running.stop(grace=None)


async def test_state_filters_return_only_those_states(harness: Harness) -> None:
    await harness.configured()
    await harness.idle()
    everything = await harness.client.list_all()
    wanted = {pb.MACHINE_STATE_IDLE, pb.MACHINE_STATE_CONFIGURED}
    filtered = await harness.client.list(sorted(wanted))
    assert filtered.machines
    assert {m.state for m in filtered.machines} <= wanted
    expected = {m.id for m in everything.machines if m.state in wanted}
    assert {m.id for m in filtered.machines} == expected


async def test_max_results_caps_the_answer(harness: Harness) -> None:
    listing = await harness.client.list(max_results=5)
    assert len(listing.machines) == 5
    assert len((await harness.client.list(max_results=0)).machines) > 5


async def test_a_capped_listing_continues_from_its_cursor(quiet: Harness) -> None:
    everything = {m.id for m in (await quiet.client.list_all()).machines}
    seen: list[str] = []
    cursor = b""
    while True:
        page = await quiet.client.list(max_results=7, since_revision=cursor)
        if not page.machines:
            break
        seen.extend(m.id for m in page.machines)
        cursor = page.revision
    assert len(seen) == len(set(seen))
    assert set(seen) == everything


async def test_a_cursor_returns_exactly_the_changed_machines(quiet: Harness) -> None:
    start = await quiet.client.list_all()
    assert start.revision
    unchanged = await quiet.client.list(since_revision=start.revision)
    assert list(unchanged.machines) == []

    shard = quiet.shard()
    first = await quiet.machine()
    second = await quiet.machine()
    await quiet.client.create(first.id, shard.token())
    await quiet.client.create(second.id, shard.token())
    delta = await quiet.client.list(since_revision=start.revision)
    assert {m.id for m in delta.machines} == {first.id, second.id}

    await quiet.wait_state(first.id, pb.MACHINE_STATE_IDLE)
    await quiet.wait_state(second.id, pb.MACHINE_STATE_IDLE)
    mid = await quiet.client.list(since_revision=start.revision)
    assert {m.id: m.state for m in mid.machines} == {
        first.id: pb.MACHINE_STATE_IDLE,
        second.id: pb.MACHINE_STATE_IDLE,
    }

    await quiet.client.configure(first.id, "c", b"", shard.token())
    await quiet.wait_state(first.id, pb.MACHINE_STATE_CONFIGURED)
    late = await quiet.client.list(since_revision=mid.revision)
    assert [(m.id, m.state) for m in late.machines] == [(first.id, pb.MACHINE_STATE_CONFIGURED)]
    assert list((await quiet.client.list(since_revision=late.revision)).machines) == []


async def test_a_cursor_combines_with_a_state_filter(quiet: Harness) -> None:
    start = await quiet.client.list_all()
    machine = await quiet.idle()
    delta = await quiet.client.list([pb.MACHINE_STATE_IDLE], since_revision=start.revision)
    assert [m.id for m in delta.machines] == [machine.id]
    none = await quiet.client.list([pb.MACHINE_STATE_CONFIGURED], since_revision=start.revision)
    assert list(none.machines) == []


@pytest.mark.parametrize(
    "cursor",
    [b"garbage", b"\x00\xff\xfe", b"bfrev1:", b"bfrev1:0000:9", b"bfrev1:x:99999999999"],
)
async def test_a_cursor_we_did_not_issue_returns_everything(quiet: Harness, cursor: bytes) -> None:
    everything = await quiet.client.list_all()
    listing = await quiet.client.list(since_revision=cursor)
    assert {m.id for m in listing.machines} == {m.id for m in everything.machines}


async def test_a_cursor_from_another_provider_returns_everything(quiet: Harness) -> None:
    other = await serve(quiet.kind)
    try:
        async with ProviderClient(other.address) as client:
            foreign = (await client.list_all()).revision
    finally:
        await other.stop(grace=None)
    everything = await quiet.client.list_all()
    listing = await quiet.client.list(since_revision=foreign)
    assert len(listing.machines) == len(everything.machines)
