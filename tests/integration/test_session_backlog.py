"""A backlog of roll-ups is never worked through: only each cluster's newest is checked.

The Session port on its own thread over loopback gRPC, set to queue every
roll-up for its checker (as it does once its loop runs behind), with a sink whose
checks are slow (each one holds the sessions' loop, as CPU work does under
overload). Operators write many roll-ups without waiting for their acks.
Every roll-up is still acknowledged, in order; the ones a newer roll-up of
the same cluster replaced before they were checked are acknowledged
``rollup-superseded`` and never reach the sink; the newest is always checked
(issue 20, item 3).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc

from bigfleet.shard.intake import Intake
from bigfleet.shard.server import IngestOptions, IngestServer
from bigfleet.shard.sessions import SUPERSEDED, SessionHub, SessionLimits
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2, shard_pb2_grpc
from shard_engine.model import Rollup


class SlowSink:
    """Stages like the shard process, but each check takes a few milliseconds of the loop."""

    def __init__(self) -> None:
        self.intake = Intake()
        self.checked: list[tuple[str, int]] = []
        self.outcomes: list[str] = []
        self._lock = threading.Lock()

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        time.sleep(0.005)  # stands in for translating and validating a large roll-up
        self.checked.append((rollup.cluster_id, rollup.timestamp_ns))
        return self.intake.offer(rollup)

    def settled(self, outcome: str) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def ack_fields(self) -> tuple[int, int]:
        return 1, 1


def _rollup(cluster: str, ts: int) -> shard_pb2.OperatorMessage:
    return shard_pb2.OperatorMessage(
        rollup=capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": str(ts)}, priority=1)],
        )
    )


async def _flood(address: str, cluster: str, count: int) -> list[str]:
    """Open a session, write ``count`` roll-ups back to back, then read every ack."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
        await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cluster)))
        assert (await stream.read()).ack.echo == "hello"
        for ts in range(1, count + 1):
            await stream.write(_rollup(cluster, ts))
        echoes = [str((await stream.read()).ack.echo) for _ in range(count)]
        await stream.done_writing()
        return echoes


async def test_a_backlog_is_acknowledged_in_full_but_only_the_newest_rollups_are_checked() -> None:
    sink = SlowSink()
    limits = SessionLimits(
        shed_lag_s=60.0, supersede_lag_s=0.0, max_rollups_per_s=10_000.0, rollup_burst=10_000
    )
    server = IngestServer(SessionHub(), sink, IngestOptions(limits=limits))
    await server.start()
    clusters, count = [f"backlog-{i}" for i in range(10)], 40
    try:
        answers = await asyncio.gather(*(_flood(server.address, c, count) for c in clusters))
    finally:
        await server.stop(grace=0)

    for cluster, echoes in zip(clusters, answers, strict=True):
        assert len(echoes) == count, "every roll-up is acknowledged"
        assert all(e == "rollup" or e.startswith(SUPERSEDED) for e in echoes), echoes
        assert echoes[-1] == "rollup", "the newest roll-up is always checked"
        checked = [ts for c, ts in sink.checked if c == cluster]
        assert checked == sorted(checked) and checked[-1] == count
        assert len(checked) == echoes.count("rollup")
    superseded = sum(e.startswith(SUPERSEDED) for echoes in answers for e in echoes)
    assert superseded > 0, "roll-ups written faster than they are checked were superseded"
    assert sink.outcomes.count("superseded") == superseded
    staged = {r.cluster_id: r.timestamp_ns for r in sink.intake.take_all()}
    assert staged == dict.fromkeys(clusters, count)
