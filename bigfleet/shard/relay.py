"""The engine process's end of the edge link: a hub that relays, and the socket edges join.

    edge processes (bigfleet.edge.process)          engine process (this module)
    ──────────────────────────────────────          ─────────────────────────────────────
    JOIN(index, address, open clusters) ──────────▶ EdgeLink: WELCOME(term, epoch)
    ADMIT(cluster) ───────────────────────────────▶ SessionSink.admit_cluster ─▶ ADMITTED
    ROLLUP(validated needs) ──────────────────────▶ ValidatedRollup.relayed ─▶ Intake.stage
    SETTLED(outcome, n) ──────────────────────────▶ bigfleet_shard_rollups_total
    OPENED / CLOSED(cluster) ─────────────────────▶ RelayHub (which edge holds which cluster)
    INSPECT(cluster, limit) ──────────────────────▶ engine.inspect_needs ─▶ INSPECTED
           ◀── SEND / BOOTSTRAP / EVICT / CLOSE_ALL ── RelayHub (node views, activities, …)
           ◀── STAMPS / DEFER ───────────────────────── acks' fields, clusters leaving

:class:`RelayHub` is the :class:`~bigfleet.shard.sessions.SessionHub` the
shard's parts use when its sessions live in edge processes
(``BIGFLEET_SHARD_EDGES`` > 0): the same methods, each relayed as a frame
to the edge that holds the cluster's session; the outboxes are the edge's.
:class:`EdgeLink` serves the Unix-domain socket the edges join, and starts
the edges that did not rejoin it (an edge outlives an engine process that
was killed, and joins the next one: ADR 0147), and answers the why-not
questions (``ShardRead/InspectNeeds``) the edges are asked, with the
engine's :class:`~shard_engine.verdicts.Inspection` as plain values.

Everything here runs on the shard's loop: no thread of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activities.context import BootstrapBlob
from bigfleet.aio import within
from bigfleet.shard import telemetry
from bigfleet.shard.frames import (
    VERSION,
    EdgeLoad,
    FrameError,
    Kind,
    RelayedRollup,
    encode,
    inspection_body,
    load_from_body,
    read_frame,
    rollup_from_body,
)
from bigfleet.shard.rollups import SessionSink
from bigfleet.shard.sessions import (
    ClusterElsewhere,
    NotNow,
    OperatorSession,
    SessionHub,
    SessionUnavailable,
    ShardUnavailable,
)
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.model import Need, Rollup
from shard_engine.needs import ValidatedRollup
from shard_engine.verdicts import Inspection

log = logging.getLogger(__name__)

__all__ = ["EdgeConnection", "EdgeLink", "RelayHub", "default_socket", "dismissing_edges"]


def default_socket(shard_id: str, listen: str = "") -> str:
    """Where a shard's engine process listens for its edges when no path is configured.

    Named after the shard and its Session port: two processes of one shard on
    one host (a standby beside its primary) listen on different ports, so
    they never take each other's socket.
    """
    name = f"bigfleet-{shard_id}-{_port_of(listen) or 'any'}-{os.getuid()}.edge.sock"
    return str(Path(tempfile.gettempdir()) / name)


class EdgeConnection:
    """One joined edge process, as the engine process writes to it."""

    def __init__(self, writer: asyncio.StreamWriter, *, index: int, address: str) -> None:
        self.writer = writer
        self.index = index
        self.address = address
        self.open = True

    def write(self, kind: Kind, body: tuple[Any, ...]) -> None:
        """Queue a frame (the transport buffers it; nothing here waits)."""
        self.send(encode(kind, body))

    def send(self, frame: bytes) -> None:
        """Queue an encoded frame."""
        if self.open and not self.writer.is_closing():
            self.writer.write(frame)


class RelayHub(SessionHub):
    """The shard's SessionHub when the sessions are in edge processes (see module docstring).

    ``sessions()`` and ``clusters()`` name the sessions the edges reported
    open; each is a stand-in :class:`OperatorSession` (its outbox unused),
    new for every session, so what is keyed by session (capacity hints)
    starts afresh when an operator reconnects.
    """

    def __init__(self) -> None:
        super().__init__()
        self._holders: dict[str, EdgeConnection] = {}
        self._bootstraps: dict[str, asyncio.Future[BootstrapBlob]] = {}

    # -- what the edges report
    def opened_on(self, edge: EdgeConnection, cluster_id: str) -> None:
        """An edge acknowledged the cluster's Hello (or holds its session as it joins)."""
        self._holders[cluster_id] = edge
        self._sessions[cluster_id] = OperatorSession(cluster_id, "")

    def closed_on(self, edge: EdgeConnection, cluster_id: str) -> None:
        if self._holders.get(cluster_id) is edge:
            del self._holders[cluster_id]
            self._sessions.pop(cluster_id, None)

    def detach(self, edge: EdgeConnection) -> None:
        """The edge left: its sessions are out of reach until it joins again."""
        for cluster_id in [c for c, e in self._holders.items() if e is edge]:
            self.closed_on(edge, cluster_id)

    def answer_bootstrap(
        self, request_id: str, blob: BootstrapBlob | None, unavailable: str
    ) -> None:
        fut = self._bootstraps.pop(request_id, None)
        if fut is None or fut.done():
            return
        if blob is None:
            fut.set_exception(SessionUnavailable(unavailable))
        else:
            fut.set_result(blob)

    # -- SessionHub's methods, relayed
    def send(self, cluster_id: str, frame: shard_pb2.ShardMessage, key: str = "") -> bool:
        edge = self._holders.get(cluster_id)
        if edge is None:
            return False
        edge.write(Kind.SEND, (cluster_id, frame.SerializeToString(), key))
        return True

    def push(self, session: OperatorSession, frame: shard_pb2.ShardMessage, key: str = "") -> None:
        if self._sessions.get(session.cluster_id) is session:
            self.send(session.cluster_id, frame, key)

    async def ask_bootstrap(
        self,
        cluster_id: str,
        request_id: str,
        frame: shard_pb2.ShardMessage,
        *,
        wait_seconds: float,
    ) -> BootstrapBlob:
        edge = self._holders.get(cluster_id)
        if edge is None:
            raise SessionUnavailable(f"no session is open for cluster {cluster_id!r}")
        fut: asyncio.Future[BootstrapBlob] = asyncio.get_running_loop().create_future()
        self._bootstraps[request_id] = fut
        edge.write(
            Kind.BOOTSTRAP, (request_id, cluster_id, frame.SerializeToString(), wait_seconds)
        )
        try:
            # The edge waits wait_seconds itself; a little more here covers the way back.
            async with asyncio.timeout(wait_seconds + 5.0):
                return await fut
        except TimeoutError:
            raise SessionUnavailable(
                f"cluster {cluster_id!r} did not answer bootstrap request {request_id} "
                f"within {wait_seconds:g} s"
            ) from None
        finally:
            self._bootstraps.pop(request_id, None)

    def fail_bootstraps(self, why: str) -> None:
        """The engine lost its edges: every bootstrap waiter fails over now."""
        for fut in self._bootstraps.values():
            if not fut.done():
                fut.set_exception(SessionUnavailable(why))
        self._bootstraps.clear()

    def evict(self, cluster_id: str, reason: ClusterElsewhere) -> bool:
        edge = self._holders.get(cluster_id)
        if edge is None:
            return False
        edge.write(Kind.EVICT, (cluster_id, reason.shard_id, reason.address))
        self.closed_on(edge, cluster_id)
        return True

    def close_all(self, *, unavailable: str | None = None) -> None:
        for edge in set(self._holders.values()):
            edge.write(Kind.CLOSE_ALL, (unavailable,))
        self._holders.clear()
        self._sessions.clear()


@dataclass(frozen=True)
class EdgeSpawn:
    """How the engine process starts an edge process that did not rejoin it."""

    listen: str
    max_skew_s: float | None
    orphan_s: float = 120.0


class EdgeLink:
    """The socket a shard's edge processes join, and what the engine does with their frames."""

    def __init__(
        self,
        path: str,
        *,
        hub: RelayHub,
        sink: SessionSink,
        deferral: Callable[[str], str],
        inspect: Callable[[str, int], Inspection],
        stamps_every_s: float = 0.2,
        listen: str = "",
        shard_id: str = "",
    ) -> None:
        self.path = path
        self.shard_id = shard_id
        # Where this shard's Session port is configured to listen: an edge that joins
        # listening on another port is told to stop (see _serve). Port 0 or '': any.
        self.listen = listen
        self.hub = hub
        self.sink = sink
        self._deferral = deferral
        # Why-not asked of an edge (INSPECT): the engine's inspection, the very call the
        # Session port of a shard without edges makes (bigfleet.shard.process).
        self._inspect = inspect
        self._stamps_every_s = stamps_every_s
        self._edges: dict[int, EdgeConnection] = {}
        self._joined = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._children: list[asyncio.subprocess.Process] = []
        # The process last started for each index (the watcher starts a gone edge again).
        self._by_index: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        # Per cluster, the needs relayed last (a frame without needs reuses them), and
        # each need's values beside the need built from them (see rollup_from_body).
        self._last: dict[str, Mapping[str, Need]] = {}
        self._memo: dict[str, dict[str, tuple[tuple[Any, ...], Need]]] = {}
        # Clusters whose roll-ups the edges were told to defer, and why.
        self._deferred: dict[str, str] = {}
        self._stamps = (-1, -1)
        self._stale = False
        self.received = 0
        # Each edge's last report of itself (LOAD), and the reports of the last hour or so
        # with their arrival (monotonic clock) for benchmarks that look at a window.
        self.loads: dict[int, EdgeLoad] = {}
        self.reports: collections.deque[tuple[float, int, EdgeLoad]] = collections.deque(
            maxlen=10_000
        )

    # ------------------------------------------------------------ start, stop
    async def start(self) -> None:
        """Listen on the socket (a stale socket file of a killed engine is replaced)."""
        try:
            os.unlink(self.path)
            # Left by an engine that did not stop cleanly: its edges may still run.
            self._stale = True
        except FileNotFoundError:
            self._stale = False
        self._server = await asyncio.start_unix_server(self._serve, self.path)
        self._spawn_task(self._keep_edges_current(), "edge-stamps")

    def edges(self) -> list[EdgeConnection]:
        """The joined edges, by index."""
        return [self._edges[i] for i in sorted(self._edges)]

    def pids(self) -> list[int]:
        """Process ids of the edges this process started (not of those that rejoined it)."""
        return [child.pid for child in self._children if child.returncode is None]

    async def gather(
        self, count: int, spawn: EdgeSpawn | None, *, rejoin_s: float = 1.5, within_s: float = 60.0
    ) -> str:
        """Wait for ``count`` edges, starting those that do not rejoin within ``rejoin_s``.

        Returns the address they listen on (they share one port). With
        ``spawn`` None nothing is started: the edges are someone else's.
        No edge is waited for when no engine left the socket behind (a clean
        stop removes it; its edges were told to stop).
        """
        deadline = time.monotonic() + (rejoin_s if self._stale or spawn is None else 0.0)
        while len(self._edges) < count and time.monotonic() < deadline:
            await self._wait_join(deadline - time.monotonic())
        if spawn is not None and len(self._edges) < count:
            listen = self._edges[min(self._edges)].address if self._edges else _pinned(spawn.listen)
            for index in range(count):
                if index not in self._edges:
                    await self._start_edge(index, listen, spawn)
        deadline = time.monotonic() + within_s
        while len(self._edges) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(self._edges)} of {count} edge processes joined")
            await self._wait_join(deadline - time.monotonic())
        address = self._edges[min(self._edges)].address
        if spawn is not None:
            self._spawn_task(self._keep_edges_running(count, address, spawn), "edge-watch")
        return address

    async def _keep_edges_running(
        self, count: int, address: str, spawn: EdgeSpawn, *, grace_s: float = 1.5
    ) -> None:
        """Start an edge again when one is gone (it crashed, was killed, or left for good).

        An index missing for ``grace_s`` with no process of ours starting for it
        gets a new edge on the same address (an edge that rejoined from an
        earlier engine, not ours, is given 5 s to come back first: two edges of
        one index would take the link from each other); restarts of one index
        back off from 1 s to 30 s while they keep failing to join.
        """
        missing_since: dict[int, float] = {}
        backoff: dict[int, float] = {}
        next_try: dict[int, float] = {}
        while not self._stopping:
            now = time.monotonic()
            for index in range(count):
                if index in self._edges:
                    missing_since.pop(index, None)
                    if now >= next_try.get(index, 0.0) + 30.0:
                        backoff.pop(index, None)  # joined and stayed: start afresh next time
                    continue
                since = missing_since.setdefault(index, now)
                child = self._by_index.get(index)
                starting = child is not None and child.returncode is None
                if starting and now - since < 10.0:
                    continue  # ours, started and not joined yet (or rejoining)
                grace = grace_s if child is not None else max(grace_s, 5.0)
                if now - since < grace or now < next_try.get(index, 0.0):
                    continue
                if starting and child is not None:
                    child.kill()  # alive but away from the link for 10 s: replace it
                log.warning("edge %d is gone: starting it again", index)
                await self._start_edge(index, address, spawn)
                wait = backoff.get(index, 1.0)
                backoff[index] = min(30.0, wait * 2)
                next_try[index] = now + wait
                missing_since[index] = now
            self._reap()
            await asyncio.sleep(0.25)

    def _reap(self) -> None:
        """Forget the edges this process started that have ended."""
        self._children = [child for child in self._children if child.returncode is None]

    async def _wait_join(self, seconds: float) -> None:
        self._joined.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._joined.wait()

    async def _start_edge(self, index: int, listen: str, spawn: EdgeSpawn) -> None:
        args = [
            sys.executable, "-m", "bigfleet.edge",
            "--socket", self.path,
            "--listen", listen,
            "--index", str(index),
            "--orphan-seconds", str(spawn.orphan_s),
        ]  # fmt: skip
        if spawn.max_skew_s is not None:
            args += ["--max-skew-seconds", str(spawn.max_skew_s)]
        # A session of its own: the edge outlives this process if it is killed (ADR 0147).
        child = await asyncio.create_subprocess_exec(*args, start_new_session=True)
        self._children.append(child)
        self._by_index[index] = child
        log.info("started edge process %d (pid %d) on %s", index, child.pid, listen)

    async def stop(self, *, final: bool = True) -> None:
        """Stop serving the socket; ``final`` also stops the edges (they close their sessions)."""
        self._stopping = True  # no edge is started again from here on
        if final:
            for edge in self._edges.values():
                edge.write(Kind.STOP, ())
                with contextlib.suppress(Exception):
                    await edge.writer.drain()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None
        for edge in list(self._edges.values()):
            edge.open = False
            edge.writer.close()
        self._edges.clear()
        for child in self._children:
            try:
                await within(child.wait(), 10.0)
            except TimeoutError:
                child.kill()
                await child.wait()
        self._children.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _spawn_task(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- frames
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        edge: EdgeConnection | None = None
        try:
            first = await read_frame(reader)
            if first is None:
                return
            kind, body = first
            if kind is not Kind.JOIN:
                raise FrameError(f"the first frame must be JOIN, got {kind.name}")
            version, index, address, clusters = body
            if version != VERSION:
                raise FrameError(f"edge speaks frame version {version}, this engine {VERSION}")
            edge = EdgeConnection(writer, index=int(index), address=str(address))
            wanted = _port_of(self.listen)
            if wanted and _port_of(edge.address) != wanted:
                # An edge of an engine configured otherwise (it outlived that engine, which
                # listened elsewhere): keeping it would serve the old address and never
                # start an edge on this one. It closes its sessions and ends.
                log.warning(
                    "edge %d joined listening on %s, not on this shard's %s: told to stop",
                    edge.index, edge.address, self.listen,
                )  # fmt: skip
                edge.write(Kind.STOP, ())
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                edge = None
                return
            old = self._edges.get(edge.index)
            if old is not None:
                self._drop(old)
            self._edges[edge.index] = edge
            term, epoch = self.sink.ack_fields()
            edge.write(Kind.WELCOME, (VERSION, term, epoch))
            for cluster_id in clusters:
                self.hub.opened_on(edge, cluster_id)
            for cluster_id, why in self._deferred.items():
                edge.write(Kind.DEFER, (cluster_id, why))
            self._joined.set()
            log.info("edge %d joined from %s with %d sessions", edge.index, address, len(clusters))
            while (frame := await read_frame(reader)) is not None:
                self._dispatch(edge, *frame)
        except (FrameError, ValueError, TypeError) as err:
            log.error("edge link: a bad frame ends the edge's link: %s", err)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if edge is not None:
                self._drop(edge)
            writer.close()

    def _drop(self, edge: EdgeConnection) -> None:
        if self._edges.get(edge.index) is edge:
            del self._edges[edge.index]
            log.warning("edge %d left", edge.index)
        edge.open = False
        self.hub.detach(edge)
        if not self._edges:
            self.hub.fail_bootstraps("the shard's edge processes are not connected")

    def _dispatch(self, edge: EdgeConnection, kind: Kind, body: tuple[Any, ...]) -> None:
        if kind is Kind.ROLLUP:
            try:
                relayed = rollup_from_body(body, self._memo.setdefault(str(body[0]), {}))
            except FrameError as err:  # a bug on one side: say so, count it, keep the link
                log.error("edge link: %s", err)
                self.sink.settled("rejected")
                return
            self._rollup(relayed)
        elif kind is Kind.SETTLED:
            for outcome, count in body[0]:
                self.sink.settled(str(outcome), int(count))
        elif kind is Kind.ADMIT:
            self._spawn_task(self._admit(edge, int(body[0]), str(body[1])), "edge-admit")
        elif kind is Kind.OPENED:
            self.hub.opened_on(edge, str(body[0]))
            self.hub.opened(str(body[0]))
        elif kind is Kind.CLOSED:
            self.hub.closed_on(edge, str(body[0]))
        elif kind is Kind.BOOTSTRAP_ANSWER:
            request_id, data, ttl, error, unavailable = body
            blob = None if unavailable else BootstrapBlob(bytes(data), int(ttl), str(error))
            self.hub.answer_bootstrap(str(request_id), blob, str(unavailable))
        elif kind is Kind.INSPECT:
            self._inspected(edge, int(body[0]), str(body[1]), int(body[2]))
        elif kind is Kind.LOAD:
            self._loaded(edge.index, load_from_body(body))
        else:
            raise FrameError(f"an edge does not send {kind.name} frames")

    def _loaded(self, index: int, load: EdgeLoad) -> None:
        """An edge's report of itself: into the shard's metrics, under ``edge-<index>``."""
        self.loads[index] = load
        self.reports.append((time.monotonic(), index, load))
        name = f"edge-{index}"
        telemetry.record_session_loop(self.shard_id, name, lag_s=load.lag_s, busy=load.busy)
        telemetry.record_gc(self.shard_id, name, total_s=load.gc_total_s, worst_s=load.gc_worst_s)
        telemetry.record_shed(self.shard_id, name, load.shed)

    def _rollup(self, relayed: RelayedRollup) -> None:
        self.received += 1
        cluster = relayed.cluster_id
        needs = relayed.needs
        if needs is None:
            needs = self._last.get(cluster)
            if needs is None:  # a bug on one side: say so, count it, keep the link
                log.error("edge link: a roll-up of %s without needs, none relayed before", cluster)
                self.sink.settled("rejected")
                return
        else:
            self._last[cluster] = needs
        rollup = Rollup(
            cluster, relayed.timestamp_ns, tuple(needs.values()), relayed.reported_nodes,
            relayed.release,
        )  # fmt: skip
        validated = ValidatedRollup.relayed(rollup, needs)
        if relayed.replay:
            self.sink.apply(validated, counted=False)
        else:
            self.sink.relayed(validated)

    def _inspected(
        self, edge: EdgeConnection, request_id: int, cluster_id: str, limit: int
    ) -> None:
        """Answer an edge's why-not question, on this loop (where the engine lives).

        The edge validated the caller and the request; what the engine raises
        (or an answer too large for a frame) goes back as the error.
        """
        try:
            answer = inspection_body(self._inspect(cluster_id, limit))
            frame = encode(Kind.INSPECTED, (request_id, answer, ""))
        except Exception as err:
            log.warning("edge %d: why-not of %r not answered: %r", edge.index, cluster_id, err)
            frame = encode(Kind.INSPECTED, (request_id, None, f"{type(err).__name__}: {err}"))
        edge.send(frame)

    async def _admit(self, edge: EdgeConnection, request_id: int, cluster_id: str) -> None:
        verdict, message, shard_id, address = "ok", "", "", ""
        try:
            await self.sink.admit_cluster(cluster_id)
        except ClusterElsewhere as err:
            verdict, message, shard_id, address = "elsewhere", str(err), err.shard_id, err.address
        except PermissionError as err:
            verdict, message = "refused", str(err)
        except ShardUnavailable as err:
            verdict, message = "unavailable", str(err)
        except NotNow as err:
            verdict, message = "later", str(err)
        except Exception as err:
            log.warning("cluster %s: cannot admit now: %r", cluster_id, err)
            verdict = "later"
            message = f"cannot look up the shard of cluster {cluster_id!r} now"
        edge.write(Kind.ADMITTED, (request_id, verdict, message, shard_id, address))

    def departing(self, cluster_id: str) -> None:
        """A cluster starts (or finished) leaving: the edges defer its roll-ups (membership)."""
        why = self._deferral(cluster_id)
        if why:
            self._deferred[cluster_id] = why
            for edge in self._edges.values():
                edge.write(Kind.DEFER, (cluster_id, why))

    async def _keep_edges_current(self) -> None:
        """Tell the edges of new acknowledgement fields and of deferrals that ended."""
        while True:
            stamps = self.sink.ack_fields()
            if stamps != self._stamps:
                self._stamps = stamps
                for edge in self._edges.values():
                    edge.write(Kind.STAMPS, stamps)
            for cluster_id in [c for c in self._deferred if not self._deferral(c)]:
                del self._deferred[cluster_id]
                for edge in self._edges.values():
                    edge.write(Kind.DEFER, (cluster_id, ""))
            await asyncio.sleep(self._stamps_every_s)


@contextlib.asynccontextmanager
async def dismissing_edges(path: str) -> AsyncIterator[list[int]]:
    """Serve a shard's edge socket only to tell each edge that joins it to stop.

    For an engine process configured without edges that finds its Session
    port held: the holder may be an edge that outlived an engine of the same
    shard run with edges, joining again every few tenths of a second until it
    is orphaned (ADR 0147). Told STOP in answer to its JOIN, it closes its
    sessions and its port. Yields the indexes of the edges told so far.
    """
    dismissed: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await read_frame(reader)
            if first is not None and first[0] is Kind.JOIN:
                writer.write(encode(Kind.STOP, ()))
                await writer.drain()
                dismissed.append(int(first[1][1]))
                log.warning("edge %d of an earlier run joined this shard without edges: "
                            "told to stop", first[1][1])  # fmt: skip
        except (FrameError, ValueError, TypeError, IndexError, ConnectionError) as err:
            log.debug("edge socket: a peer that is not a joining edge: %s", err)
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = await asyncio.start_unix_server(serve, path)
    try:
        yield dismissed
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _port_of(listen: str) -> str:
    """The port of ``HOST:PORT`` ('' for port 0 or none): what an edge must listen on."""
    port = listen.rpartition(":")[2]
    return port if port.isdigit() and int(port) != 0 else ""


def _pinned(listen: str) -> str:
    """``listen`` with port 0 replaced by a free port: every edge must bind the same one."""
    host, _, port = listen.rpartition(":")
    if port != "0":
        return listen
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
        s.bind((host.strip("[]"), 0))
        return f"{host}:{s.getsockname()[1]}"
