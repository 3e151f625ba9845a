"""One edge process: a shard's Session port in a process of its own, relaying to the engine.

    one loop (the process's only one; IngestServer.serve_here):
    operators ══Shard/Session══▶ IngestServer (its servicer unchanged)
                                   Hello ── EdgeSink.admit_cluster ── ADMIT ─▶ engine ─▶ ADMITTED
                                   roll-up ── Intake.offer (judged once) ── ack
                                                 └─ staged, newest per cluster
    readers ══ShardRead/InspectNeeds══▶ ShardReadServicer (unchanged: caller, request checked)
                                   ── EngineLink.inspect ── INSPECT ─▶ engine ─▶ INSPECTED
                EngineLink ── ROLLUP (validated needs), SETTLED, OPENED/CLOSED ──▶ engine
                           ◀── SEND, BOOTSTRAP, EVICT, CLOSE_ALL, STAMPS, DEFER ── engine

The edge judges each roll-up once into a ``ValidatedRollup`` (its
:class:`~bigfleet.shard.intake.Intake` keeps each cluster's last accepted
one, what the next is judged against), acknowledges it at once, and relays
only the newest per cluster: one superseded before it was relayed is
counted ``superseded`` (a SETTLED frame), never sent. Roll-ups it refuses
(``rejected``, ``stale``) and defers are counted the same way, so the
engine's ``bigfleet_shard_rollups_total`` still counts every acknowledged
roll-up once.

While the engine process is away (killed, restarting) the edge keeps its
sessions: roll-ups are acknowledged ``rollup-deferred: engine restarting``
and Hellos refused ``UNAVAILABLE`` with a retry hint. When an engine
accepts it again, the edge resends each cluster's last accepted roll-up
(the engine's table starts empty) and relays as before. An edge whose
engine stays away for ``orphan_s`` closes its sessions and ends.

ShardRead (why-not) is served on the same port, by the shard's own
``ShardReadServicer``: it checks the caller (under mutual TLS only
``readonly`` and ``admin``) and the request as a shard without edges does,
then its ``inspect`` asks the engine (an ``INSPECT`` frame) and the
engine's ``Inspection`` comes back as plain values (``INSPECTED``), turned
into the wire's messages by the same code. While the engine is away the
question is refused ``UNAVAILABLE`` (``engine restarting``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from activities.context import BootstrapBlob
from bigfleet.identity import KeyPairSource
from bigfleet.metrics import SESSIONS_SHED
from bigfleet.shard.frames import (
    VERSION,
    EdgeLoad,
    FrameError,
    Kind,
    encode,
    inspection_from_body,
    load_body,
    read_frame,
    rollup_body,
)
from bigfleet.shard.intake import DEFERRED, STALE, Intake
from bigfleet.shard.interpreter import CollectorClock, GcPauses, InterpreterSettings
from bigfleet.shard.server import IngestOptions, IngestServer, TimedSelector
from bigfleet.shard.sessions import (
    ClusterElsewhere,
    NotNow,
    SessionHub,
    SessionLimits,
    SessionUnavailable,
    ShardUnavailable,
)
from bigfleet.shard.shardread import InspectUnavailable
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.model import Need, Rollup
from shard_engine.verdicts import Inspection

log = logging.getLogger(__name__)

__all__ = [
    "RESTARTING",
    "EdgeOptions",
    "EdgeProcess",
    "EdgeSink",
    "EngineLink",
    "main",
]

RESTARTING = "engine restarting"
"""Why roll-ups are deferred while the engine process is away."""


@dataclass(frozen=True)
class EdgeOptions:
    """One edge process's settings."""

    socket: str
    listen: str
    index: int = 0
    limits: SessionLimits = field(default_factory=SessionLimits)
    max_skew_s: float | None = 300.0
    # Ends (closing its sessions) when no engine accepted it for this long.
    orphan_s: float = 120.0
    # Between attempts to reach the engine process.
    retry_s: float = 0.1
    # Between reports of this edge's loop, collector and shed sessions (LOAD frames).
    load_every_s: float = 1.0


class EngineLink:
    """The edge's connection to its engine process, kept up for as long as the edge runs."""

    def __init__(self, options: EdgeOptions, *, hub: SessionHub, intake: Intake) -> None:
        self.options = options
        self.hub = hub
        self.intake = intake
        self.address = ""
        self.stamps = (0, 0)
        self.joins = 0
        self.connected = False
        self._writer: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0  # the loop's thread
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        self._out: list[bytes] = []
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self._admissions: dict[int, asyncio.Future[tuple[str, str, str, str]]] = {}
        self._inspections: dict[int, concurrent.futures.Future[Inspection]] = {}
        self._ids = itertools.count(1)
        self._deferred: dict[str, str] = {}
        # Per cluster, the needs relayed last on this connection (unchanged: no needs sent),
        # and each need's frame values beside the need (see frames.rollup_body).
        self._relayed: dict[str, Any] = {}
        self._memo: dict[str, dict[str, tuple[Need, tuple[Any, ...]]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # What this edge reports of itself (EdgeProcess sets it); None: nothing.
        self.load: Callable[[], EdgeLoad] | None = None
        self._load_at = 0.0

    # -------------------------- called from the servicer (thread-safe all the same)
    def deferral(self, cluster_id: str) -> str:
        """Why the cluster's roll-ups are deferred now ('' when they are not): the Intake asks."""
        if not self.connected:
            return RESTARTING
        return self._deferred.get(cluster_id, "")

    def count(self, outcome: str) -> None:
        """One acknowledged roll-up settled here (any thread); relayed as SETTLED."""
        with self._counts_lock:
            self._counts[outcome] += 1

    def poke(self) -> None:
        """Something waits to be relayed (any thread).

        On the edge's own loop (the servicer's roll-ups, the usual case) the
        relay is woken directly: waking it through the loop's self-pipe would
        cost a write and a read for every roll-up staged into an empty intake.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._thread:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    def note(self, kind: Kind, *body: Any) -> None:
        """Queue a frame for the engine (any thread); dropped while no engine is there."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._queue, encode(kind, body))

    # ----------------------------------------------------- on the edge's loop
    def _queue(self, frame: bytes) -> None:
        if self.connected:
            self._out.append(frame)
            self._wake.set()

    async def admit(self, cluster_id: str) -> None:
        """Ask the engine whether a Hello of ``cluster_id`` may open a session.

        Raises as the shard's own sink does (``ClusterElsewhere``,
        ``PermissionError``, ``ShardUnavailable``), or :class:`NotNow` while
        the engine is away or cannot say now: UNAVAILABLE with a retry hint.
        """
        if not self.connected:
            raise NotNow(f"cluster {cluster_id!r} cannot be admitted now: {RESTARTING}")
        request_id = next(self._ids)
        fut: asyncio.Future[tuple[str, str, str, str]] = asyncio.get_running_loop().create_future()
        self._admissions[request_id] = fut
        self._queue(encode(Kind.ADMIT, (request_id, cluster_id)))
        try:
            verdict, message, shard_id, address = await fut
        finally:
            self._admissions.pop(request_id, None)
        if verdict == "ok":
            return
        if verdict == "elsewhere":
            raise ClusterElsewhere(cluster_id, shard_id, address)
        if verdict == "refused":
            raise PermissionError(message)
        if verdict == "unavailable":
            raise ShardUnavailable(message)
        raise NotNow(message)

    def inspect(self, cluster_id: str, limit: int) -> concurrent.futures.Future[Inspection]:
        """Ask the engine why-not (on the edge's loop): the ShardRead servicer's ``inspect``.

        The answer is the engine's ``Inspection``, rebuilt from an INSPECTED
        frame. It fails with :class:`InspectUnavailable` (UNAVAILABLE) while
        the engine is away or when the link goes before the answer came.
        """
        answer: concurrent.futures.Future[Inspection] = concurrent.futures.Future()
        if not self.connected:
            answer.set_exception(InspectUnavailable(_why_not_now()))
            return answer
        request_id = next(self._ids)
        self._inspections[request_id] = answer
        self._queue(encode(Kind.INSPECT, (request_id, cluster_id, limit)))
        return answer

    async def run(self) -> None:
        """Join the engine, relay, and join again when it goes; until STOP or orphaned."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        alone_since = time.monotonic()
        while not self._stopped.is_set():
            try:
                reader, writer = await asyncio.open_unix_connection(self.options.socket)
            except OSError:
                if time.monotonic() - alone_since > self.options.orphan_s:
                    log.warning("edge %d: no engine for %.0f s; ending", self.options.index,
                                self.options.orphan_s)  # fmt: skip
                    return
                await asyncio.sleep(self.options.retry_s)
                continue
            try:
                await self._session(reader, writer)
            except (FrameError, ConnectionError, asyncio.IncompleteReadError) as err:
                log.warning("edge %d: link to the engine ended: %s", self.options.index, err)
            finally:
                self._lost()
                writer.close()
            alone_since = time.monotonic()

    def forget(self, cluster_id: str) -> None:
        """The cluster's session ended: drop what was kept to encode its roll-ups (any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._memo.pop, cluster_id, None)

    def stop(self) -> None:
        """End the link for good (STOP from the engine, or a signal)."""
        self._stopped.set()
        self._wake.set()
        if self._writer is not None:
            self._writer.close()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode(Kind.JOIN, (VERSION, self.options.index, self.address,
                                        tuple(self.hub.clusters()))))  # fmt: skip
        first = await read_frame(reader)
        if first is None:
            return
        kind, body = first
        if kind is Kind.STOP:  # refused: this edge listens where the engine does not
            log.warning("edge %d: the engine refused this edge (it listens on %s); ending",
                        self.options.index, self.address)  # fmt: skip
            self.stop()
            return
        if kind is not Kind.WELCOME:
            raise FrameError(f"the engine's first frame must be WELCOME, got {kind.name}")
        if body[0] != VERSION:
            raise FrameError(f"engine speaks frame version {body[0]}, this edge {VERSION}")
        self.stamps = (int(body[1]), int(body[2]))
        self._writer = writer
        self._relayed.clear()
        self._memo.clear()
        self._out.clear()
        # A restarted engine starts with an empty table: each cluster's last accepted
        # roll-up goes first (acknowledged and counted before; not counted again).
        for validated in self.intake.accepted():
            self._out.append(
                encode(Kind.ROLLUP, rollup_body(validated, unchanged=False, replay=True))
            )
            self._relayed[validated.cluster_id] = validated.merged
        self.connected = True
        self.joins += 1
        log.info("edge %d joined the engine (%d roll-ups resent)", self.options.index,
                 len(self._out))  # fmt: skip
        relay = asyncio.create_task(self._relay(writer), name="edge-relay")
        try:
            while (frame := await read_frame(reader)) is not None:
                self._dispatch(*frame)
                if self._stopped.is_set():
                    break
        finally:
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay

    def _lost(self) -> None:
        self.connected = False
        self._writer = None
        self._deferred.clear()
        for fut in self._admissions.values():
            if not fut.done():
                fut.set_result(("later", f"cannot admit now: {RESTARTING}", "", ""))
        self._admissions.clear()
        for answer in self._inspections.values():
            if not answer.done():
                answer.set_exception(InspectUnavailable(_why_not_now()))
        self._inspections.clear()

    async def _relay(self, writer: asyncio.StreamWriter) -> None:
        """Write what waits (roll-ups, counts, control frames), then sleep until there is more."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):  # counts go at least this often
                    await self._wake.wait()
            self._wake.clear()
            frames, self._out = self._out, []
            for validated in self.intake.take_all():
                cluster = validated.cluster_id
                unchanged = self._relayed.get(cluster) is validated.merged
                self._relayed[cluster] = validated.merged
                memo = self._memo.setdefault(cluster, {})
                body = rollup_body(validated, unchanged=unchanged, memo=memo)
                frames.append(encode(Kind.ROLLUP, body))
            with self._counts_lock:
                counts, self._counts = self._counts, Counter()
            if counts:
                frames.append(encode(Kind.SETTLED, (tuple(counts.items()),)))
            if self.load is not None and time.monotonic() >= self._load_at:
                self._load_at = time.monotonic() + self.options.load_every_s
                frames.append(encode(Kind.LOAD, load_body(self.load())))
            if frames:
                writer.writelines(frames)
                await writer.drain()

    def _dispatch(self, kind: Kind, body: tuple[Any, ...]) -> None:
        if kind is Kind.SEND:
            cluster_id, data, key = body
            self.hub.send(cluster_id, shard_pb2.ShardMessage.FromString(data), key)
        elif kind is Kind.ADMITTED:
            fut = self._admissions.get(int(body[0]))
            if fut is not None and not fut.done():
                fut.set_result((str(body[1]), str(body[2]), str(body[3]), str(body[4])))
        elif kind is Kind.INSPECTED:
            self._inspected(int(body[0]), body[1], str(body[2]))
        elif kind is Kind.STAMPS:
            self.stamps = (int(body[0]), int(body[1]))
        elif kind is Kind.DEFER:
            cluster_id, why = body
            if why:
                self._deferred[cluster_id] = why
                self._relayed.pop(cluster_id, None)
                self._memo.pop(cluster_id, None)
            else:
                self._deferred.pop(cluster_id, None)
        elif kind is Kind.BOOTSTRAP:
            request_id, cluster_id, data, wait = body
            frame = shard_pb2.ShardMessage.FromString(data)
            task = asyncio.create_task(self._bootstrap(cluster_id, request_id, frame, float(wait)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind is Kind.EVICT:
            cluster_id, shard_id, address = body
            self.hub.evict(cluster_id, ClusterElsewhere(cluster_id, shard_id, address))
        elif kind is Kind.CLOSE_ALL:
            self.hub.close_all(unavailable=body[0])
        elif kind is Kind.STOP:
            log.info("edge %d: the engine stops for good", self.options.index)
            self.stop()
        else:
            raise FrameError(f"an engine does not send {kind.name} frames")

    def _inspected(self, request_id: int, values: Any, error: str) -> None:
        answer = self._inspections.pop(request_id, None)
        if answer is None or answer.done():
            return  # the link went meanwhile, and the question was answered UNAVAILABLE
        if values is None:
            answer.set_exception(RuntimeError(f"the engine could not answer: {error}"))
            return
        try:
            answer.set_result(inspection_from_body(values))
        except FrameError as err:  # a bug on one side: say so, fail the question, keep the link
            log.error("edge %d: %s", self.options.index, err)
            answer.set_exception(err)

    async def _bootstrap(
        self, cluster_id: str, request_id: str, frame: shard_pb2.ShardMessage, wait: float
    ) -> None:
        try:
            blob: BootstrapBlob = await self.hub.ask_bootstrap(
                cluster_id, request_id, frame, wait_seconds=wait
            )
            answer = (request_id, blob.user_data, blob.ttl_seconds, blob.error, "")
        except SessionUnavailable as err:
            answer = (request_id, b"", 0, "", str(err) or "session unavailable")
        self._queue(encode(Kind.BOOTSTRAP_ANSWER, answer))


def _why_not_now() -> str:
    return f"why-not cannot be answered now: {RESTARTING}; retry"


class EdgeSink:
    """The edge's :class:`~bigfleet.shard.sessions.CountingSink`: judge, stage, count."""

    def __init__(self, link: EngineLink, intake: Intake) -> None:
        self._link = link
        self.intake = intake

    async def admit_cluster(self, cluster_id: str) -> None:
        await self._link.admit(cluster_id)

    def apply_rollup(self, rollup: Rollup) -> str:
        """Judge and stage (the servicer calls it); the echo. Raises ``RollupRejected``."""
        echo = self.intake.offer(rollup)
        if echo.startswith(STALE):
            self.settled("stale")
        elif echo.startswith(DEFERRED):
            self.settled("deferred")
        return echo

    def ack_fields(self) -> tuple[int, int]:
        return self._link.stamps

    def settled(self, outcome: str) -> None:
        self._link.count(outcome)


class EdgeProcess:
    """The Session port and its link to the engine, started and stopped together."""

    def __init__(self, options: EdgeOptions, *, tls: KeyPairSource | None = None) -> None:
        self.options = options
        self.hub = SessionHub()
        self.intake = Intake(max_skew_s=options.max_skew_s)
        self.link = EngineLink(options, hub=self.hub, intake=self.intake)
        self.sink = EdgeSink(self.link, self.intake)
        self.intake.set_deferral(self.link.deferral)
        self.intake.set_on_ready(self.link.poke)
        self.intake.set_on_dropped(self.sink.settled)
        self.hub.on_open(lambda cluster_id: self.link.note(Kind.OPENED, cluster_id))
        self.hub.on_close(self._closed)
        # Session, ShardRead (why-not asked of the engine over the link), health and
        # reflection, as on a shard's own port.
        self.server = IngestServer(
            self.hub,
            self.sink,
            IngestOptions(listen=options.listen, limits=options.limits, reuse_port=True),
            tls=tls,
            asked=self.link.inspect,
        )

        self.gc = GcPauses()
        self.link.load = self.report

    def report(self) -> EdgeLoad:
        """This edge's loop, collector and shed sessions, as a LOAD frame tells the engine."""
        lag = self.server.lag
        return EdgeLoad(
            lag_s=lag.value,
            lag_worst_s=lag.take_worst(),
            busy=lag.busy,
            gc_total_s=self.gc.total_s,
            gc_worst_s=self.gc.take_worst(),
            shed=shed_totals(),
        )

    def _closed(self, cluster_id: str) -> None:
        self.link.note(Kind.CLOSED, cluster_id)
        self.intake.forget(cluster_id)
        self.link.forget(cluster_id)

    async def run(self, selector: TimedSelector | None = None) -> None:
        """Serve until the engine says STOP, or no engine came back for ``orphan_s``.

        The Session port and the link share this process's one loop: nothing
        here could delay an ack but the acks themselves (``selector``: the
        loop's, for the busy share).
        """
        self.link.address = await self.server.serve_here(selector)
        log.info("edge %d serving on %s", self.options.index, self.link.address)
        unhook = self.gc.install()
        try:
            await self.link.run()
        finally:
            unhook()
            await self.server.stop(grace=1.0)


def shed_totals() -> tuple[tuple[str, int], ...]:
    """Sessions this process shed since it started, by reason (its own counter's samples)."""
    return tuple(
        (sample.labels["reason"], int(sample.value))
        for metric in SESSIONS_SHED.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bigfleet.edge``: one edge process (the engine process starts these)."""
    from bigfleet.config import Settings

    parser = argparse.ArgumentParser(prog="python -m bigfleet.edge", description=__doc__)
    parser.add_argument("--socket", required=True, help="the engine process's edge socket")
    parser.add_argument("--listen", required=True, help="HOST:PORT shared by the shard's edges")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--max-skew-seconds", type=float, default=300.0)
    parser.add_argument("--orphan-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s edge %(levelname)s %(message)s")
    settings = Settings.from_env()
    tls = KeyPairSource(settings.tls) if settings.tls is not None else None
    options = EdgeOptions(
        socket=args.socket,
        listen=args.listen,
        index=args.index,
        max_skew_s=args.max_skew_seconds,
        orphan_s=args.orphan_seconds,
    )
    edge = EdgeProcess(options, tls=tls)
    # What start-up made is frozen, and the loop collects by the clock, not by
    # Python's count (ADR 0170). The switch interval stays Python's: here only gRPC's
    # poller thread shares the interpreter, and 1 ms did not move the ack tail
    # (docs/benchmarks.md, "Issue 20: the edge's CPU per ack cut by a fifth").
    interpreter = InterpreterSettings(switch_interval_s=None, gc_clock=CollectorClock())
    interpreter.apply()

    selector = TimedSelector()

    async def serve() -> None:
        import signal

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, edge.link.stop)
        loop.add_signal_handler(signal.SIGINT, edge.link.stop)
        loop.call_later(1.0, interpreter.started)
        await edge.run(selector)

    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(selector)) as runner:
        runner.run(serve())
    return 0
