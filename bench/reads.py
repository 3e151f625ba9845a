"""What reading a batch of machines costs a shard: one Get after another, or several at once.

``python -m bench reads [--machines 512] [--round-trip-ms 0 5] [--runs 3]``

A transfer's receiver (and a donor handing over drained victims) reads every
machine of the batch from its provider before it takes the batch whole
(``bigfleet.shard.transfers``). This starts the simulated cloud's gRPC server
on loopback, takes ``--machines`` of its machines, and reads them through the
shard's ``ProviderObserver`` two ways: one ``read`` after another, and
``read_many`` (at most ``READS_IN_FLIGHT`` Gets in flight). A round trip of
``--round-trip-ms`` is added before each Get, as a provider that far away
would cost (0: loopback alone). Prints the median wall time of each way per
round trip, its time per machine, and the speed-up, one JSON line each, with
the 1-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from bigfleet.shard.observer import READS_IN_FLIGHT, ProviderObserver
from bigfleet.shard.state import ShardState, Sighting
from bigfleet.v1alpha1 import provider_pb2
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.server import start_provider_server
from shard_engine.engine import EngineConfig, ShardEngine
from workflows.contracts import MachineTarget

__all__ = ["main"]


class _FarAway(ProviderClient):
    """The real client, with a round trip added before each Get."""

    round_trip_s = 0.0

    async def get(self, machine_id: str) -> provider_pb2.Machine:
        if self.round_trip_s > 0:
            await asyncio.sleep(self.round_trip_s)
        return await super().get(machine_id)


def _line(metric: str, value: float, unit: str, **extra: float) -> None:
    print(
        json.dumps(
            {
                "bench": "reads",
                "metric": metric,
                "value": round(value, 4),
                "unit": unit,
                **extra,
                "load_1m": round(os.getloadavg()[0], 2),
            }
        ),
        flush=True,
    )


async def _median_s(read: Callable[[], Awaitable[list[Sighting | None]]], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sightings = await read()
        times.append(time.perf_counter() - start)
        if any(s is None for s in sightings):
            raise RuntimeError("a machine of the batch could not be read")
    return statistics.median(times)


async def _run(machines: int, round_trips_ms: list[float], runs: int) -> None:
    running = await start_provider_server(
        ProviderConfig(kind="sim-cloud", name="bench", time_factor=0.01), "127.0.0.1:0"
    )
    client = _FarAway(running.address)
    try:
        ids = [m.id for m in (await client.list()).machines][:machines]
        if len(ids) < machines:
            raise SystemExit(f"--machines: the simulated cloud holds only {len(ids)}")
        targets = [MachineTarget(m, "bench") for m in ids]
        observer = ProviderObserver(
            {"bench": client}, state=ShardState(ShardEngine(EngineConfig()), clock=time.time)
        )

        async def one_after_another() -> list[Sighting | None]:
            return [await observer.read(t.provider, t.machine_id) for t in targets]

        async def at_once() -> list[Sighting | None]:
            return await observer.read_many(targets)

        await at_once()  # the channel up, the server warm
        for ms in round_trips_ms:
            client.round_trip_s = ms / 1000
            serial = await _median_s(one_after_another, runs)
            batched = await _median_s(at_once, runs)
            for way, seconds in (("one_after_another", serial), ("read_many", batched)):
                _line(f"{way}_ms", seconds * 1000, "ms", machines=machines, round_trip_ms=ms)
                _line(
                    f"{way}_per_machine_us",
                    seconds / machines * 1e6,
                    "us",
                    machines=machines,
                    round_trip_ms=ms,
                )
            _line(
                "speedup",
                serial / batched,
                "x",
                machines=machines,
                round_trip_ms=ms,
                in_flight=READS_IN_FLIGHT,
            )
    finally:
        await client.close()
        await running.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench reads", description=__doc__)
    parser.add_argument("--machines", type=int, default=512)
    parser.add_argument("--round-trip-ms", type=float, nargs="+", default=[0.0, 5.0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.machines < 1:
        parser.error(f"--machines: {args.machines} is not a positive count")
    if args.runs < 1:
        parser.error(f"--runs: {args.runs} is not a positive count")
    if any(ms < 0 for ms in args.round_trip_ms):
        parser.error("--round-trip-ms: a round trip cannot be negative")
    asyncio.run(_run(args.machines, list(args.round_trip_ms), args.runs))
    return 0
