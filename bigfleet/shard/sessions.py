"""Operator sessions: the ``bigfleet.v1alpha1.Shard/Session`` stream and what rides on it.

One :class:`OperatorSession` per connected cluster. The servicer is thin: it checks
the Hello, converts roll-ups at the edge and hands them to a
:class:`RollupSink`; the :class:`SessionHub` lets the rest of the shard send
frames to a cluster (node state updates) and pull bootstrap blobs from it.

The sessions may run on their own thread and event loop (``bigfleet.shard.server``)
while the rest of the shard runs on another: the hub's methods can be called
from either thread, and hand work to the sessions' loop when needed.

Overload is explicit (``SessionLimits``): a Hello beyond ``max_sessions`` or
while the sessions' loop is saturated, a session sending roll-ups faster than
its rate limit, one whose operator stops reading its acknowledgements, and a
roll-up arriving while the loop is behind by more than ``shed_lag_s`` end with
RESOURCE_EXHAUSTED and a retry hint (trailing metadata
``bigfleet-retry-after-ms``, and in the message).

A backlog is superseded, not worked through (ADR 0146): while the sessions'
loop runs behind (``supersede_lag_s``), each session's reader keeps only the
newest roll-up it has read and not yet had checked; one checker task checks
it and acknowledges the older ones ``rollup-superseded``, in order, without
looking at them. While calm, a roll-up is checked as soon as it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import grpc
from google.protobuf.message import DecodeError

from activities.context import BootstrapBlob
from bigfleet.identity import Guard, Role
from bigfleet.metrics import SESSIONS_SHED
from bigfleet.shard.convert import (
    InvalidRollup,
    requirements_to_wire,
    rollup_from_wire,
    wire_field,
)
from bigfleet.v1alpha1 import shard_pb2, shard_pb2_grpc
from shard_engine.model import Need, Rollup
from shard_engine.names import cluster_id_problem, shown
from shard_engine.needs import RollupRejected
from workflows.contracts import RequirementSpec

log = logging.getLogger(__name__)

SESSION_EXTENSIONS = ("release", "do-not-disrupt", "gang-name")
"""Wire extensions this shard honours, listed on the Hello acknowledgement (ADR 0070)."""

__all__ = [
    "RETRY_AFTER_KEY",
    "SESSION_EXTENSIONS",
    "SHARD_SERVICE",
    "SUPERSEDED",
    "ClusterElsewhere",
    "CountingSink",
    "NotNow",
    "OperatorSession",
    "Outbox",
    "RollupSink",
    "SessionHub",
    "SessionLimits",
    "SessionUnavailable",
    "ShardServicer",
    "ShardUnavailable",
]


class SessionUnavailable(RuntimeError):
    """No session is open for the cluster, or it closed while we waited. Retryable."""


class ShardUnavailable(RuntimeError):
    """This process may not serve now (it cannot prove it holds its shard's lease).

    The session ends (or is refused) with ``UNAVAILABLE`` so the operator
    reconnects, reaching whichever process holds the lease next.
    """


class NotNow(RuntimeError):
    """The cluster cannot be admitted now, for a passing reason (the message says which).

    The Hello is refused ``UNAVAILABLE`` with a retry hint, as when the store
    does not answer; an edge process raises it while its engine process
    restarts (ADR 0147).
    """


class ClusterElsewhere(PermissionError):
    """The cluster is served by another shard: the operator should reconnect there.

    The session ends with ``ABORTED`` and this message; the new shard and its
    address also ride in the trailing metadata (``bigfleet-shard``,
    ``bigfleet-shard-address``) so an operator can follow without parsing text.
    """

    def __init__(self, cluster_id: str, shard_id: str, address: str = "") -> None:
        self.cluster_id, self.shard_id, self.address = cluster_id, shard_id, address
        where = f" at {address}" if address else ""
        super().__init__(
            f"cluster {cluster_id!r} is served by shard {shard_id!r}{where}; reconnect there"
        )

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("bigfleet-shard", self.shard_id), ("bigfleet-shard-address", self.address))


class RollupSink(Protocol):
    """Where validated roll-ups go (the shard process)."""

    async def admit_cluster(self, cluster_id: str) -> None:
        """Raise ``PermissionError`` (with a reason) if this shard must not serve the cluster."""

    def apply_rollup(self, rollup: Rollup) -> str:
        """Apply a roll-up; return the acknowledgement echo ("rollup", "rollup-stale", ...)."""

    def ack_fields(self) -> tuple[int, int]:
        """(coordinator_term, shard_epoch) to stamp on acknowledgements."""


@runtime_checkable
class CountingSink(RollupSink, Protocol):
    """A sink that counts every acknowledged roll-up's outcome (the shard process's).

    The servicer tells it of the refusals made before the sink saw the
    roll-up (one that does not translate) and of those the sink raised.
    """

    def settled(self, outcome: str) -> None:
        """One acknowledged roll-up ended with ``outcome`` (``rejected``)."""


#: The roll-up checker's longest run before it lets the readers read on (seconds).
CHECK_SLICE_S = 0.0005


class Outbox:
    """An ordered queue of frames to one operator that coalesces by ``supersedes_key``.

    A frame with a key replaces an older, not yet sent frame with the same key
    (in place, keeping the older frame's position); frames without a key are
    never dropped.
    """

    def __init__(self) -> None:
        self._frames: OrderedDict[str, shard_pb2.ShardMessage] = OrderedDict()
        self._ready = asyncio.Event()
        self._counter = 0
        self.closed = False

    def put(self, frame: shard_pb2.ShardMessage, key: str = "") -> None:
        if not key:
            self._counter += 1
            key = f"\x00{self._counter}"
        self._frames[key] = frame
        self._ready.set()

    async def get(self) -> shard_pb2.ShardMessage | None:
        """Next frame, or None once the outbox is closed and empty."""
        while not self._frames:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        _, frame = self._frames.popitem(last=False)
        return frame

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def __len__(self) -> int:
        return len(self._frames)


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = float(burst)
        self.last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class OperatorSession:
    """One operator's live stream."""

    def __init__(self, cluster_id: str, protocol_version: str) -> None:
        self.cluster_id = cluster_id
        self.protocol_version = protocol_version
        self.outbox = Outbox()
        # Bootstrap requests waiting for an answer, with the loop each waiter runs on.
        self.pending: dict[
            str, tuple[asyncio.Future[BootstrapBlob], asyncio.AbstractEventLoop]
        ] = {}
        # Set when the cluster moved away: the stream ends with this error.
        self.evicted: ClusterElsewhere | None = None
        # The previous roll-up's needs by wire bytes (see convert.rollup_from_wire).
        self.known: dict[bytes, Need] = {}
        # Set when the session is shed: (reason, detail); it ends with RESOURCE_EXHAUSTED.
        self.shed: tuple[str, str] | None = None
        # Set when this process stopped acting: the stream ends UNAVAILABLE with it.
        self.unavailable: str | None = None
        # The session's roll-up rate limit (set by the servicer from SessionLimits).
        self.rate = TokenBucket(float("inf"), 1)
        # Set when the operator sent a frame that does not decode: the stream
        # ends with INVALID_ARGUMENT and this reason.
        self.undecodable: str | None = None
        # The newest roll-up read and not yet checked, and how many older ones it
        # replaced meanwhile (each is acknowledged ``rollup-superseded``).
        self.latest: shard_pb2.OperatorMessage | None = None
        self.skipped = 0

    def hold(self, msg: shard_pb2.OperatorMessage) -> bool:
        """Keep ``msg`` as the newest unchecked roll-up; True if the session was idle."""
        idle = self.latest is None
        if not idle:
            self.skipped += 1
        self.latest = msg
        return idle

    def take(self) -> tuple[shard_pb2.OperatorMessage | None, int]:
        """The newest unchecked roll-up and how many it replaced; the session is idle after."""
        msg, skipped = self.latest, self.skipped
        self.latest, self.skipped = None, 0
        return msg, skipped

    def resolve_bootstrap(self, resp: shard_pb2.BootstrapBlobResponse) -> bool:
        waiting = self.pending.pop(resp.request_id, None)
        if waiting is None:
            return False
        error = resp.error if len(resp.error) <= 1024 else resp.error[:1023] + "…"
        blob = BootstrapBlob(bytes(resp.user_data), int(resp.ttl_seconds), error)
        _settle(waiting, result=blob)
        return True

    def close(self) -> None:
        self.outbox.close()
        for waiting in list(self.pending.values()):
            _settle(waiting, error=SessionUnavailable(f"session of {self.cluster_id} closed"))
        self.pending.clear()


def _settle(
    waiting: tuple[asyncio.Future[BootstrapBlob], asyncio.AbstractEventLoop],
    *,
    result: BootstrapBlob | None = None,
    error: BaseException | None = None,
) -> None:
    """Complete a waiter on its own loop, whichever thread we are on."""
    fut, loop = waiting

    def settle() -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    if loop.is_closed():
        return
    loop.call_soon_threadsafe(settle)


class SessionHub:
    """All open sessions of this shard, by cluster.

    The sessions live on one event loop (``bind``); every method may be
    called from any thread, and what must run on the sessions' loop is handed
    to it.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, OperatorSession] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._open_listeners: list[Callable[[str], None]] = []
        self._close_listeners: list[Callable[[str], None]] = []

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop (and its thread) the sessions run on; call from that thread."""
        self._loop, self._thread = loop, threading.get_ident()

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._loop is None or self._thread == threading.get_ident():
            fn(*args)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, cluster_id: str, protocol_version: str) -> OperatorSession:
        """Register a new session; a newer session for the same cluster replaces the old one."""
        old = self._sessions.get(cluster_id)
        if old is not None:
            log.info("cluster %s reconnected; closing its previous session", cluster_id)
            old.close()
        session = OperatorSession(cluster_id, protocol_version)
        self._sessions[cluster_id] = session
        return session

    def on_open(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(cluster_id)`` after every Hello is acknowledged (on the
        sessions' thread): the shard answers it with the cluster's node states."""
        self._open_listeners.append(listener)

    def opened(self, cluster_id: str) -> None:
        """A session's Hello was just acknowledged: tell the listeners."""
        for listener in self._open_listeners:
            try:
                listener(cluster_id)
            except Exception:
                log.exception("cluster %s: a session-open listener failed", cluster_id)

    def on_close(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(cluster_id)`` when a cluster's session ends (not when a newer
        session of the cluster replaced it); on the sessions' thread."""
        self._close_listeners.append(listener)

    def close(self, session: OperatorSession) -> None:
        ended = self._sessions.get(session.cluster_id) is session
        if ended:
            del self._sessions[session.cluster_id]
        session.close()
        if ended:
            for listener in self._close_listeners:
                try:
                    listener(session.cluster_id)
                except Exception:
                    log.exception("cluster %s: a session-close listener failed", session.cluster_id)

    def session(self, cluster_id: str) -> OperatorSession | None:
        """The cluster's open session, if it has one."""
        return self._sessions.get(cluster_id)

    def evict(self, cluster_id: str, reason: ClusterElsewhere) -> bool:
        """End a cluster's session with ``reason`` (it moved to another shard)."""
        session = self._sessions.get(cluster_id)
        if session is None:
            return False
        session.evicted = reason
        self._on_loop(self.close, session)
        return True

    def close_all(self, *, unavailable: str | None = None) -> None:
        """Close every session; with ``unavailable`` each stream ends UNAVAILABLE with it."""
        for session in list(self._sessions.values()):
            session.unavailable = unavailable
            self._on_loop(self.close, session)

    def clusters(self) -> list[str]:
        return sorted(self._sessions)

    def sessions(self) -> list[OperatorSession]:
        """The open sessions (one per connected cluster)."""
        return list(self._sessions.values())

    def send(self, cluster_id: str, frame: shard_pb2.ShardMessage, key: str = "") -> bool:
        """Queue a frame for a cluster; False if it has no open session."""
        session = self._sessions.get(cluster_id)
        if session is None:
            return False
        self._on_loop(session.outbox.put, frame, key)
        return True

    def push(self, session: OperatorSession, frame: shard_pb2.ShardMessage, key: str = "") -> None:
        """Queue a frame on one session, from any thread (its outbox is the sessions' loop's)."""
        self._on_loop(session.outbox.put, frame, key)

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        """Ask the cluster's operator for a bootstrap blob and wait for the matching answer."""
        request_id = secrets.token_hex(12)
        frame = shard_pb2.ShardMessage(
            bootstrap_request=shard_pb2.BootstrapRequest(
                request_id=request_id,
                requirements=requirements_to_wire(requirements),
                cluster_id=cluster_id,
            )
        )
        return await self.ask_bootstrap(cluster_id, request_id, frame, wait_seconds=wait_seconds)

    async def ask_bootstrap(
        self,
        cluster_id: str,
        request_id: str,
        frame: shard_pb2.ShardMessage,
        *,
        wait_seconds: float,
    ) -> BootstrapBlob:
        """Send a ready ``BootstrapRequest`` frame and wait for the answer to ``request_id``."""
        session = self._sessions.get(cluster_id)
        if session is None:
            raise SessionUnavailable(f"no session is open for cluster {cluster_id!r}")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[BootstrapBlob] = loop.create_future()
        session.pending[request_id] = (fut, loop)
        self._on_loop(session.outbox.put, frame)
        try:
            async with asyncio.timeout(wait_seconds):
                return await fut
        except TimeoutError:
            raise SessionUnavailable(
                f"cluster {cluster_id!r} did not answer bootstrap request {request_id} "
                f"within {wait_seconds:g} s"
            ) from None
        finally:
            session.pending.pop(request_id, None)


SHARD_SERVICE = "bigfleet.v1alpha1.Shard"

#: Trailing metadata key of the retry hint sent with RESOURCE_EXHAUSTED.
RETRY_AFTER_KEY = "bigfleet-retry-after-ms"

#: The echo of a roll-up that a newer one from the same cluster replaced before it was checked.
SUPERSEDED = "rollup-superseded"


@dataclass(frozen=True)
class SessionLimits:
    """When the shard says RESOURCE_EXHAUSTED instead of taking more."""

    # Open sessions at most; a Hello beyond is refused.
    max_sessions: int = 25_000
    # Frames queued for one operator that it has not read; beyond, its session ends.
    max_outbox: int = 1_000
    # The sessions' loop running this far behind sheds new Hellos and arriving roll-ups.
    shed_lag_s: float = 0.5
    # The sessions' loop busy this share of the last second sheds new Hellos.
    shed_busy: float = 0.95
    # The sessions' loop this far behind (or roll-ups already waiting): a roll-up is
    # queued for the checker, where a newer one of its cluster may supersede it,
    # instead of being checked at once (ADR 0146). Checking at once is a turn of the
    # loop cheaper (~200 us a roll-up in the closed loop), so it is the calm path.
    supersede_lag_s: float = 0.02
    # One cluster's roll-ups: this many per second on average, bursts of rollup_burst.
    # Generous beside the paper's one per ten seconds; it keeps one flooding operator
    # from taking the shard's ingestion for itself.
    max_rollups_per_s: float = 50.0
    rollup_burst: int = 100
    # The retry hint: a random delay in this range (spreads the reconnections out).
    retry_after_s: tuple[float, float] = (2.0, 10.0)

    def retry_after_ms(self) -> int:
        low, high = self.retry_after_s
        return int(1000 * random.uniform(low, high))


class ShardServicer(shard_pb2_grpc.ShardServicer):
    """``Shard/Session``: Hello first, then roll-ups, bootstrap answers and reclaim acks.

    Under mutual TLS the Hello is checked against the caller's certificate: a
    ``cluster/<id>`` identity may open a session only as ``<id>`` (and every
    roll-up must name the session's cluster), ``admin`` as any cluster;
    anything else ends with PERMISSION_DENIED before the session opens.
    """

    def __init__(
        self,
        hub: SessionHub,
        sink: RollupSink,
        *,
        limits: SessionLimits | None = None,
        lag: Callable[[], float] = lambda: 0.0,
        busy: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._hub = hub
        self._sink = sink
        self._guard = Guard(SHARD_SERVICE)
        self._limits = limits or SessionLimits()
        # How far the sessions' event loop runs behind, in seconds (see server.LoopLag).
        self._lag = lag
        # Share of the last second the sessions' loop was busy (see server.LoopLoad).
        self._busy = busy
        # Sessions holding a roll-up read but not yet checked, oldest first, and the
        # one task (on the sessions' loop) that checks them while there are any:
        # see _check_rollups.
        self._ready: OrderedDict[int, OperatorSession] = OrderedDict()
        self._checker: asyncio.Task[None] | None = None

    async def _shed(self, context: Any, reason: str, detail: str) -> None:
        """End the call with RESOURCE_EXHAUSTED and a retry hint."""
        SESSIONS_SHED.labels(reason).inc()
        retry_ms = self._limits.retry_after_ms()
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(retry_ms)),))
        await context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"{detail}; retry after {retry_ms} ms"
        )

    def _ack(self, echo: str, *, extensions: Sequence[str] = ()) -> shard_pb2.ShardMessage:
        term, epoch = self._sink.ack_fields()
        return shard_pb2.ShardMessage(
            ack=shard_pb2.Acknowledgement(
                echo=echo, coordinator_term=term, shard_epoch=epoch, extensions=extensions
            )
        )

    async def Session(
        self,
        request_iterator: AsyncIterator[shard_pb2.OperatorMessage],
        context: grpc.aio.ServicerContext[shard_pb2.OperatorMessage, shard_pb2.ShardMessage],
    ) -> AsyncIterator[shard_pb2.ShardMessage]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except DecodeError as err:
            log.warning("session refused: the first frame does not decode: %s", err)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the first frame does not decode: {err}"
            )
        if first.WhichOneof("payload") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first frame must be Hello")
        problem = hello_problem(first.hello)
        if problem is not None:
            log.warning("session refused: %s", problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        cluster_id = first.hello.cluster_id
        await self._guard.authorize(context, {Role.CLUSTER}, name=cluster_id)
        if len(self._hub) >= self._limits.max_sessions:
            await self._shed(
                context, "sessions", f"this shard holds {len(self._hub)} sessions, its limit"
            )
        if self._lag() > self._limits.shed_lag_s or self._busy() > self._limits.shed_busy:
            await self._shed(context, "overload", "this shard is overloaded")
        try:
            await self._sink.admit_cluster(cluster_id)
        except PermissionError as err:
            if isinstance(err, ClusterElsewhere):
                context.set_trailing_metadata(err.trailing_metadata())
            await context.abort(grpc.StatusCode.ABORTED, str(err))
        except ShardUnavailable as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except NotNow as err:
            retry_ms = self._limits.retry_after_ms()
            context.set_trailing_metadata(((RETRY_AFTER_KEY, str(retry_ms)),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{err}; retry after {retry_ms} ms")
        except Exception as err:  # the store did not answer: retryable, say when
            log.warning("cluster %s: cannot admit now: %r", cluster_id, err)
            retry_ms = self._limits.retry_after_ms()
            context.set_trailing_metadata(((RETRY_AFTER_KEY, str(retry_ms)),))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot look up the shard of cluster {cluster_id!r} now; "
                f"retry after {retry_ms} ms",
            )
        session = self._hub.open(cluster_id, first.hello.protocol_version)
        session.rate = TokenBucket(self._limits.max_rollups_per_s, self._limits.rollup_burst)
        log.debug("session opened for cluster %s", cluster_id)
        session.outbox.put(self._ack("hello", extensions=SESSION_EXTENSIONS))
        self._hub.opened(cluster_id)
        reader = asyncio.create_task(self._read(session, request_iterator))
        try:
            while True:
                frame = await session.outbox.get()
                if frame is None:
                    break
                yield frame
            if session.evicted is not None:
                context.set_trailing_metadata(session.evicted.trailing_metadata())
                await context.abort(grpc.StatusCode.ABORTED, str(session.evicted))
            if session.shed is not None:
                await self._shed(context, *session.shed)
            if session.unavailable is not None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, session.unavailable)
            if session.undecodable is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.undecodable)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._hub.close(session)
            log.debug("session closed for cluster %s", cluster_id)

    async def _read(
        self, session: OperatorSession, request_iterator: AsyncIterator[shard_pb2.OperatorMessage]
    ) -> None:
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("payload")
                if kind == "rollup":
                    if self._lag() > self._limits.shed_lag_s:
                        session.shed = ("overload", "this shard is overloaded")
                        break
                    if not session.rate.take():
                        session.shed = (
                            "rate",
                            f"cluster {session.cluster_id} sends more than "
                            f"{self._limits.max_rollups_per_s:g} roll-ups/s",
                        )
                        break
                    if len(session.outbox) >= self._limits.max_outbox:
                        session.shed = (
                            "slow-reader",
                            f"{len(session.outbox)} frames are waiting to be read",
                        )
                        break
                    if (
                        session.latest is None
                        and not self._ready
                        and self._lag() < self._limits.supersede_lag_s
                    ):
                        # Calm: nothing waits, so nothing could supersede it.
                        session.outbox.put(self._ack(self._rollup(session, msg)))
                    # Busy: checked by _check_rollups; a newer roll-up read before
                    # that replaces this one, which is then acknowledged superseded.
                    elif session.hold(msg):
                        self._ready[id(session)] = session
                        if self._checker is None or self._checker.done():
                            self._checker = asyncio.create_task(
                                self._check_rollups(), name="session-rollups"
                            )
                elif kind == "bootstrap_response":
                    if not session.resolve_bootstrap(msg.bootstrap_response):
                        log.warning(
                            "cluster %s answered unknown bootstrap request %s",
                            session.cluster_id,
                            shown(msg.bootstrap_response.request_id),
                        )
                elif kind == "reclaim_ack":
                    log.info(
                        "cluster %s started draining %d nodes for %s",
                        session.cluster_id,
                        msg.reclaim_ack.nodes_started,
                        shown(msg.reclaim_ack.instruction_id),
                    )
                elif kind == "hello":
                    self._ready.pop(id(session), None)
                    self._answer(session)  # acks keep the order of what they answer
                    session.outbox.put(self._ack("hello-ignored: session already open"))
        except grpc.aio.AioRpcError:
            pass
        except DecodeError as err:
            session.undecodable = f"a frame does not decode: {err}"
            log.warning("cluster %s: session ended: %s", session.cluster_id, session.undecodable)
        finally:
            # A roll-up read but not yet checked is answered before the stream ends.
            self._ready.pop(id(session), None)
            self._answer(session)
            session.outbox.close()

    async def _check_rollups(self) -> None:
        """Check the newest roll-up of each session that has one, oldest first, until none has.

        Readers only keep each session's newest roll-up (``OperatorSession.hold``);
        this one task translates, validates and acknowledges it, and acknowledges
        the ones it replaced as ``rollup-superseded`` (counted as such) without
        looking at them. While the shard keeps up, a session holds at most one
        roll-up and nothing is superseded; under overload a cluster's backlog
        is never worked through — only its newest roll-up is — so the work ends
        when the load does, and memory is one frame per session (issue 20).
        It yields to the readers after at most ``CHECK_SLICE_S`` of work (a
        few roll-ups; yielding after each cost a pass of the loop, a poll of
        its selector included, per roll-up) so they read on meanwhile, and
        ends when no session holds one (a reader starts it again), so no task
        outlives the work.
        """
        clock = time.perf_counter
        since = clock()
        while self._ready:
            _, session = self._ready.popitem(last=False)
            try:
                self._answer(session)
            except Exception:  # one session's failure must not stop the others' acks
                log.exception("cluster %s: checking a roll-up failed", session.cluster_id)
            if clock() - since >= CHECK_SLICE_S:
                await asyncio.sleep(0)
                since = clock()

    def _answer(self, session: OperatorSession) -> None:
        """Acknowledge the session's held roll-up (checked) and those it replaced (superseded)."""
        msg, skipped = session.take()
        if session.outbox.closed:
            return
        if skipped:
            for _ in range(skipped):
                session.outbox.put(self._ack(f"{SUPERSEDED}: a newer roll-up replaced it"))
            if isinstance(self._sink, CountingSink):
                for _ in range(skipped):
                    self._sink.settled("superseded")
        if msg is not None:
            session.outbox.put(self._ack(self._rollup(session, msg)))

    def stop(self) -> None:
        """Stop the roll-up checker (the server has stopped; call on the sessions' loop)."""
        if self._checker is not None:
            self._checker.cancel()
            self._checker = None

    def _rollup(self, session: OperatorSession, msg: shard_pb2.OperatorMessage) -> str:
        try:
            rollup = rollup_from_wire(
                msg.rollup, session_cluster=session.cluster_id, known=session.known
            )
            return self._sink.apply_rollup(rollup)
        except (InvalidRollup, RollupRejected) as err:
            reason = f"{wire_field(err.field)}: {err.reason}"
        except ValueError as err:
            reason = str(err)
        log.warning("cluster %s: roll-up rejected: %s", session.cluster_id, reason)
        if isinstance(self._sink, CountingSink):
            self._sink.settled("rejected")
        return f"rollup-rejected: {reason}"


def hello_problem(hello: shard_pb2.Hello) -> str | None:
    """Why a Hello cannot open a session (naming the field), or None.

    The cluster id must be a DNS-1123 subdomain (``shard_engine.names``): it
    becomes a database key, a log label and a certificate SAN.
    """
    problem = cluster_id_problem(hello.cluster_id)
    if problem is not None:
        return f"hello.cluster_id: {problem}"
    version = hello.protocol_version
    if len(version) > 64 or not (version.isascii() and version.isprintable()):
        return f"hello.protocol_version: {shown(version)} is not at most 64 printable characters"
    return None
