"""The shard's gRPC server (Session, ShardRead, health, reflection) on its own thread.

It runs on its own event loop so that acknowledgements never wait for the cycle.

    sessions thread (its own asyncio loop)           shard loop (everything else)
    ─────────────────────────────────────           ──────────────────────────────
    grpc.aio server: Shard, Health, Reflection
    Hello ── admit_cluster ─────────────────────▶   store.assign_cluster (awaited there)
    roll-up ── translate ── Intake.offer (judged once: ValidatedRollup) ── ack
                                  └─ staged ────▶   apply in slices of a few ms
    InspectNeeds ─────────────────────────────▶    engine.inspect_needs (run there)
    outbox ◀── hub.send / bootstrap requests ───    node updates, activities
                                                     decision cycle (may take 100s of ms)

The decision cycle and the engine stay on the shard's loop, untouched by
this thread (no locks around the engine). Python's GIL still serialises the
two threads, but it is handed over every few milliseconds
(``sys.getswitchinterval``), so a long cycle delays an ack by a slice, not
by the whole cycle (ADR 0066).

Keepalives: the server pings an idle connection every ``keepalive_s`` and
drops it when the ping is not answered within ``keepalive_timeout_s``, so a
dead operator's session ends (and its bootstrap waiters fail over) within
about ``keepalive_s + keepalive_timeout_s``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import selectors
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bigfleet.identity import KeyPairSource, server_credentials
from bigfleet.shard.sessions import (
    CountingSink,
    RollupSink,
    SessionHub,
    SessionLimits,
    ShardServicer,
)
from bigfleet.shard.shardread import SHARD_READ_SERVICE, ShardReadServicer
from bigfleet.v1alpha1 import shard_pb2, shard_pb2_grpc, shardread_pb2_grpc
from shard_engine.model import Rollup
from shard_engine.verdicts import Inspection

log = logging.getLogger(__name__)

__all__ = ["IngestOptions", "IngestServer", "LoopLag"]


@dataclass(frozen=True)
class IngestOptions:
    """The Session port's transport settings."""

    listen: str = "127.0.0.1:0"
    limits: SessionLimits = field(default_factory=SessionLimits)
    keepalive_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    # Operators may ping this often (a Go operator pings every 30 s by default).
    min_client_ping_s: float = 10.0
    # A call gRPC's core has received but this server has not yet picked up is
    # cancelled after this long (core's default is 30 s). A Hello storm on a busy
    # machine queues calls for longer than that; each must get our own answer
    # instead (an ack, or RESOURCE_EXHAUSTED with a retry hint), not CANCELLED.
    # Waiting calls stay bounded by max_pending_requests (below).
    max_unrequested_s: float = 600.0
    # Share the port with other processes that set it too (a shard's edge processes,
    # ADR 0147): the kernel spreads new connections between them.
    reuse_port: bool = False

    def server_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            # gRPC's core waits for a ping's ack for its own ping timeout (60 s by
            # default), whatever the keepalive timeout says: without this a silent
            # peer held its session for keepalive_s + 60 s, not + keepalive_timeout_s.
            ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.min_client_ping_s * 1000)),
            ("grpc.http2.max_pings_without_data", 0),
            # No bandwidth-delay probing: flow-control windows stay at their small
            # defaults, which keeps an idle session's buffers small.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ("grpc.so_reuseport", 1 if self.reuse_port else 0),
            # gRPC's core refuses calls the application has not picked up yet beyond
            # 1,000 (at random) and 3,000 (all): a reconnection storm of thousands of
            # operators then sees CANCELLED or INTERNAL. Our own limit is max_sessions,
            # answered with RESOURCE_EXHAUSTED and a retry hint (sessions.SessionLimits).
            ("grpc.server.max_pending_requests", 2 * self.limits.max_sessions),
            ("grpc.server.max_pending_requests_hard_limit", 2 * self.limits.max_sessions),
            ("grpc.server_max_unrequested_time_in_server", int(self.max_unrequested_s)),
        ]


class TimedSelector(selectors.DefaultSelector):
    """The loop's selector, counting the time the loop spends idle (waiting for I/O)."""

    def __init__(self) -> None:
        super().__init__()
        self.idle_s = 0.0

    def select(self, timeout: float | None = None) -> Any:
        started = time.perf_counter()
        try:
            return super().select(timeout)
        finally:
            self.idle_s += time.perf_counter() - started


class LoopLag:
    """How far an event loop runs behind, and how busy it is, smoothed.

    ``value`` (call the object): lateness of a 10 ms timer, a single stall
    counting a little and a sustained one converging to its size. ``busy``:
    share of the last second or so the loop was not waiting for I/O (needs a
    :class:`TimedSelector`; 0 without one).
    """

    def __init__(self, interval_s: float = 0.01, selector: TimedSelector | None = None) -> None:
        self.interval_s = interval_s
        self.selector = selector
        self.value = 0.0
        self.worst = 0.0
        self.busy = 0.0
        self._recent = 0.0

    async def run(self) -> None:
        window_start, idle_start = time.perf_counter(), self._idle()
        while True:
            started = time.monotonic()
            await asyncio.sleep(self.interval_s)
            late = max(0.0, time.monotonic() - started - self.interval_s)
            self.worst = max(self.worst, late)
            self._recent = max(self._recent, late)
            self.value = 0.7 * self.value + 0.3 * late
            now = time.perf_counter()
            if now - window_start >= 0.1 and self.selector is not None:
                idle = self._idle()
                share = 1.0 - (idle - idle_start) / (now - window_start)
                self.busy = 0.8 * self.busy + 0.2 * min(1.0, max(0.0, share))
                window_start, idle_start = now, idle

    def _idle(self) -> float:
        return self.selector.idle_s if self.selector is not None else 0.0

    def __call__(self) -> float:
        return self.value

    def take_worst(self) -> float:
        """The worst lateness since the last call (``worst`` is since the start)."""
        recent, self._recent = self._recent, 0.0
        return recent

    def busy_share(self) -> float:
        return self.busy


class _Bridge:
    """The shard's RollupSink, as seen from the sessions thread.

    ``admit_cluster`` runs on the shard's loop (it uses the store) and is
    awaited from here; ``apply_rollup`` and ``ack_fields`` are thread-safe by
    contract and called directly.
    """

    def __init__(self, sink: RollupSink, loop: asyncio.AbstractEventLoop) -> None:
        self._sink = sink
        self._loop = loop

    async def admit_cluster(self, cluster_id: str) -> None:
        done = asyncio.run_coroutine_threadsafe(self._sink.admit_cluster(cluster_id), self._loop)
        await asyncio.wrap_future(done)

    def apply_rollup(self, rollup: Rollup) -> str:
        return self._sink.apply_rollup(rollup)

    def ack_fields(self) -> tuple[int, int]:
        return self._sink.ack_fields()

    def settled(self, outcome: str) -> None:
        if isinstance(self._sink, CountingSink):
            self._sink.settled(outcome)

    def inspector(
        self, inspect: Callable[[str, int], Inspection]
    ) -> Callable[[str, int], concurrent.futures.Future[Inspection]]:
        """``inspect`` run on the shard's loop (where the engine lives), from this thread."""

        async def on_shard_loop(cluster_id: str, limit: int) -> Inspection:
            return inspect(cluster_id, limit)

        def ask(cluster_id: str, limit: int) -> concurrent.futures.Future[Inspection]:
            return asyncio.run_coroutine_threadsafe(on_shard_loop(cluster_id, limit), self._loop)

        return ask


class IngestServer:
    """Serves ``bigfleet.v1alpha1.Shard`` (with health and reflection) on its own thread."""

    def __init__(
        self,
        hub: SessionHub,
        sink: RollupSink,
        options: IngestOptions,
        *,
        tls: KeyPairSource | None = None,
        inspect: Callable[[str, int], Inspection] | None = None,
        asked: Callable[[str, int], concurrent.futures.Future[Inspection]] | None = None,
    ) -> None:
        self.hub = hub
        # Why-not (ShardRead): ``inspect`` is the engine's answer, run on the shard's loop;
        # ``asked`` an answer that comes from elsewhere as a future (an edge asks its engine
        # over the link). Neither: not served.
        self._inspect = inspect
        self._asked = asked
        self.options = options
        self.tls = tls
        self.lag = LoopLag()
        self.address = ""
        self._sink = sink
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._grace = 1.0

    async def start(self) -> str:
        """Start the thread and its server; returns ``host:port`` once it listens."""
        ready: concurrent.futures.Future[str] = concurrent.futures.Future()
        bridge = _Bridge(self._sink, asyncio.get_running_loop())
        self._thread = threading.Thread(
            target=self._run, args=(bridge, ready), name="shard-sessions", daemon=True
        )
        self._thread.start()
        self.address = await asyncio.wrap_future(ready)
        return self.address

    async def serve_here(self, selector: TimedSelector | None = None) -> str:
        """Serve on the running loop instead of a thread of its own; ``host:port``.

        For a process whose loop has nothing else that could delay an ack:
        an edge process (ADR 0147) saves the hand-over between two threads
        of one interpreter. ``selector``: the loop's, if it is a
        :class:`TimedSelector` (the busy share sheds Hellos).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.lag.selector = selector
        ready: concurrent.futures.Future[str] = concurrent.futures.Future()
        task = asyncio.create_task(self._serve(_Bridge(self._sink, loop), ready), name="sessions")

        def failed(done: asyncio.Task[None]) -> None:
            if not ready.done():
                error = None if done.cancelled() else done.exception()
                ready.set_exception(error or RuntimeError("the Session port ended at start-up"))

        task.add_done_callback(failed)
        self._task = task
        self.address = await asyncio.wrap_future(ready)
        return self.address

    def _run(self, bridge: _Bridge, ready: concurrent.futures.Future[str]) -> None:
        selector = TimedSelector()
        loop = asyncio.SelectorEventLoop(selector)
        self.lag.selector = selector
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(bridge, ready))
        except BaseException as err:  # surface start-up failures to start()
            if not ready.done():
                ready.set_exception(err)
            else:
                log.exception("the sessions thread failed")
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self, bridge: _Bridge, ready: concurrent.futures.Future[str]) -> None:
        self._stop = asyncio.Event()
        self.hub.bind(asyncio.get_running_loop())
        server = grpc.aio.server(options=self.options.server_options())
        servicer = ShardServicer(
            self.hub,
            bridge,
            limits=self.options.limits,
            lag=self.lag,
            busy=self.lag.busy_share,
        )
        shard_pb2_grpc.add_ShardServicer_to_server(servicer, server)
        services = [shard_pb2.DESCRIPTOR.services_by_name["Shard"].full_name]
        asked = self._asked
        if asked is None and self._inspect is not None:
            asked = bridge.inspector(self._inspect)
        if asked is not None:
            reader = ShardReadServicer(asked)
            shardread_pb2_grpc.add_ShardReadServicer_to_server(reader, server)
            services.append(SHARD_READ_SERVICE)
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection((*services, reflection.SERVICE_NAME), server)
        listen = self.options.listen
        try:
            if self.tls is None:
                port = server.add_insecure_port(listen)
            else:
                port = server.add_secure_port(listen, server_credentials(self.tls))
        except RuntimeError as err:  # gRPC's word for a port it could not bind
            raise OSError(f"cannot listen on {listen}: {err}") from err
        if port == 0:
            raise OSError(f"cannot listen on {listen}")
        await server.start()
        for service in services:
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        sampler = asyncio.create_task(self.lag.run(), name="session-loop-lag")
        ready.set_result(f"{listen.rsplit(':', 1)[0]}:{port}")
        try:
            await self._stop.wait()
        finally:
            sampler.cancel()
            self.hub.close_all()
            await server.stop(self._grace)
            servicer.stop()

    async def stop(self, grace: float = 1.0) -> None:
        """Close every session and stop serving (in-flight calls get ``grace`` seconds)."""
        if self._task is not None:
            self._grace = grace
            if self._stop is not None:
                self._stop.set()
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
            return
        if self._thread is None:
            return
        self._grace = grace
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(self._thread.join, grace + 10.0)
        self._thread = None
