"""Sessions outlive the engine process: the edge defers meanwhile and relays again after.

A real edge process (``python -m bigfleet.edge``) holds an operator's
session; the engine process behind it (``tests.integration.edge_engine``,
a real ShardProcess) is killed with SIGKILL. The session stays open: a
roll-up is acknowledged ``rollup-deferred: engine restarting`` and a new
Hello is refused UNAVAILABLE with a retry hint. A new engine process takes
the lease, the edge joins it and resends the last accepted roll-up (the
new engine's table starts empty), and relaying resumes both ways on the
same session (ADR 0147).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bigfleet.shard.sessions import RETRY_AFTER_KEY
from bigfleet.temporal import start_dev_server
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2, shard_pb2_grpc
from tests.ports import free_port
from tests.waiting import eventually

SHARD = "shard-edge-restart"


def _rollup(cluster: str, ts: int, cpu: str) -> shard_pb2.OperatorMessage:
    return shard_pb2.OperatorMessage(
        rollup=capacity_pb2.ClusterCapacityNeeds(
            cluster_id=cluster,
            timestamp_unix_nanos=ts,
            needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=10)],
        )
    )


class Engine:
    """One engine child process, asked questions over its stdin."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=120)
            if not raw:
                raise RuntimeError("the engine process ended")
            if raw.startswith(b"{"):
                data: dict[str, Any] = json.loads(raw)
                return data

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.line()


@pytest.fixture
async def stack(empty_database_url: str) -> AsyncIterator[dict[str, str]]:
    env = await start_dev_server(port=free_port(), ui=False)
    try:
        yield {
            "database": empty_database_url,
            "temporal": env.client.service_client.config.target_host,
            "socket": str(Path(tempfile.mkdtemp(prefix="bf-")) / "edge.sock"),
            "listen": f"127.0.0.1:{free_port()}",
        }
    finally:
        await env.shutdown()


async def _engine(stack: dict[str, str], listen: str = "127.0.0.1:0", edges: int = 1) -> Engine:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.edge_engine",
        "--database-url", stack["database"], "--temporal", stack["temporal"],
        "--socket", stack["socket"], "--shard", SHARD, "--listen", listen,
        "--edges", str(edges),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    return Engine(proc)


async def _edge(stack: dict[str, str], listen: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bigfleet.edge",
        "--socket", stack["socket"], "--listen", listen, "--index", "0",
        "--orphan-seconds", "120",
    )  # fmt: skip


async def _end(proc: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_sessions_stay_open_through_an_engine_restart_and_relaying_resumes(
    stack: dict[str, str],
) -> None:
    edge = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bigfleet.edge",
        "--socket", stack["socket"], "--listen", stack["listen"], "--index", "0",
        "--orphan-seconds", "120",
    )  # fmt: skip
    first = await _engine(stack)
    second: Engine | None = None
    try:
        ready = await first.line()
        assert ready["address"] == stack["listen"], "the engine serves where its edge listens"
        async with grpc.aio.insecure_channel(stack["listen"]) as channel:
            stub = shard_pb2_grpc.ShardStub(channel)
            stream: Any = stub.Session()  # type: ignore[call-arg]
            await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="rs-a")))
            assert (await stream.read()).ack.echo == "hello"
            await stream.write(_rollup("rs-a", 10, "4"))
            assert (await stream.read()).ack.echo == "rollup"

            await eventually(
                lambda: _applied(first, "rs-a", 4.0),
                within=120,
                what="the first roll-up in the first engine",
            )

            first.proc.kill()  # SIGKILL: no goodbye to the edge
            await first.proc.wait()

            # The session is still open; roll-ups are deferred while no engine is there
            # (one sent before the edge noticed the loss may still be taken).
            ts, accepted = 11, 4.0
            while True:
                await stream.write(_rollup("rs-a", ts, str(ts)))
                echo = (await stream.read()).ack.echo
                if echo.startswith("rollup-deferred"):
                    break
                assert echo == "rollup", echo
                accepted = float(ts)  # taken before the edge saw the engine go
                ts += 1
                await asyncio.sleep(0.05)
            assert echo == "rollup-deferred: engine restarting"

            # A new Hello meanwhile: UNAVAILABLE, with a retry hint.
            other: Any = stub.Session()  # type: ignore[call-arg]
            await other.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="rs-b")))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await other.read()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "engine restarting" in str(refused.value.details())
            trailing = dict(await other.trailing_metadata() or ())
            assert RETRY_AFTER_KEY in trailing

            second = await _engine(stack)
            await second.line()
            # The edge resent the last accepted roll-up to the new engine's empty table.
            await eventually(
                lambda: _applied(second, "rs-a", accepted),
                within=120,
                what="the last accepted roll-up resent",
            )
            assert (await second.ask("clusters"))["clusters"] == ["rs-a"]

            # Relaying resumes on the same session, both ways.
            await stream.write(_rollup("rs-a", 100, "8"))
            assert (await stream.read()).ack.echo == "rollup"
            await eventually(
                lambda: _applied(second, "rs-a", 8.0),
                within=120,
                what="a roll-up after the restart applied",
            )
            assert (await second.ask("node rs-a m-7"))["sent"] is True
            update = await stream.read()
            assert update.node_state_update.machine_id == "m-7"
            await stream.done_writing()
    finally:
        for engine in (first, second):
            if engine is not None:
                await _end(engine.proc)
        # The engine's clean stop tells the edge to end; if it did not, end it here.
        await _end(edge)


async def test_an_edge_listening_elsewhere_than_the_engine_is_told_to_stop(
    stack: dict[str, str],
) -> None:
    # An edge that outlived an engine configured with another port (found running
    # the restart suite with an edge: the old edge rejoined the next engine, which
    # then served the old port and never started an edge on its own).
    stale = await _edge(stack, f"127.0.0.1:{free_port()}")
    engine = await _engine(stack, listen=stack["listen"])
    edge: asyncio.subprocess.Process | None = None
    try:
        # Refused at JOIN, the stale edge closes its port and ends of itself.
        assert await asyncio.wait_for(stale.wait(), 120) == 0
        edge = await _edge(stack, stack["listen"])
        ready = await engine.line()
        assert ready["address"] == stack["listen"], "the engine serves on its own port"
        async with grpc.aio.insecure_channel(stack["listen"]) as channel:
            stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
            await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="rs-c")))
            assert (await stream.read()).ack.echo == "hello"
            await stream.done_writing()
    finally:
        await _end(engine.proc)
        for proc in (stale, edge):
            if proc is not None:
                await _end(proc)


async def test_an_engine_without_edges_tells_an_edge_of_an_earlier_run_to_stop(
    stack: dict[str, str],
) -> None:
    # An engine run with an edge is killed; its successor is configured without edges
    # (its Session port a thread) on the same port, which the orphaned edge still holds.
    edge = await _edge(stack, stack["listen"])
    first = await _engine(stack, listen=stack["listen"])
    second: Engine | None = None
    try:
        await first.line()
        first.proc.kill()
        await first.proc.wait()
        assert _on_disk(stack["socket"]), "a killed engine leaves its socket behind"
        second = await _engine(stack, listen=stack["listen"], edges=0)
        # Told to stop when it joins again, the edge gives the port up and ends.
        assert await asyncio.wait_for(edge.wait(), 120) == 0
        ready = await second.line()
        assert ready["address"] == stack["listen"], "the successor serves the shard's port"
        async with grpc.aio.insecure_channel(stack["listen"]) as channel:
            stream: Any = shard_pb2_grpc.ShardStub(channel).Session()  # type: ignore[call-arg]
            await stream.write(shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id="rs-d")))
            assert (await stream.read()).ack.echo == "hello"
            await stream.write(_rollup("rs-d", 10, "3"))
            assert (await stream.read()).ack.echo == "rollup"
            await eventually(
                lambda: _applied(second, "rs-d", 3.0), within=120, what="the successor to apply"
            )
            await stream.done_writing()
        assert not _on_disk(stack["socket"]), "the dismissal's socket is removed"
    finally:
        for engine in (first, second):
            if engine is not None:
                await _end(engine.proc)
        await _end(edge)


async def _applied(engine: Engine, cluster: str, cpu: float) -> bool:
    """Whether the engine's needs in force for ``cluster`` are one need of ``cpu`` cores."""
    return bool((await engine.ask(f"needs {cluster}"))["needs"] == [{"cpu": cpu}])


def _on_disk(path: str) -> bool:
    return Path(path).exists()
