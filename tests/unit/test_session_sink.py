"""The Session port's sink: what an acknowledgement carries, and who may connect."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from bigfleet.shard.admissions import Admissions
from bigfleet.shard.intake import Intake
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.parts import ShardParts, assemble
from bigfleet.shard.rollups import SessionSink
from bigfleet.shard.sessions import ShardUnavailable
from bigfleet.store import Store


async def _nobody(cluster_ids: object) -> dict[str, str]:
    raise AssertionError("a shard that does not act must not look anything up")


def _sink(parts: ShardParts, *, acting: bool) -> SessionSink:
    return SessionSink(
        shard_id="s",
        acting=lambda: acting,
        lease=parts.lease,
        admissions=Admissions(_nobody),
        membership=parts.membership,
        intake=Intake(),
        engine=parts.engine,
        terms=parts.terms,
        clock=lambda: 1_000.0,
        slice_s=0.002,
        coalesce_s=0.0,
    )


def _parts() -> ShardParts:
    # Not started: nothing here reaches the store or Temporal.
    return assemble(
        ShardOptions(shard_id="s"),
        store=_unconnected_store(),
        temporal=None,  # type: ignore[arg-type]
        providers={},
        clock=lambda: 1_000.0,
    )


def test_an_acknowledgement_carries_the_highest_coordinator_term_seen_and_the_epoch() -> None:
    parts = _parts()
    parts.lease.epoch = 9
    assert parts.terms.check(4) == ""
    assert _sink(parts, acting=True).ack_fields() == (4, 9)
    assert parts.terms.check(3) != "", "a lower term is refused and changes nothing"
    assert _sink(parts, acting=True).ack_fields() == (4, 9)


async def test_a_shard_that_does_not_act_sends_its_operators_away() -> None:
    with pytest.raises(ShardUnavailable, match="not acting"):
        await _sink(_parts(), acting=False).admit_cluster("c1")


def _unconnected_store() -> Store:
    """A store over an engine that never connects: assembling the parts reaches nothing."""
    return Store(create_async_engine("postgresql+asyncpg://127.0.0.1:5432/test"))
