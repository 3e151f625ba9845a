"""``python -m bench nanook``: how fast the Nanook adapter answers its scheduler.

An in-process shard Session server (the production servicer over a real
engine) and the adapter with both transports on loopback; a client sends
``--requests`` sequential calls of each kind and the suite prints latency
percentiles, plus how long a ScaleTo takes to reach the shard as a roll-up.
The scheduler allows 5 s per request; this shows how far inside that we are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
import grpc

from bigfleet.shard.sessions import SessionHub, ShardServicer
from bigfleet.v1alpha1 import shard_pb2_grpc
from nanook.adapter import NanookAdapter, NanookServers
from nanook.client import GrpcScalingClient
from nanook.config import parse_pool_config
from shard_engine.engine import ShardEngine
from shard_engine.model import Rollup

POOL = {"worker": {"resources": {"cpu": "4", "memory": "16Gi"}}, "rollup_interval_seconds": 5}


class _Sink:
    def __init__(self) -> None:
        self.engine = ShardEngine()
        self.arrived: list[tuple[float, int]] = []

    async def admit_cluster(self, cluster_id: str) -> None:
        return None

    def apply_rollup(self, rollup: Rollup) -> str:
        workers = round(sum(n.aggregate.get("cpu", 0.0) for n in rollup.needs) / 4)
        self.arrived.append((time.perf_counter(), workers))
        now = time.time()
        self.engine.apply_rollup(self.engine.validate(rollup, now=now), now=now)
        return "rollup"

    def ack_fields(self) -> tuple[int, int]:
        return 1, 1


def _emit(metric: str, value: float, unit: str) -> None:
    line: dict[str, object] = {
        "bench": "nanook",
        "metric": metric,
        "value": round(value, 3),
        "unit": unit,
        "loadavg": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(line), flush=True)


async def _timed(calls: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


def _report(name: str, samples: list[float]) -> None:
    samples.sort()
    _emit(f"{name}_p50", statistics.median(samples), "ms")
    _emit(f"{name}_p99", samples[min(len(samples) - 1, int(len(samples) * 0.99))], "ms")


async def run(requests: int) -> None:
    hub, sink = SessionHub(), _Sink()
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    adapter = NanookAdapter(
        parse_pool_config(POOL), cluster_id="bench", shard_address=f"127.0.0.1:{port}"
    )
    adapter.start()
    servers = await NanookServers.start(
        adapter, rest_listen="127.0.0.1:0", grpc_listen="127.0.0.1:0"
    )
    client = GrpcScalingClient(servers.grpc_address)
    try:
        while not adapter.pool.connected:  # noqa: ASYNC110 - the pool is plain state
            await asyncio.sleep(0.01)
        url = f"http://{servers.rest_address}"
        async with aiohttp.ClientSession() as http:

            async def rest_config(_: int) -> None:
                async with http.get(url + "/scale_config") as resp:
                    await resp.read()

            async def rest_scale(i: int) -> None:
                async with http.post(url + "/scale_to", json={"amount": 1 + i % 50}) as resp:
                    assert resp.status == 204

            _report("rest_scale_config", await _timed(requests, rest_config))
            _report("rest_scale_to", await _timed(requests, rest_scale))

        async def grpc_scale(i: int) -> None:
            await client.scale_to(100 + i % 50)

        _report("grpc_scale_to", await _timed(requests, grpc_scale))

        # ScaleTo answered -> the roll-up applied by the shard.
        delays = []
        for amount in range(200, 200 + min(requests, 50)):
            start = time.perf_counter()
            await client.scale_to(amount)
            # Polling at 0.5 ms keeps the shard side untouched (no hook in the servicer).
            while not sink.arrived or sink.arrived[-1][1] != amount:  # noqa: ASYNC110
                await asyncio.sleep(0.0005)
            delays.append((sink.arrived[-1][0] - start) * 1000)
        _report("scale_to_to_rollup_applied", delays)
    finally:
        await client.close()
        await servers.stop()
        await adapter.stop()
        await server.stop(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench nanook", description=__doc__)
    parser.add_argument("--requests", type=int, default=500)
    ns = parser.parse_args(argv)
    asyncio.run(run(ns.requests))
    return 0
