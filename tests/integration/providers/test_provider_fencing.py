"""Fencing over the wire: per (shard_id, machine_id), lexicographic on
(epoch, sequence), checked before idempotency and before NOT_FOUND, moving
the mark even when the transition is then refused, and bypassed by the
empty token. FAILED_PRECONDITION means fenced and nothing else."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import FencingToken
from providers.errors import Fenced, InvalidTransition, NotFound
from tests.integration.providers.provider_harness import Harness, Shard

_ghosts = itertools.count()


async def test_a_stale_token_is_refused_and_changes_nothing(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    with pytest.raises(Fenced):
        await harness.client.configure(
            machine.id, "c", b"", FencingToken(shard.shard_id, shard.epoch, 1)
        )
    assert (await harness.client.get(machine.id)).state == pb.MACHINE_STATE_IDLE


async def test_an_equal_token_is_refused(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    token = shard.token()
    await harness.client.create(machine.id, token)
    with pytest.raises(Fenced):
        await harness.client.create(machine.id, token)


async def test_a_new_epoch_resets_the_sequence_space_and_fences_the_old_epoch(
    harness: Harness,
) -> None:
    old = harness.shard()
    machine = await harness.idle(old)
    for _ in range(5):
        old.token()
    new = Shard(old.shard_id, epoch=old.epoch + 1)
    await harness.client.configure(machine.id, "c", b"", new.token())  # (epoch+1, 1)
    with pytest.raises(Fenced):
        await harness.client.drain(machine.id, 0, old.token())
    await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    await harness.client.drain(machine.id, 0, new.token())


async def test_marks_are_kept_per_shard_and_machine(harness: Harness) -> None:
    first = await harness.machine()
    second = await harness.machine()
    shard_a = harness.shard()
    await harness.client.create(first.id, FencingToken(shard_a.shard_id, 5, 100))
    # The same shard's low token on another machine is that machine's first contact.
    await harness.client.create(second.id, FencingToken(shard_a.shard_id, 5, 1))
    # Another shard's first low token on the first machine is accepted too
    # (the create is already under way, so it answers with the same operation).
    shard_b = harness.shard()
    await harness.client.create(first.id, FencingToken(shard_b.shard_id, 0, 0))
    # The owning shard's stale token is still refused.
    with pytest.raises(Fenced):
        await harness.client.create(first.id, FencingToken(shard_a.shard_id, 5, 99))


async def test_an_accepted_token_moves_the_mark_even_when_the_transition_is_refused(
    harness: Harness,
) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    token = shard.token()
    with pytest.raises(InvalidTransition):
        await harness.client.drain(machine.id, 0, token)
    with pytest.raises(Fenced):
        await harness.client.create(machine.id, token)
    await harness.client.create(machine.id, shard.token())


async def test_fencing_runs_before_the_idempotent_retry(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    token = shard.token()
    ack = await harness.client.configure(machine.id, "c", b"", token, {"k": "v"})
    with pytest.raises(Fenced):
        await harness.client.configure(machine.id, "c", b"", token, {"k": "v"})
    retry = await harness.client.configure(machine.id, "c", b"", shard.token(), {"k": "v"})
    assert retry.operation_id == ack.operation_id
    await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    drain = shard.token()
    await harness.client.drain(machine.id, 0, drain)
    with pytest.raises(Fenced):
        await harness.client.drain(machine.id, 0, drain)


async def test_fencing_runs_before_the_unknown_machine_check(harness: Harness) -> None:
    shard = harness.shard()
    ghost = f"no-such-machine-{next(_ghosts)}"
    with pytest.raises(NotFound):
        await harness.client.create(ghost, FencingToken(shard.shard_id, 1, 10))
    with pytest.raises(Fenced):
        await harness.client.create(ghost, FencingToken(shard.shard_id, 1, 9))


async def test_the_empty_token_bypasses_fencing(harness: Harness) -> None:
    machine = await harness.machine()
    first = await harness.client.create(machine.id, None)
    second = await harness.client.create(machine.id, FencingToken("", 0, 0))
    assert first.operation_id == second.operation_id


async def test_the_largest_int64_token_is_accepted_as_a_mark(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.idle(shard)
    top = 2**63 - 1
    await harness.client.configure(machine.id, "c", b"", FencingToken(shard.shard_id, top, top))
    with pytest.raises(Fenced):
        await harness.client.drain(machine.id, 0, FencingToken(shard.shard_id, top, top))


async def test_reads_are_never_fenced(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.machine()
    await harness.client.create(machine.id, FencingToken(shard.shard_id, 9, 9))
    for _ in range(3):
        with pytest.raises(Fenced):
            await harness.client.create(machine.id, FencingToken(shard.shard_id, 1, 1))
        assert (await harness.client.get(machine.id)).id == machine.id
        assert (await harness.client.list()).machines


tokens = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=25)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(stream=tokens)
async def test_a_random_token_stream_matches_the_lexicographic_oracle(
    harness: Harness, stream: list[tuple[int, int]]
) -> None:
    """Accepted iff strictly newer than every token accepted before, on an
    unknown machine (accepted -> NOT_FOUND) so nothing else interferes."""
    shard_id = harness.shard().shard_id
    ghost = f"oracle-machine-{next(_ghosts)}"
    mark: tuple[int, int] | None = None
    for epoch, sequence in stream:
        expect_accept = mark is None or (epoch, sequence) > mark
        try:
            await harness.client.create(ghost, FencingToken(shard_id, epoch, sequence))
        except NotFound:
            accepted = True
        except Fenced:
            accepted = False
        assert accepted == expect_accept, (stream, mark, (epoch, sequence))
        if accepted:
            mark = (epoch, sequence)


@settings(max_examples=15, deadline=None)
@given(stream=tokens)
async def test_a_random_token_stream_on_a_real_machine_matches_the_oracle(
    harness: Harness, stream: list[tuple[int, int]]
) -> None:
    """The same oracle on a CONFIGURED machine, probed with Create (accepted
    -> refused as out of position, so the machine never moves)."""
    configured = await _configured_machine(harness)
    shard_id = harness.shard().shard_id
    mark: tuple[int, int] | None = None
    for epoch, sequence in stream:
        expect_accept = mark is None or (epoch, sequence) > mark
        try:
            await harness.client.create(configured, FencingToken(shard_id, epoch, sequence))
        except InvalidTransition:
            accepted = True
        except Fenced:
            accepted = False
        assert accepted == expect_accept, (stream, mark, (epoch, sequence))
        if accepted:
            mark = (epoch, sequence)
    assert (await harness.client.get(configured)).state == pb.MACHINE_STATE_CONFIGURED


_configured_cache: dict[int, str] = {}


async def _configured_machine(harness: Harness) -> str:
    key = id(harness)
    if key not in _configured_cache:
        _configured_cache[key] = (await harness.configured("oracle-cluster")).id
    return _configured_cache[key]


async def test_a_zombie_epoch_racing_a_live_epoch_always_loses(harness: Harness) -> None:
    live = harness.shard()
    machine = await harness.idle(live)
    zombie = Shard(live.shard_id, epoch=live.epoch)  # the superseded process
    for _ in range(100):
        zombie.token()
    live.restart()  # the successor: a strictly higher epoch
    await harness.client.configure(machine.id, "live-cluster", b"", live.token())

    async def attempt(shard: Shard, cluster: str) -> str:
        try:
            await harness.client.configure(machine.id, cluster, b"", shard.token())
        except Fenced:
            return "fenced"
        return "accepted"

    calls = []
    for _ in range(20):
        calls.append(attempt(zombie, "zombie-cluster"))
        calls.append(attempt(live, "live-cluster"))
    outcomes = await asyncio.gather(*calls)
    zombie_outcomes = outcomes[0::2]
    live_outcomes = outcomes[1::2]
    assert set(zombie_outcomes) == {"fenced"}
    assert "accepted" in live_outcomes
    settled = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    assert settled.cluster == "live-cluster"
