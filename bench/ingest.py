"""Roll-up ingestion at fleet rate: one real shard process, load from other processes.

``python -m bench ingest [--scenarios closed,open,cadence,sessions,overload] [--seconds S]``

    Temporal dev server (from its wheel) · PostgreSQL (the machine's, or embedded)
    simulated cloud, in this process, with little quota (so needs stay unmet)
    the shard under test: a real ShardProcess in its own process (``bigfleet shard``'s code)
    load generators: their own processes, each holding many Shard/Session streams

Scenarios (each on a fresh shard process):

- ``closed``: S sessions send a changed 20-need roll-up (~1.8 KB), wait for
  its ack, and send the next: the rate the shard sustains.
- ``open``: roll-ups offered at a fixed rate whatever the answers; latency
  is measured from the scheduled send time (no coordinated omission).
- ``cadence``: C clusters, each one roll-up every 10 s (the paper's
  cadence), 5 needs each that the inventory cannot meet, so every cycle
  works over C x 5 unmet needs.
- ``sessions``: N idle sessions opened at once (a Hello refused with a
  retry hint is retried after it, as an operator does; counted apart);
  refusals and the shard's resident memory per session (RSS delta / N).
- ``overload``: 40 clusters flooding roll-ups far above their rate limit
  and what the shard can take: shed count (RESOURCE_EXHAUSTED) and the
  shard's memory.
- ``floor``: the ``closed`` load against a bare grpcio asyncio server of the
  same shape instead of the shard (it decodes each frame and answers a
  serialized ack, nothing else): what gRPC and protobuf alone cost per
  roll-up in Python, the floor under the shard's ``cpu_per_rollup``.
- ``recovery`` (not in the default list): the cadence, then ``--bursts``
  minute-long bursts of overload from 200 more clusters, each followed by
  the cadence alone, on one shard: how soon the cadence is acknowledged in
  time again, and whether memory returns (RSS, pymalloc blocks, the C heap
  in use and kept free, before and after each burst).

``--edges N`` runs the shard's Session port in N edge processes that relay
to the shard's engine process (``BIGFLEET_SHARD_EDGES``, ADR 0147; by
default the product's: one per core beyond the engine's, 0 keeps the port
a thread of the shard); the
shard's CPU and memory figures then include its edges' (``edges_us`` in
``cpu_per_rollup`` is theirs), and every figure carries ``edges``.

Prints JSON lines ``{"bench": "ingest", "scenario", "metric", "value", "unit", ...}``
and ``loadavg`` (``/proc/loadavg``) on each. ``cpu_per_rollup`` is the shard's
CPU time per acknowledged roll-up (µs), split between the Session port's
thread, the shard's loop and the rest (gRPC's and Temporal's native threads):
on a shared machine it is the figure to compare, not the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import gc
import json
import math
import os
import random
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from bench.stack import (
    Stack,
    cpu_seconds,
    json_line,
    loadavg,
    malloc_kib,
    percentile,
    rss_kib,
    runqueue_seconds,
    services,
    split_load,
    start_load,
    start_shard,
    stop_loads,
    stop_shard,
)
from bigfleet.config import auto_edges
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2

# ------------------------------------------------------------------ load side

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def make_rollup(cluster_id: str, needs: int, *, seq: int, unmet: bool) -> bytes:
    """A serialized roll-up of ``needs`` needs (20 needs: about 2 KB).

    Consecutive ``seq`` values differ in exactly one need's size: a changed
    roll-up, as when one workload scales. ``unmet`` asks for far more than
    the benchmark's small inventory holds.
    """
    msg = capacity_pb2.ClusterCapacityNeeds(cluster_id=cluster_id, timestamp_unix_nanos=seq)
    for i in range(needs):
        cpu = (400 if unmet else 4) + ((seq - i) // max(1, needs)) % 7
        msg.needs.append(
            capacity_pb2.CapacityNeed(
                aggregate_resources={"cpu": str(cpu), "memory": f"{cpu * 4}Gi"},
                min_unit={"cpu": "2", "memory": "8Gi"},
                priority=100_000 + (i % 5) * 100_000,
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="topology.kubernetes.io/zone",
                        operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_IN,
                        values=[ZONES[i % 3]],
                    )
                ],
            )
        )
    return bytes(msg.SerializeToString())


@dataclass
class LoadResult:
    """What one load process saw."""

    opened: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    acked: int = 0
    shed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    # Beside each latency: when that roll-up was scheduled, seconds after the start.
    sent_s: list[float] = field(default_factory=list)
    # Every scheduled send, seconds after the start (acknowledged or not).
    scheduled_s: list[float] = field(default_factory=list)
    seconds: float = 0.0
    hello_retries: int = 0
    start: float = 0.0
    # Hello round trips of the live sessions (``peers``).
    hello_ms: list[float] = field(default_factory=list)
    reconnected: int = 0
    # Seconds in which this process's own loop ran late: [monotonic time, worst lag ms].
    # A soak tells a stall of the shard from one of its load (bench soak).
    lags: list[list[float]] = field(default_factory=list)
    # Per whole monotonic second: the longest a roll-up waited, from its scheduled time,
    # for its session's write to be taken (open and cadence). A writer held back by the
    # transport (HTTP/2 flow control) shows here while the loop itself is on time.
    write_wait: dict[int, float] = field(default_factory=dict)

    def wrote(self, scheduled: float, now: float) -> None:
        """One scheduled roll-up's write was taken at ``now``."""
        second = int(now)
        waited = (now - scheduled) * 1000
        if waited > self.write_wait.get(second, 0.0):
            self.write_wait[second] = waited


_PLACEHOLDER_TS = 1 << 62  # encodes in 9 varint bytes, as every time.time_ns() until 2262


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Frames:
    """Pre-serialized OperatorMessage frames whose timestamp is patched in per send."""

    def __init__(self, cluster_id: str, needs: int, ring: int, *, unmet: bool) -> None:
        self.frames: list[tuple[bytes, bytes]] = []
        marker = _varint(_PLACEHOLDER_TS)
        for k in range(ring):
            rollup = capacity_pb2.ClusterCapacityNeeds.FromString(
                make_rollup(cluster_id, needs, seq=k + 1, unmet=unmet)
            )
            rollup.timestamp_unix_nanos = _PLACEHOLDER_TS
            wire = shard_pb2.OperatorMessage(rollup=rollup).SerializeToString()
            head, found, tail = wire.partition(marker)
            assert found, "the timestamp placeholder was not found"
            self.frames.append((head, tail))
        self.next = 0

    def take(self) -> bytes:
        head, tail = self.frames[self.next % len(self.frames)]
        self.next += 1
        return head + _varint(time.time_ns()) + tail


SESSION_METHOD = "/bigfleet.v1alpha1.Shard/Session"


class Session:
    """One cluster's stream: Hello, then roll-ups; acks matched in order."""

    def __init__(self, channel: grpc.aio.Channel, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.method = channel.stream_stream(
            SESSION_METHOD,
            request_serializer=None,
            response_deserializer=shard_pb2.ShardMessage.FromString,
        )
        self.call: Any = None
        self.retries = 0
        self.waiting: list[float] = []  # scheduled send times, oldest first
        self.answered = asyncio.Event()
        self.open = False
        self.frames: Frames | None = None
        self.retry_after: float | None = None  # the hint of the last shed, seconds

    async def hello(self, *, attempts: int = 6) -> str:
        """'' when open, else the refusal (code: reason, numbers stripped).

        A refusal with a retry hint (RESOURCE_EXHAUSTED, UNAVAILABLE) is
        retried after the hinted delay, as an operator does; ``retries``
        counts them.
        """
        hello = shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=self.cluster_id))
        refusal = ""
        for _ in range(attempts):
            self.call = self.method()  # type: ignore[call-arg]  # write()/read() streaming
            try:
                await self.call.write(hello.SerializeToString())
                frame = await self.call.read()
            except grpc.aio.AioRpcError as err:
                pairs: Any = err.trailing_metadata() or ()
                hint = {str(k): str(v) for k, v in pairs}.get("bigfleet-retry-after-ms")
                refusal = f"{err.code().name}: {re.sub(r'[0-9]+', 'N', err.details() or '')[:60]}"
                if hint is None:
                    return refusal
                self.retries += 1
                await asyncio.sleep(int(hint) / 1000)
                continue
            if frame is grpc.aio.EOF:  # type: ignore[attr-defined]
                return "EOF"
            self.open = True
            return ""
        return refusal

    async def prime(self) -> None:
        """Send one roll-up and wait for its ack (before the acks' reader runs)."""
        assert self.frames is not None
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            await self.call.write(self.frames.take())
            while True:
                frame = await self.call.read()
                if frame is grpc.aio.EOF:  # type: ignore[attr-defined]
                    return
                if frame.WhichOneof("payload") == "ack" and frame.ack.echo.startswith("rollup"):
                    return

    async def writer(self, queue: asyncio.Queue[float], result: LoadResult) -> None:
        """Write each scheduled roll-up in turn (the schedule never waits for a write)."""
        while True:
            scheduled = await queue.get()
            if self.open:
                await self.send(scheduled)
                result.wrote(scheduled, time.monotonic())

    async def send(self, scheduled: float) -> None:
        assert self.frames is not None
        self.waiting.append(scheduled)
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
            await self.call.write(self.frames.take())

    async def read_acks(self, result: LoadResult, until: float) -> None:
        """Match acks to sends until the stream ends or ``until`` passes."""
        try:
            while True:
                frame = await self.call.read()
                if frame is grpc.aio.EOF:  # type: ignore[attr-defined]
                    return
                if frame.WhichOneof("payload") != "ack" or not frame.ack.echo.startswith("rollup"):
                    continue
                now = time.monotonic()
                if self.waiting:
                    sent = self.waiting.pop(0)
                    if now <= until + 5:
                        result.acked += 1
                        result.latencies_ms.append((now - sent) * 1000)
                        result.sent_s.append(sent - result.start)
                self.answered.set()
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                result.shed += 1
                pairs: Any = err.trailing_metadata() or ()
                hint = {str(k): str(v) for k, v in pairs}.get("bigfleet-retry-after-ms")
                self.retry_after = int(hint) / 1000 if hint else None
            elif err.code() != grpc.StatusCode.CANCELLED:
                name = str(err.code().name)
                result.refused[name] = result.refused.get(name, 0) + 1
        finally:
            self.open = False
            self.answered.set()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.call.done_writing()
        self.call.cancel()


async def run_load(args: argparse.Namespace) -> LoadResult:
    """One load process: ``--sessions`` streams over ``--connections`` channels."""
    result = LoadResult()
    channels = [
        grpc.aio.insecure_channel(args.address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, args.connections))
    ]
    sessions = [
        Session(channels[i % len(channels)], f"{args.prefix}-{i}") for i in range(args.sessions)
    ]
    outcomes = await asyncio.gather(*(s.hello() for s in sessions))
    for code in outcomes:
        if code:
            result.refused[code] = result.refused.get(code, 0) + 1
    live = [s for s, code in zip(sessions, outcomes, strict=True) if not code]
    result.opened = len(live)
    result.hello_retries = sum(s.retries for s in sessions)
    print(json.dumps({"opened": len(live)}), flush=True)
    ring = max(1, args.needs)
    if args.mode != "idle" or args.prime:
        for s in live:
            s.frames = Frames(s.cluster_id, args.needs, ring, unmet=args.unmet)
    if args.prime:
        # Each cluster's state exists before the measured load starts: one
        # roll-up per session, its ack awaited and not counted.
        await asyncio.gather(*(s.prime() for s in live))
        print(json.dumps({"primed": len(live)}), flush=True)
    start = time.monotonic() + args.delay
    if args.start_at:  # a wall-clock instant shared with other load processes
        start = time.monotonic() + max(0.0, args.start_at - time.time())
    result.start = start
    until = start + args.seconds
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    watch = asyncio.create_task(_watch_lag(result.lags, LATE_MS))

    async def keep(s: Session) -> None:
        """Read acks; with ``--reconnect``, come back after a shed's hint, as an operator does."""
        while True:
            s.retry_after = None
            await s.read_acks(result, until)
            if not args.reconnect or s.retry_after is None or time.monotonic() >= until:
                return
            await asyncio.sleep(s.retry_after)
            s.waiting.clear()  # roll-ups sent on the shed stream are never answered
            # An operator keeps trying (each refusal's hint is waited for in hello()).
            while await s.hello():
                if time.monotonic() >= until:
                    return
                await asyncio.sleep(1.0)  # a refusal without a hint: back off a little
            result.reconnected += 1

    readers = [asyncio.create_task(keep(s)) for s in live]

    if args.mode == "closed":

        async def loop(s: Session) -> None:
            while time.monotonic() < until and s.open:
                s.answered.clear()
                await s.send(time.monotonic())
                result.sent += 1
                # A timeout scope, not wait_for: no task made per roll-up (the load
                # processes share the machine's cores with the shard).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(30):
                        await s.answered.wait()

        await asyncio.gather(*(loop(s) for s in live))
    elif args.mode in ("open", "cadence"):
        # Each session sends every `period` seconds, phases spread evenly.
        period = args.period if args.mode == "cadence" else len(live) / max(args.rate, 1e-9)
        schedule = sorted((start + period * (i / max(1, len(live))), i) for i in range(len(live)))
        pending = [(t, i) for t, i in schedule]
        queues: list[asyncio.Queue[float]] = [asyncio.Queue() for _ in live]
        writers = [
            asyncio.create_task(s.writer(q, result)) for s, q in zip(live, queues, strict=True)
        ]
        while pending:
            due, i = pending[0]
            now = time.monotonic()
            if due > until:
                break
            if due > now:
                await asyncio.sleep(min(due - now, 0.002))
                continue
            pending.pop(0)
            s = live[i]
            if s.open:
                queues[i].put_nowait(due)
                result.sent += 1
                result.scheduled_s.append(due - start)
            # The next slot of this session goes to the end (the list stays sorted); a
            # session shed meanwhile keeps its slots for when it reconnects.
            pending.append((due + period, i))
        for w in writers:
            w.cancel()
    elif args.mode == "peers":
        await _live_beside_silent_peers(args, result, until)
    else:  # idle: hold the sessions open
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    await asyncio.sleep(1.0 if args.mode != "idle" else 0)
    result.seconds = args.seconds
    for s in live:
        await s.close()
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for c in channels:
        await c.close(None)
    watch.cancel()
    return result


LONG_GC_MS = 10.0
"""A collector pause of the shard child this long is kept with its time (``gc_long``)."""

LATE_MS = 20.0
"""A second whose worst loop lateness passes this is recorded (``LoadResult.lags``)."""


async def _watch_lag(into: list[list[float]], late_ms: float) -> None:
    """Record each second in which this loop woke more than ``late_ms`` late.

    Sampled every 10 ms, as the shard child samples its own loop; a load
    process that stalls delays its sends, and its acks then look late.
    """
    second_end = time.monotonic() + 1.0
    worst = 0.0
    while True:
        before = time.monotonic()
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst = max(worst, (now - before - 0.01) * 1000)
        if now >= second_end:
            if worst > late_ms:
                into.append([round(now, 3), round(worst, 1)])
            worst = 0.0
            second_end = now + 1.0


async def _live_beside_silent_peers(
    args: argparse.Namespace, result: LoadResult, until: float
) -> None:
    """``peers``: the sessions opened above stay silent; half-open connections are held
    beside them (a TCP connect and half an HTTP/2 preface, then nothing); live clusters
    then open sessions on their own channels, one Hello each (timed), and send a roll-up
    every half second, waiting for each ack (timed)."""
    host, _, port = args.address.rpartition(":")
    half_open = []
    for _ in range(args.half_open):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"PRI * HTTP/2.0\r\n")  # and never the rest
        half_open.append(sock)
    channels = [grpc.aio.insecure_channel(args.address) for _ in range(args.live)]
    live = [Session(c, f"{args.prefix}-live-{i}") for i, c in enumerate(channels)]

    async def one(s: Session) -> None:
        t0 = time.monotonic()
        if await s.hello():
            return
        result.hello_ms.append((time.monotonic() - t0) * 1000)
        s.frames = Frames(s.cluster_id, args.needs, max(1, args.needs), unmet=args.unmet)
        reader = asyncio.create_task(s.read_acks(result, until))
        while time.monotonic() < until and s.open:
            s.answered.clear()
            await s.send(time.monotonic())
            result.sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(s.answered.wait(), timeout=30)
            await asyncio.sleep(0.5)
        await s.close()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    await asyncio.gather(*(one(s) for s in live))
    for c in channels:
        await c.close(None)
    for sock in half_open:
        sock.close()


def load_main(args: argparse.Namespace) -> int:
    result = asyncio.run(run_load(args))
    print(
        json.dumps(
            {
                "opened": result.opened,
                "hello_retries": result.hello_retries,
                "refused": result.refused,
                "sent": result.sent,
                "acked": result.acked,
                "shed": result.shed,
                "latencies_ms": [round(x, 3) for x in result.latencies_ms],
                "sent_s": [round(x, 3) for x in result.sent_s],
                "scheduled_s": [round(x, 3) for x in result.scheduled_s],
                "hello_ms": [round(x, 3) for x in result.hello_ms],
                "start_monotonic": result.start,
                "reconnected": result.reconnected,
                "lags": result.lags,
                # Seconds whose longest write wait passed LATE_MS: [end of the second, ms].
                "write_waits": [
                    [second + 1, round(ms, 1)]
                    for second, ms in sorted(result.write_wait.items())
                    if ms > LATE_MS
                ],
            }
        ),
        flush=True,
    )
    return 0


# ----------------------------------------------------------------- shard side


async def serve_shard(args: argparse.Namespace) -> None:
    """The shard under test: the real ShardProcess, as ``bigfleet shard`` builds it."""
    import logging

    from bigfleet import temporal
    from bigfleet.shard.interpreter import InterpreterSettings
    from bigfleet.shard.process import ShardOptions, ShardProcess
    from bigfleet.store import Database, Store
    from providers.client import ProviderClient

    logging.basicConfig(level=logging.WARNING)
    db = Database.connect(args.database_url)
    await db.migrate()
    client = await temporal.connect(args.temporal)
    providers = {"simcloud": ProviderClient(args.provider)}
    interpreter = InterpreterSettings()
    if args.switch_interval_ms is not None:
        interpreter = replace(interpreter, switch_interval_s=args.switch_interval_ms / 1000 or None)
    if args.plain_gc:
        interpreter = replace(interpreter, gc_young_threshold=None, freeze_after_start=False)
    process = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            listen="127.0.0.1:0",
            holder=f"bench:{os.getpid()}",
            cycle_interval_s=args.cycle_seconds,
            interpreter=interpreter,
            edges=args.edges,
            edge_socket=str(Path(tempfile.mkdtemp(prefix="bf-bench-")) / "edge.sock"),
        ),
        store=Store(db.engine),
        temporal=client,
        providers=providers,
    )
    await process.start()
    # The OS thread ids of the Session port's thread and of the shard's loop, so the
    # orchestrator can split the process's CPU time between them (/proc/PID/task/TID).
    sessions_tid = next(
        (t.native_id for t in threading.enumerate() if t.name == "shard-sessions"), None
    )
    print(
        json.dumps(
            {
                "address": process.address,
                "pid": os.getpid(),
                "sessions_tid": sessions_tid,
                "loop_tid": threading.get_native_id(),
                "edge_pids": process.edge_link.pids() if process.edge_link is not None else [],
            }
        ),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Event-loop lag, sampled every 10 ms: the longest stall of each second.
    lag_max = 0.0
    cycles_before = process.cycles

    async def sample() -> None:
        nonlocal lag_max
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            lag_max = max(lag_max, time.monotonic() - t0 - 0.01)

    # Pauses of the cyclic garbage collector (they hold the GIL: no thread runs).
    gc_started = [0.0]
    gc_pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    # The long ones with when they ended: [monotonic time, generation, ms] (bench soak).
    gc_long: list[list[float]] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            pause = time.perf_counter() - gc_started[0]
            gc_pauses[info["generation"]].append(pause)
            if pause * 1000 >= LONG_GC_MS:
                gc_long.append(
                    [round(time.monotonic(), 3), info["generation"], round(pause * 1000, 1)]
                )

    # Each decision cycle's wall and CPU time (the CPU of the shard's loop thread):
    # what the sessions thread's share of the GIL costs the cycle.
    cycle_times: list[tuple[float, float]] = []
    cycle_ends: list[float] = []  # time.monotonic() (system-wide) as each cycle ended
    engine_cycle = process.engine.cycle

    def timed_cycle(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return engine_cycle(*args, **kwargs)
        finally:
            cycle_times.append((time.perf_counter() - wall, time.thread_time() - cpu))
            cycle_ends.append(time.monotonic())

    process.engine.cycle = timed_cycle  # type: ignore[method-assign]
    # Every 2 s: when (time.monotonic(), system-wide), RSS of this process and its
    # edges, this process's pymalloc blocks in use, and its C heap in use and kept
    # free (KiB): what memory a burst leaves behind.
    memory: list[tuple[float, int, int, int, int]] = []
    link = process.edge_link

    async def sample_memory() -> None:
        while True:
            heap = malloc_kib() or (0, 0)
            memory.append(
                (
                    round(time.monotonic(), 2),
                    _rss(os.getpid(), link.pids() if link is not None else []),
                    sys.getallocatedblocks(),
                    *heap,
                )
            )
            await asyncio.sleep(2.0)

    objects_at_start = len(gc.get_objects())
    gc.callbacks.append(on_gc)
    sampler = asyncio.create_task(sample())
    memory_sampler = asyncio.create_task(sample_memory())
    await stop.wait()
    sampler.cancel()
    memory_sampler.cancel()
    gc.callbacks.remove(on_gc)
    summary = process.engine.summary()
    print(
        json.dumps(
            {
                "gc_max_ms": {
                    g: round(1000 * max(p, default=0.0), 1) for g, p in gc_pauses.items()
                },
                "gc_count": {g: len(p) for g, p in gc_pauses.items()},
                "gc_objects": [objects_at_start, len(gc.get_objects()), gc.get_freeze_count()],
                "gc_long": gc_long,
                "sessions_lag_max_ms": round(1000 * process.session_loop_lag_worst(), 1),
                "edges_load": _edges_load(process),
                "loop_lag_max_ms": round(lag_max * 1000, 1),
                "cycle_wall_ms": [round(1000 * w, 1) for w, _ in cycle_times],
                "cycle_cpu_ms": [round(1000 * c, 1) for _, c in cycle_times],
                "cycle_end_s": [round(t, 3) for t in cycle_ends],
                "cycles": process.cycles - cycles_before,
                "needs": summary.needs,
                "sessions": len(process.hub.clusters()),
                "memory": memory,
            }
        ),
        flush=True,
    )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(process.stop(), timeout=10)
    await db.close()


def shard_main(args: argparse.Namespace) -> int:
    asyncio.run(serve_shard(args))
    return 0


async def serve_echo() -> None:
    """The ``floor`` scenario's server: Shard/Session's shape and nothing else.

    One coroutine per stream reads a frame, decodes it (as the shard must)
    and writes an acknowledgement serialized once; no validation, no engine.
    """
    hello_ack = shard_pb2.ShardMessage(
        ack=shard_pb2.Acknowledgement(echo="hello")
    ).SerializeToString()
    rollup_ack = shard_pb2.ShardMessage(
        ack=shard_pb2.Acknowledgement(echo="rollup", coordinator_term=1, shard_epoch=1)
    ).SerializeToString()

    async def session(_requests: Any, context: Any) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:  # type: ignore[attr-defined]
            return
        await context.write(hello_ack)
        while (frame := await context.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            shard_pb2.OperatorMessage.FromString(frame)
            await context.write(rollup_ack)

    server = grpc.aio.server()
    handlers = {
        "Session": grpc.stream_stream_rpc_method_handler(
            session, request_deserializer=None, response_serializer=None
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bigfleet.v1alpha1.Shard", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready = {"address": f"127.0.0.1:{port}", "pid": os.getpid()}
    print(json.dumps({**ready, "sessions_tid": threading.get_native_id()}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print(json.dumps({"loop_lag_max_ms": 0.0, "cycles": 0, "needs": 0}), flush=True)
    await server.stop(None)


def echo_main(_args: argparse.Namespace) -> int:
    asyncio.run(serve_echo())
    return 0


# ------------------------------------------------------------------ orchestrator


def _emit(scenario: str, metric: str, value: float, unit: str, **extra: Any) -> None:
    line: dict[str, Any] = {
        "bench": "ingest",
        "scenario": scenario,
        "metric": metric,
        "value": round(value, 3) if isinstance(value, float) else value,
        "unit": unit,
    }
    line.update(extra)
    line["loadavg"] = loadavg()
    print(json.dumps(line), flush=True)


async def _cpu_wait(groups: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """Per group of processes, the mean number of its threads waiting for a core over
    the next ``seconds`` (``runqueue_seconds``); empty where the kernel does not say."""
    before = {g: runqueue_seconds(pids) for g, pids in groups.items() if pids}
    await asyncio.sleep(seconds)
    after = {g: runqueue_seconds(pids) for g, pids in groups.items() if pids}
    return {
        g: (end - start) / seconds
        for g, start in before.items()
        if start is not None and (end := after.get(g)) is not None
    }


async def _scenario(
    stack: Stack,
    name: str,
    *,
    sessions: int,
    loaders: int,
    connections: int,
    mode: str,
    seconds: float,
    needs: int,
    rate: float = 0.0,
    period: float = 10.0,
    unmet: bool = False,
    child: str = "shard",
) -> None:
    shard, drop = await start_shard(stack, child)
    assert shard.stdout is not None
    loads: list[Any] = []
    waiting: asyncio.Task[dict[str, float]] | None = None
    try:
        ready = await json_line(shard.stdout, 120)
        address, pid = ready["address"], int(ready["pid"])
        edge_pids = [int(p) for p in ready.get("edge_pids", [])]
        threads = {
            "sessions": ready.get("sessions_tid"),
            "loop": ready.get("loop_tid"),
        }
        await asyncio.sleep(1.0)
        rss_before = _rss(pid, edge_pids)
        per = [sessions // loaders + (1 if i < sessions % loaders else 0) for i in range(loaders)]
        delay = 3.0 + sessions / 4000  # every loader opens its sessions before the clock starts
        for i, n in enumerate(per):
            loads.append(
                await start_load(
                    address,
                    f"{name}-{i}",
                    sessions=n,
                    mode=mode,
                    seconds=seconds,
                    connections=max(1, connections // loaders),
                    needs=needs,
                    rate=rate / loaders,
                    period=period,
                    delay=delay,
                    unmet=unmet,
                )
            )
        opened = 0
        for proc in loads:
            assert proc.stdout is not None
            opened += int((await json_line(proc.stdout, 120 + sessions / 100))["opened"])
        rss_open = _rss(pid, edge_pids)
        t0 = time.monotonic()
        results = []
        cpu0 = cpu_seconds(pid)
        edges0 = sum(cpu_seconds(p) for p in edge_pids)
        split0 = {k: cpu_seconds(pid, tid) for k, tid in threads.items() if tid}
        if mode != "idle":
            groups = {"engine": [pid], "edges": edge_pids, "load": [proc.pid for proc in loads]}
            # Read before the load processes end (they exit as they report).
            waiting = asyncio.create_task(_cpu_wait(groups, seconds * 0.9))
        for proc in loads:
            assert proc.stdout is not None
            results.append(await json_line(proc.stdout, seconds + 120))
            await proc.wait()
        cpu = cpu_seconds(pid) - cpu0
        split = {k: cpu_seconds(pid, threads[k]) - v for k, v in split0.items()}
        if edge_pids:
            split["edges"] = sum(cpu_seconds(p) for p in edge_pids) - edges0
            cpu += split["edges"]
        elapsed = max(seconds, time.monotonic() - t0)
        rss_after = _rss(pid, edge_pids)
        shard.send_signal(signal.SIGTERM)
        stats = await json_line(shard.stdout, 60)
    except BaseException:
        if waiting is not None:
            waiting.cancel()
        raise
    finally:
        await stop_loads(loads)
        await stop_shard(shard, drop)
    latencies = [x for r in results for x in r["latencies_ms"]]
    refused: dict[str, int] = {}
    for r in results:
        for code, n in r["refused"].items():
            refused[code] = refused.get(code, 0) + n
    acked = sum(r["acked"] for r in results)
    shed = sum(r["shed"] for r in results)
    common = {
        "sessions": sessions,
        "needs_per_rollup": needs,
        "loaders": loaders,
        "connections": connections,
        "edges": stack.edges,
    }
    retried = sum(int(r.get("hello_retries", 0)) for r in results)
    _emit(
        name,
        "sessions_held",
        opened,
        "sessions",
        refused=refused,
        hellos_retried_after_hint=retried,
        **common,
    )
    hellos = [x for r in results for x in r.get("hello_ms", [])]
    if hellos:
        _emit(name, "hello_p99", percentile(hellos, 99), "ms", hellos=len(hellos), **common)
        _emit(name, "hello_max", max(hellos), "ms", **common)
    if mode != "idle":
        _emit(name, "rate", acked / seconds, "1/s", offered=rate or None, **common)
        _emit(name, "ack_p50", percentile(latencies, 50), "ms", **common)
        _emit(name, "ack_p99", percentile(latencies, 99), "ms", **common)
        _emit(name, "ack_max", max(latencies or [float("nan")]), "ms", **common)
        _emit(name, "shed", shed, "streams", **common)
        _emit(name, "shard_cores", cpu / elapsed, "cores", **common)
        # The robust figure on a shared machine: shard CPU per acknowledged roll-up,
        # split between the Session port's thread, the shard's loop (applying
        # roll-ups, cycles) and the rest (gRPC's and Temporal's native threads).
        per = 1e6 / max(1, acked)
        parts = {f"{k}_us": round(v * per, 1) for k, v in split.items()}
        parts["other_us"] = round((cpu - sum(split.values())) * per, 1)
        _emit(name, "cpu_per_rollup", cpu * per, "us", **parts, **common)
        wait = await waiting if waiting is not None else {}
        if wait:
            # Threads runnable but given no core, on average: the shard's (engine and
            # edges) as the value, each group beside it. A tail with the shard waiting
            # here is the machine's cores, shared with the load generators, not its code.
            _emit(
                name,
                "cpu_wait",
                wait.get("engine", 0.0) + wait.get("edges", 0.0),
                "threads",
                **{f"{k}_threads": round(v, 3) for k, v in wait.items()},
                **common,
            )
    _emit(
        name,
        "bytes_per_session",
        (rss_open - rss_before) * 1024 / max(1, opened),
        "B",
        rss_before_mib=round(rss_before / 1024, 1),
        rss_open_mib=round(rss_open / 1024, 1),
        rss_after_mib=round(rss_after / 1024, 1),
        **common,
    )
    _emit(
        name,
        "loop_lag_max",
        float(stats["loop_lag_max_ms"]),
        "ms",
        cycles=stats["cycles"],
        needs=stats["needs"],
        sessions_loop_lag_max_ms=stats.get("sessions_lag_max_ms"),
        edges_own=_edges_window(stats.get("edges_load", []), t0, t0 + elapsed),
        gc_max_ms=stats.get("gc_max_ms"),
        gc_count=stats.get("gc_count"),
        gc_objects=stats.get("gc_objects"),
        **common,
    )
    walls, cpus = stats.get("cycle_wall_ms", []), stats.get("cycle_cpu_ms", [])
    if walls:
        _emit(
            name,
            "cycle_wall_mean",
            sum(walls) / len(walls),
            "ms",
            cycles=len(walls),
            max_ms=max(walls),
            cpu_mean_ms=round(sum(cpus) / len(cpus), 1),
            cpu_max_ms=max(cpus),
            **common,
        )


async def _recovery(stack: Stack, args: argparse.Namespace) -> None:
    """``recovery``: the normal cadence, bursts of overload on top, the cadence again — one shard.

    ``--clusters`` clusters send one 5-need roll-up every 10 s throughout
    (``warm`` + ``bursts`` × (``burst`` + ``after``) seconds); during each
    burst 200 more clusters offer ``--burst-rate`` roll-ups/s open loop
    (about twice what one shard process acknowledges here). Those 200 send
    one roll-up each before the cadence starts, so the state they keep
    (their needs stay in force) is in the shard before the first burst and
    the memory figures compare backlog, not new clusters. A stream shed with
    RESOURCE_EXHAUSTED comes back after the retry hint, as an operator does.

    What issue 20 asks of it: the cadence is acknowledged within its 10 s
    again soon after a burst ends (its staged and queued roll-ups
    superseded, not worked through), and the shard's memory returns to its
    level before the burst. The cadence's ack latency is reported per 5-s
    window of send time; the shard reports its RSS, pymalloc's blocks and
    the C heap (in use, and free but kept by the allocator) every 2 s, so a
    second burst tells memory still held from a high-water mark reused. With
    ``--edges`` the RSS is the engine's and its edges' together; the heap
    figures are the engine process's.
    """
    name = "recovery"
    warm, burst, after = args.warm_seconds, args.burst_seconds, args.after_seconds
    bursts = max(1, args.bursts)
    period = 10.0
    shard, drop = await start_shard(stack)
    assert shard.stdout is not None
    total = warm + bursts * (burst + after)
    starts = [warm + k * (burst + after) for k in range(bursts)]
    # The same 200 clusters prime the shard and send every burst.
    burst_clusters: dict[str, Any] = {
        "prefix": "burst",
        "sessions": 200,
        "connections": 200,
        "needs": 20,
    }
    started: list[Any] = []  # every load process, stopped if the run is cut short
    try:
        ready = await json_line(shard.stdout, 120)
        address = ready["address"]
        start_at = time.time() + 10.0 + args.clusters / 400
        steady = await split_load(
            address,
            "steady",
            clusters=args.clusters,
            mode="cadence",
            seconds=total,
            needs=5,
            period=period,
            unmet=True,
            start_at=start_at,
            reconnect=True,
        )
        started += steady
        # The burst's clusters, known to the shard before the cadence starts.
        primer = await start_load(address, mode="idle", seconds=0, prime=True, **burst_clusters)
        started.append(primer)
        for proc in (*steady, primer):
            await json_line(proc.stdout, 300)  # sessions opened
        await json_line(primer.stdout, 300)  # primed
        await json_line(primer.stdout, 300)  # its result
        await primer.wait()
        t0 = time.monotonic() + max(0.0, start_at - time.time())

        async def flood(offset: float) -> dict[str, Any]:
            """One burst: its load process starts a few seconds before it, so sessions are open."""
            await asyncio.sleep(max(0.0, t0 + offset - 8.0 - time.monotonic()))
            proc = await start_load(
                address,
                mode="open",
                seconds=burst,
                rate=args.burst_rate,
                start_at=time.time() + (t0 + offset - time.monotonic()),
                reconnect=True,
                **burst_clusters,
            )
            started.append(proc)
            await json_line(proc.stdout, 300)  # sessions opened
            result = await json_line(proc.stdout, total + 300)
            await proc.wait()
            return result

        floods = await asyncio.gather(*(flood(o) for o in starts))
        results = [await json_line(proc.stdout, total + 300) for proc in steady]
        for proc in steady:
            await proc.wait()
        shard.send_signal(signal.SIGTERM)
        stats = await json_line(shard.stdout, 60)
    finally:
        await stop_loads(started)
        await stop_shard(shard, drop)
    pairs = [
        (sent, ms) for r in results for sent, ms in zip(r["sent_s"], r["latencies_ms"], strict=True)
    ]
    scheduled = [t for r in results for t in r["scheduled_s"]]
    windows = []
    for w in range(math.ceil(total / 5)):
        lo, hi = 5.0 * w, 5.0 * (w + 1)
        lat = [ms for sent, ms in pairs if lo <= sent < hi]
        due = sum(1 for t in scheduled if lo <= t < hi)
        within = sum(1 for ms in lat if ms <= period * 1000)
        windows.append((lo, hi, due, within, percentile(lat, 99)))
    common = {"clusters": args.clusters, "burst_rate": args.burst_rate, "burst_s": burst}

    def phase(lo: float, hi: float) -> list[float]:
        return [ms for sent, ms in pairs if lo <= sent < hi]

    # Memory as the shard sampled it, on the load's clock (seconds after the cadence began).
    memory = [(t - t0, *rest) for t, *rest in stats.get("memory", [])]

    def memory_at(t: float) -> tuple[float, ...]:
        """The last sample at or before ``t``: RSS, pymalloc blocks, C heap in use, C heap free."""
        before = [row for row in memory if row[0] <= t] or memory[:1] or [(t, 0, 0, 0, 0)]
        return tuple(before[-1][1:])

    _emit(name, "cadence_p99_before", percentile(phase(5.0, warm), 99), "ms", **common)
    for k, begin in enumerate(starts):
        end = begin + burst
        until = starts[k + 1] if k + 1 < len(starts) else total
        tag = {"burst": k + 1, **common}
        _emit(name, "cadence_p99_burst", percentile(phase(begin, end), 99), "ms", **tag)
        settled = phase(end + 30.0, until)
        _emit(name, "cadence_p99_after_30s", percentile(settled, 99), "ms", **tag)
        _emit(name, "cadence_p50_after_30s", percentile(settled, 50), "ms", **tag)
        later = [row for row in windows if end <= row[0] < until]
        recovered = next(
            (
                lo - end
                for i, (lo, *_r) in enumerate(later)
                if all(
                    due == 0 or (within / due >= 0.99 and p99 <= period * 1000)
                    for *_w, due, within, p99 in later[i:]
                )
            ),
            float("nan"),
        )
        _emit(
            name,
            "recovered_after",
            recovered,
            "s",
            note="from the burst's end until every later 5-s window has >= 99 % acked within 10 s",
            **tag,
        )
        _emit(
            name,
            "burst_acked_rate",
            floods[k]["acked"] / max(burst, 1e-9),
            "1/s",
            offered=args.burst_rate,
            shed=floods[k]["shed"],
            reconnected=floods[k].get("reconnected"),
            cadence_shed=sum(r["shed"] for r in results),
            **tag,
        )
        rss0, blocks0, used0, free0 = memory_at(begin)
        rss1, blocks1, used1, free1 = memory_at(until)
        peak = max((row[1] for row in memory if begin <= row[0] <= until), default=rss0)
        _emit(
            name,
            "rss",
            rss1 / 1024,
            "MiB",
            before_burst_mib=round(rss0 / 1024, 1),
            peak_mib=round(peak / 1024, 1),
            after_30s_mib=round(memory_at(end + 30.0)[0] / 1024, 1),
            growth_pct=round(100 * (rss1 - rss0) / max(rss0, 1), 1),
            **tag,
        )
        _emit(
            name,
            "heap",
            used1 / 1024,
            "MiB",
            note="C heap in use (and free but kept), pymalloc blocks: before the burst, after",
            in_use_before_mib=round(used0 / 1024, 1),
            free_kept_before_mib=round(free0 / 1024, 1),
            free_kept_after_mib=round(free1 / 1024, 1),
            pymalloc_blocks_before=blocks0,
            pymalloc_blocks_after=blocks1,
            **tag,
        )
    _emit(
        name,
        "windows",
        len(windows),
        "windows",
        p99_ms=[round(p, 1) for *_r, p in windows],
        acked_within_share=[round(wi / d, 3) if d else None for *_r, d, wi, _p in windows],
        **common,
    )
    walls = stats.get("cycle_wall_ms", [])
    if walls:
        _emit(name, "cycle_wall_max", max(walls), "ms", cycles=len(walls), **common)


def _edges_load(process: Any) -> list[list[float]]:
    """The edges' reports of themselves (LOAD frames): [t, edge, lag max, gc max, gc total, busy].

    ``t`` is the monotonic clock at arrival (the parent keeps those in its
    window); the maxima are over the second before each report, in ms.
    """
    link = process.edge_link
    if link is None:
        return []
    return [
        [round(t, 3), index, round(1000 * load.lag_worst_s, 2), round(1000 * load.gc_worst_s, 2),
         round(1000 * load.gc_total_s, 1), round(load.busy, 3)]
        for t, index, load in link.reports
    ]  # fmt: skip


def _edges_window(reports: list[list[float]], start: float, end: float) -> dict[str, Any]:
    """The edges' own figures over the measured window, from their reports (_edges_load).

    ``lag_max_ms``/``gc_max_ms``: the worst loop lateness and collector pause;
    ``gc_ms``: the collectors' total pauses; ``seconds_lag_over_20ms``: how many
    one-second reports saw the loop more than 20 ms late (the stalls behind
    an open loop's tail); ``busy_mean``: the loops' mean busy share.
    """
    inside = [r for r in reports if start <= r[0] <= end + 1.5]
    if not inside:
        return {}
    gc_ms = 0.0
    for edge in {int(r[1]) for r in inside}:
        during = [r[4] for r in inside if int(r[1]) == edge]
        before = [r[4] for r in reports if int(r[1]) == edge and r[0] < start]
        gc_ms += during[-1] - (before[-1] if before else 0.0)
    return {
        "lag_max_ms": max(r[2] for r in inside),
        "gc_max_ms": max(r[3] for r in inside),
        "gc_ms": round(gc_ms, 1),
        "seconds_lag_over_20ms": sum(1 for r in inside if r[2] > 20.0),
        "busy_mean": round(sum(r[5] for r in inside) / len(inside), 3),
    }


def _rss(pid: int, edge_pids: list[int]) -> int:
    """Resident memory (KiB) of the shard process and its edge processes."""
    return rss_kib(pid) + sum(rss_kib(p) for p in edge_pids)


async def run(args: argparse.Namespace) -> int:
    async with services(quota_scale=0.05) as (temporal, provider):
        stack = Stack(
            temporal,
            provider,
            args.pg,
            args.switch_interval_ms,
            args.cycle_seconds,
            args.plain_gc,
            args.edges,
        )
        return await _run(stack, args)


async def _run(stack: Stack, args: argparse.Namespace) -> int:
    """Every scenario asked for, each on a fresh shard process; 2 for an unknown one."""
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    # Each scenario's load; the closed loop's shape unless it says otherwise.
    closed: dict[str, Any] = dict(
        sessions=200, loaders=2, connections=200, mode="closed", seconds=args.seconds, needs=20
    )
    shapes: dict[str, dict[str, Any]] = {
        "closed": closed,
        "open": closed | dict(mode="open", rate=args.open_rate),
        "cadence": closed
        | dict(
            sessions=args.clusters,
            connections=args.clusters,
            mode="cadence",
            period=10.0,
            seconds=max(args.seconds, 30.0),
            needs=5,
            unmet=True,
        ),
        "sessions": closed
        | dict(
            sessions=args.idle_sessions,
            connections=args.idle_connections,
            mode="idle",
            seconds=5.0,
            needs=0,
        ),
        # 40 clusters each offering overload_rate/40 roll-ups/s: far above both
        # a cluster's rate limit and what one shard process acknowledges.
        "overload": closed
        | dict(sessions=40, connections=40, mode="open", rate=args.overload_rate),
        "floor": closed | dict(child="echo"),
        # 200 silent sessions and 50 half-open connections held while 20 live clusters
        # open sessions and send roll-ups: their Hello and ack latencies.
        "peers": closed | dict(sessions=200, loaders=1, connections=200, mode="peers"),
    }
    unknown = [s for s in wanted if s not in shapes and s != "recovery"]
    if unknown:
        print(f"unknown scenario {unknown[0]!r} (known: {', '.join(shapes)})", file=sys.stderr)
        return 2
    for scenario in wanted:
        if scenario == "recovery":
            await _recovery(stack, args)
        else:
            await _scenario(stack, scenario, **shapes[scenario])
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ingest", description=__doc__)
    parser.add_argument("--child", choices=("shard", "load", "echo"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--scenarios",
        default="closed,open,cadence,sessions,overload,floor",
        help="comma-separated",
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds each")
    parser.add_argument(
        "--edges",
        type=int,
        default=auto_edges(),
        help="edge processes serving the Session port (default: the product's, ADR 0147)",
    )
    parser.add_argument("--open-rate", type=float, default=2000.0, help="roll-ups/s offered")
    parser.add_argument("--overload-rate", type=float, default=12000.0, help="roll-ups/s")
    parser.add_argument("--clusters", type=int, default=2000, help="cadence scenario clusters")
    parser.add_argument("--burst-rate", type=float, default=4000.0, help="recovery: roll-ups/s")
    parser.add_argument("--warm-seconds", type=float, default=30.0, help="recovery: before")
    parser.add_argument("--burst-seconds", type=float, default=60.0, help="recovery: the burst")
    parser.add_argument("--after-seconds", type=float, default=60.0, help="recovery: after it")
    parser.add_argument("--bursts", type=int, default=2, help="recovery: bursts, one after another")
    parser.add_argument("--idle-sessions", type=int, default=20000)
    parser.add_argument(
        "--idle-connections",
        type=int,
        default=200,
        help="connections the idle sessions share (the hard descriptor limit here is 20,000)",
    )
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (default: machine's)")
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="the shard's interpreter switch interval (default: the shard's own; 0: Python's)",
    )
    parser.add_argument(
        "--plain-gc",
        action="store_true",
        help="leave the garbage collector as Python sets it (no freeze, default thresholds)",
    )
    # children
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--temporal", help=argparse.SUPPRESS)
    parser.add_argument("--provider", help=argparse.SUPPRESS)
    parser.add_argument(
        "--cycle-seconds", type=float, default=5.0, help="the shard's cycle interval"
    )
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="c", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="closed", help=argparse.SUPPRESS)
    parser.add_argument("--needs", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--period", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=2.0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--unmet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--half-open", type=int, default=50, help=argparse.SUPPRESS)
    parser.add_argument("--live", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--reconnect", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prime", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "shard":
        status = shard_main(args)
    elif args.child == "load":
        status = load_main(args)
    elif args.child == "echo":
        status = echo_main(args)
    else:
        random.seed(0)
        status = asyncio.run(run(args))
    atexit.register(_exit_without_finalising, status)
    return status


def _exit_without_finalising(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
