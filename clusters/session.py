"""The operator side of ``bigfleet.v1alpha1.Shard/Session``, shared by every operator.

    OperatorSession.start()
      loop: dial (ChannelFactory) ── Hello{cluster_id, protocol_version} ──▶ shard
              ack "hello"  ──▶ handler.opened(ack); handler.sending() runs as a task
              other frames ──▶ handler.received(frame), in order
            session ends ──▶ handler.closed(ending); the sending task is cancelled
              ABORTED + bigfleet-shard-address  follow the redirect (the cluster moved)
              UNAVAILABLE                       try the next standby address, if any
            back-off 0.2 s doubling to 5 s (reset after a session that ended cleanly
            or a redirect)

What an operator does with the frames is its own business: the simulated
cluster (``clusters.operator``) and the Nanook adapter (``nanook.session``)
are handlers of this one client, so the reconnect loop, the redirect, the
protocol version and the request stream's clean-up exist once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol, cast

import grpc

from bigfleet.v1alpha1 import shard_pb2, shard_pb2_grpc

log = logging.getLogger(__name__)

__all__ = [
    "PROTOCOL_VERSION",
    "REDIRECT_KEY",
    "ChannelFactory",
    "OperatorSession",
    "SessionHandler",
    "insecure_channel",
    "redirect_of",
]

PROTOCOL_VERSION = "bigfleet.v1alpha1"
"""What Hello says it speaks (the Go reference's package name)."""

REDIRECT_KEY = "bigfleet-shard-address"
"""Trailing metadata of an ``ABORTED`` session end: the cluster's shard now."""

ChannelFactory = Callable[[str], grpc.aio.Channel]
"""Opens the channel to a shard address: the one place transport security goes."""

_INITIAL_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel (loopback, tests, and deployments before mTLS)."""
    return grpc.aio.insecure_channel(address)


def redirect_of(err: grpc.aio.AioRpcError) -> str:
    """The address a shard told us to reconnect to (trailing metadata), or ''."""
    if err.code() != grpc.StatusCode.ABORTED:
        return ""
    pairs = cast("Iterable[tuple[str, str | bytes]]", err.trailing_metadata() or ())
    value = dict(pairs).get(REDIRECT_KEY, "")
    return value if isinstance(value, str) else ""


class SessionHandler(Protocol):
    """What an operator does on its sessions (see the module docstring for when each runs)."""

    def opened(self, ack: shard_pb2.Acknowledgement) -> None:
        """The shard acknowledged Hello: the session is established."""
        ...

    async def sending(self) -> None:
        """What the operator sends on its own while the session lasts (roll-ups).

        Runs as a task from :meth:`opened` until the session ends (then cancelled).
        """
        ...

    async def received(self, frame: shard_pb2.ShardMessage) -> None:
        """Every frame of the session after Hello's acknowledgement, in order."""
        ...

    def closed(self, ending: str) -> None:
        """The session is over: '' after a clean end, else what ended it (a status name)."""
        ...


class OperatorSession:
    """One cluster's Shard/Session client: dial, Hello, reconnect, follow redirects."""

    def __init__(
        self,
        cluster_id: str,
        shard_address: str,
        handler: SessionHandler,
        *,
        channel_factory: ChannelFactory = insecure_channel,
        standbys: Sequence[str] = (),
        label: str = "cluster",
    ) -> None:
        self.cluster_id = cluster_id
        # Where the next session dials: the redirect's address once a shard named one.
        self.shard_address = shard_address
        self.handler = handler
        self.channel_factory = channel_factory
        # The shard's other processes (a standby for its lease): a session ending
        # UNAVAILABLE (the process stopped acting, or is gone) tries the next one,
        # as an operator behind a service address would reach them.
        self._addresses = [shard_address, *[a for a in standbys if a != shard_address]]
        self.label = label
        # Shard addresses this operator was redirected to (its cluster moved shard).
        self.redirects: list[str] = []
        # How each session ended (gRPC status code names), oldest first.
        self.endings: list[str] = []
        # Sessions the shard acknowledged.
        self.sessions = 0
        self._outbox: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._call: (
            grpc.aio.StreamStreamCall[shard_pb2.OperatorMessage, shard_pb2.ShardMessage] | None
        ) = None

    def start(self) -> None:
        """Keep a session open until :meth:`stop`."""
        self._task = asyncio.create_task(
            self._run_forever(), name=f"{self.label}-{self.cluster_id}"
        )

    async def stop(self) -> None:
        """End the session and stop reconnecting (``start`` may be called again)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def drop(self) -> None:
        """End the current session; the loop reconnects (simulates a broken stream)."""
        if self._call is not None:
            self._call.cancel()

    async def send(self, message: shard_pb2.OperatorMessage) -> None:
        """Queue ``message`` on the current session's request stream."""
        await self._outbox.put(message)

    # ----------------------------------------------------------------- internals

    async def _run_forever(self) -> None:
        backoff = _INITIAL_BACKOFF_S
        while True:
            ending = ""
            try:
                await self._session()
                backoff = _INITIAL_BACKOFF_S
            except grpc.aio.AioRpcError as err:
                ending = err.code().name
                log.info("%s %s: session ended: %s", self.label, self.cluster_id, ending)
                self.endings.append(ending)
                if (
                    err.code() == grpc.StatusCode.UNAVAILABLE
                    and self.shard_address in self._addresses
                ):
                    at = self._addresses.index(self.shard_address)
                    self.shard_address = self._addresses[(at + 1) % len(self._addresses)]
                moved_to = redirect_of(err)
                if moved_to and moved_to != self.shard_address:
                    log.info(
                        "%s %s: now served at %s; reconnecting",
                        self.label,
                        self.cluster_id,
                        moved_to,
                    )
                    self.shard_address = moved_to
                    self.redirects.append(moved_to)
                    backoff = _INITIAL_BACKOFF_S
            except (OSError, asyncio.InvalidStateError) as err:
                ending = type(err).__name__
                log.warning("%s %s: session failed: %s", self.label, self.cluster_id, err)
            except asyncio.CancelledError:
                # drop() cancels the call, and gRPC raises CancelledError in its reader;
                # only a cancellation of this task (stop) ends the loop.
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                ending = grpc.StatusCode.CANCELLED.name
                self.endings.append(ending)
                log.info("%s %s: session dropped", self.label, self.cluster_id)
            finally:
                self._call = None
                self.handler.closed(ending)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _requests(
        self, outbox: asyncio.Queue[shard_pb2.OperatorMessage | None]
    ) -> AsyncIterator[shard_pb2.OperatorMessage]:
        yield shard_pb2.OperatorMessage(
            hello=shard_pb2.Hello(cluster_id=self.cluster_id, protocol_version=PROTOCOL_VERSION)
        )
        while True:
            msg = await outbox.get()
            if msg is None:
                return
            yield msg

    async def _session(self) -> None:
        outbox: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self._outbox = outbox
        async with self.channel_factory(self.shard_address) as channel:
            stub = shard_pb2_grpc.ShardStub(channel)
            call = stub.Session(self._requests(outbox))
            self._call = call
            sender: asyncio.Task[None] | None = None
            try:
                async for frame in call:
                    if (
                        sender is None
                        and frame.WhichOneof("payload") == "ack"
                        and frame.ack.echo == "hello"
                    ):
                        self.sessions += 1
                        self.handler.opened(frame.ack)
                        sender = asyncio.create_task(
                            self.handler.sending(), name=f"{self.label}-send-{self.cluster_id}"
                        )
                    else:
                        await self.handler.received(frame)
            finally:
                if sender is not None:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sender
                # End this session's request stream. A call the shard ended is not
                # cancelled by closing the channel, so gRPC's task that feeds it from
                # _requests() would wait on this queue for ever (one task per session).
                outbox.put_nowait(None)
