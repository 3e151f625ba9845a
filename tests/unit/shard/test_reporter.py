"""After its report a shard hands its engine the coordinator's idle offers (ADR 0129)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from bigfleet.shard.options import ShardOptions
from bigfleet.shard.parts import ShardParts, assemble
from bigfleet.shard.reporter import remote_idle
from bigfleet.store import Store
from shard_engine.coordination import RemoteIdle
from workflows import coordinator as co

OFFER = co.IdleOffer("shard-a", {"zone": "z1"}, {"cpu": 128.0}, 4)


class _Handle:
    """The coordinator's handle: records the report, answers the query as scripted."""

    def __init__(self, *, reply: co.FleetIdleReply | None, fail: Exception | None) -> None:
        self.reply, self.fail = reply, fail
        self.signals: list[Any] = []
        self.queries: list[Any] = []

    async def signal(self, method: Any, arg: Any) -> None:
        if isinstance(self.fail, RPCError) and self.reply is None:
            raise self.fail
        self.signals.append(arg)

    async def query(self, method: Any, arg: Any) -> co.FleetIdleReply:
        self.queries.append(arg)
        if self.fail is not None:
            raise self.fail
        assert self.reply is not None
        return self.reply


class _Temporal:
    def __init__(self, handle: _Handle) -> None:
        self.handle = handle

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        assert workflow_id == co.COORDINATOR_ID
        return self.handle


def _parts(handle: _Handle, monkeypatch: pytest.MonkeyPatch) -> tuple[ShardParts, list[Any]]:
    parts = assemble(
        ShardOptions(shard_id="shard-b"),
        # An engine that never connects: assembling the parts reaches nothing.
        store=Store(create_async_engine("postgresql+asyncpg://127.0.0.1:5432/test")),
        temporal=_Temporal(handle),  # type: ignore[arg-type]
        providers={},
        clock=lambda: 1_000.0,
    )
    given: list[Any] = []

    def record(offers: Sequence[RemoteIdle]) -> None:
        given.append(tuple(offers))

    monkeypatch.setattr(parts.state.engine, "set_fleet_idle", record)
    return parts, given


async def test_the_offers_the_coordinator_answers_go_to_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = _Handle(reply=co.FleetIdleReply([OFFER], seq=7), fail=None)
    parts, given = _parts(handle, monkeypatch)

    assert await parts.reporter.send_report()

    assert [r.shard_id for r in handle.signals] == ["shard-b"]
    assert handle.queries == [co.FleetIdleQuery("shard-b")]
    assert given == [(RemoteIdle("shard-a", {"zone": "z1"}, {"cpu": 128.0}, 4),)]


@pytest.mark.parametrize(
    "fail",
    [
        WorkflowQueryFailedError("unknown query type fleet_idle"),
        RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""),
    ],
    ids=["query-unknown", "query-unreachable"],
)
async def test_a_coordinator_that_gives_no_offers_clears_them(
    fail: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts, given = _parts(_Handle(reply=co.FleetIdleReply([OFFER]), fail=fail), monkeypatch)

    assert await parts.reporter.send_report(), "the report itself went through"
    assert given == [()]


async def test_an_unreachable_coordinator_clears_the_offers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
    parts, given = _parts(_Handle(reply=None, fail=down), monkeypatch)

    assert not await parts.reporter.send_report()
    assert given == [()]


def test_empty_offers_are_dropped_and_fields_copied() -> None:
    reply = co.FleetIdleReply([OFFER, co.IdleOffer("shard-c", {}, {"cpu": 2.0}, 0)], seq=3)
    (only,) = remote_idle(reply)
    assert only == RemoteIdle("shard-a", {"zone": "z1"}, {"cpu": 128.0}, 4)
    assert only.labels is not OFFER.labels
