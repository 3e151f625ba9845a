"""Every acknowledged roll-up is counted once in ``bigfleet_shard_rollups_total``.

A real :class:`ShardProcess` (PostgreSQL, a Temporal worker on the dev
server) serves ``Shard/Session`` over loopback gRPC. Its applier waits a
second before applying what is staged, so roll-ups written back to back
supersede one another before they reach the engine; one is stale, two are
refused (one does not translate, one breaks the engine's rules). The counter
summed over outcomes must equal the acknowledgements received, and the
superseded ones must be counted as such (issue 20, item 2: the counter had
counted roll-ups applied after coalescing, undercounting traffic).

The same holds with the Session port in an edge process (ADR 0147): the
edge acknowledges, counts what it settles itself (refused, stale,
superseded before it relayed them) in SETTLED frames, and the engine
process counts the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from bigfleet.shard.process import ShardProcess
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2, shard_pb2_grpc
from tests.shard_stack import shard_process
from tests.waiting import eventually

SHARD = "shard-counts"
OUTCOMES = ("applied", "quarantined", "stale", "rejected", "superseded", "departed", "deferred")


def _counted() -> Counter[str]:
    out: Counter[str] = Counter()
    for outcome in OUTCOMES:
        value = REGISTRY.get_sample_value(
            "bigfleet_shard_rollups_total", {"shard": SHARD, "outcome": outcome}
        )
        out[outcome] = int(value or 0)
    return out


def _rollup(
    cluster: str, ts: int, cpu: str = "4", resource: str = "cpu"
) -> shard_pb2.OperatorMessage:
    return shard_pb2.OperatorMessage(
        rollup=capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={resource: cpu}, priority=10)],
        )
    )


@pytest.fixture(params=[0, 1], ids=["in-process", "one-edge"])
async def shard(
    request: pytest.FixtureRequest, empty_database_url: str
) -> AsyncIterator[ShardProcess]:
    async with shard_process(
        empty_database_url,
        SHARD,
        edges=request.param,
        cycle_interval_s=0.5,
        # Long enough that roll-ups written back to back meet in the intake.
        apply_coalesce_s=1.0,
    ) as process:
        yield process


async def test_every_acknowledged_rollup_is_counted_once_superseded_ones_included(
    shard: ShardProcess,
) -> None:
    before = _counted()
    echoes: list[str] = []
    async with grpc.aio.insecure_channel(shard.address) as channel:
        for cluster in ("count-a", "count-b"):
            stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
            await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cluster)))
            assert (await stream.read()).ack.echo == "hello"
            # Written back to back, read afterwards: they meet in the intake.
            frames = [_rollup(cluster, ts, cpu=str(ts)) for ts in range(100, 130)]
            frames.append(_rollup(cluster, 50))  # older than the newest: stale
            frames.append(_rollup(cluster, 200, cpu="four"))  # does not translate
            frames.append(_rollup(cluster, 201, resource="bad name!"))  # the engine's rules
            for frame in frames:
                await stream.write(frame)
            for _ in frames:
                echoes.append(str((await stream.read()).ack.echo))
            await stream.done_writing()

    acks = len(echoes)
    assert acks == 2 * 33
    assert sum(e.startswith("rollup-stale") for e in echoes) == 2
    assert sum(e.startswith("rollup-rejected") for e in echoes) == 4

    def settled() -> Counter[str] | None:
        now = _counted() - before
        return now if sum(now.values()) >= acks else None

    counted = await eventually(settled, within=60, what="every ack counted")
    assert sum(counted.values()) == acks, counted
    assert counted["stale"] == 2 and counted["rejected"] == 4, counted
    assert counted["superseded"] >= 1, "back-to-back roll-ups were superseded before applying"
    assert counted["applied"] + counted["superseded"] == 2 * 30, counted
    for cluster in ("count-a", "count-b"):
        [need] = shard.engine.needs_of(cluster)
        assert need.aggregate == {"cpu": 129.0}, "the newest roll-up is the one in force"
