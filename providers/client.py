"""An asyncio client for any server speaking bigfleet.v1alpha1.CapacityProvider
(ours, or any provider written for the Go reference).

Every method returns the wire message and raises only the
`providers.errors` vocabulary: FAILED_PRECONDITION -> `Fenced`, NOT_FOUND ->
`NotFound`, INVALID_ARGUMENT -> `InvalidArgument`, ABORTED ->
`InvalidTransition`, UNIMPLEMENTED -> `Unimplemented`, UNAVAILABLE,
DEADLINE_EXCEEDED and CANCELLED -> `ProviderUnavailable` (retryable). Any
other code (notably INTERNAL, which the Go reference kit uses for an
out-of-position transition) is a plain `ProviderError` naming the code.

The client never retries and never invents fencing tokens: the caller mints
a fresh sequence number for every attempt, retries included.

With a `CredentialsSource` the client speaks mutual TLS, presenting the
caller's certificate. When the source's generation moves (the certificate
files were rotated) the next call opens a new channel with the new
certificate; the old channel is closed a little later, so calls in flight
finish on it. A client given the provider's ``name`` also checks, once per
certificate generation, that the server presents
``bigfleet://provider/<name>`` before its first call (``verify_peer``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol

import grpc

from bigfleet.metrics import ProviderCallMetrics
from bigfleet.v1alpha1 import provider_pb2, provider_pb2_grpc
from providers.errors import ProviderError
from providers.model import FencingToken
from providers.wire import error_from_status

CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


#: How long a replaced channel stays open for the calls still using it.
RETIRE_AFTER_S = 30.0


class CredentialsSource(Protocol):
    """Channel credentials that may change (a rotated certificate)."""

    def credentials(self) -> tuple[int, grpc.ChannelCredentials]:
        """(generation, credentials); the generation grows when the credentials change."""

    async def verify_peer(self, address: str, provider_name: str) -> None:
        """Raise ``ProviderUnavailable`` unless ``address`` presents the provider's identity
        (cheap after the first check of a certificate generation)."""


def _token_fields(token: FencingToken | None) -> dict[str, Any]:
    if token is None:
        return {}
    return {
        "shard_id": token.shard_id,
        "shard_epoch": token.epoch,
        "sequence_number": token.sequence,
    }


class ProviderClient:
    """A connection to one capacity provider at ``address`` (``host:port``).
    Plaintext, or mutual TLS with ``security``; ``timeout`` bounds every
    call, in seconds."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        security: CredentialsSource | None = None,
        name: str = "",
    ) -> None:
        self.address = address
        # With TLS, the server must present bigfleet://provider/<name> (checked before a call).
        self.name = name
        # Calls are counted and timed per provider (bigfleet_provider_client_*).
        self._interceptors: list[Any] = [ProviderCallMetrics(name or address)]
        self.timeout = timeout
        self._security = security
        self._generation = -1
        self._retiring: set[asyncio.Task[None]] = set()
        self._channel = self._open()
        self._stub_now = provider_pb2_grpc.CapacityProviderStub(self._channel)

    def _open(self) -> grpc.aio.Channel:
        if self._security is None:
            return grpc.aio.insecure_channel(
                self.address, options=CLIENT_OPTIONS, interceptors=self._interceptors
            )
        self._generation, creds = self._security.credentials()
        return grpc.aio.secure_channel(
            self.address, creds, options=CLIENT_OPTIONS, interceptors=self._interceptors
        )

    async def _ready(self) -> provider_pb2_grpc.CapacityProviderAsyncStub:
        """The stub to call, once the server proved it is the provider named ``name``."""
        if self._security is not None and self.name:
            await self._security.verify_peer(self.address, self.name)
        return self._stub

    @property
    def _stub(self) -> provider_pb2_grpc.CapacityProviderAsyncStub:
        """The stub of the current channel; a new channel once the certificate rotated."""
        if self._security is not None and self._security.credentials()[0] != self._generation:
            old = self._channel
            self._channel = self._open()
            self._stub_now = provider_pb2_grpc.CapacityProviderStub(self._channel)
            task = asyncio.get_running_loop().create_task(_close_later(old, RETIRE_AFTER_S))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return self._stub_now

    async def __aenter__(self) -> ProviderClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; in-flight calls are cancelled."""
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._channel.close(None)

    def _deadline(self, deadline_s: float | None) -> float:
        """The call's deadline in seconds: ``deadline_s`` when given (a caller whose right to
        act ends sooner), else the client's."""
        return self.timeout if deadline_s is None else min(self.timeout, deadline_s)

    async def create(
        self, machine_id: str, token: FencingToken | None, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck:
        """Ask for SPECULATIVE -> CREATING -> IDLE. Returns at acceptance."""
        request = provider_pb2.CreateRequest(machine_id=machine_id, **_token_fields(token))
        stub = await self._ready()
        try:
            return await stub.Create(request, timeout=self._deadline(deadline_s))
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def configure(
        self,
        machine_id: str,
        cluster_id: str,
        bootstrap_blob: bytes,
        token: FencingToken | None,
        shard_metadata: Mapping[str, str] | None = None,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck:
        """Ask for IDLE -> CONFIGURING -> CONFIGURED in ``cluster_id``; the
        provider stores ``shard_metadata`` and echoes it until the drain ends."""
        request = provider_pb2.ConfigureRequest(
            machine_id=machine_id,
            cluster_id=cluster_id,
            bootstrap_blob=bootstrap_blob,
            shard_metadata=dict(shard_metadata or {}),
            **_token_fields(token),
        )
        stub = await self._ready()
        try:
            return await stub.Configure(request, timeout=self._deadline(deadline_s))
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def drain(
        self,
        machine_id: str,
        grace_seconds: int,
        token: FencingToken | None,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck:
        """Ask for CONFIGURED -> DRAINING -> IDLE within ``grace_seconds``."""
        request = provider_pb2.DrainRequest(
            machine_id=machine_id, grace_period_seconds=grace_seconds, **_token_fields(token)
        )
        stub = await self._ready()
        try:
            return await stub.Drain(request, timeout=self._deadline(deadline_s))
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def delete(
        self, machine_id: str, token: FencingToken | None, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck:
        """Ask for IDLE -> DELETING -> SPECULATIVE (cloud only)."""
        request = provider_pb2.DeleteRequest(machine_id=machine_id, **_token_fields(token))
        stub = await self._ready()
        try:
            return await stub.Delete(request, timeout=self._deadline(deadline_s))
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def get(self, machine_id: str) -> provider_pb2.Machine:
        """One machine as the provider sees it now."""
        stub = await self._ready()
        try:
            return await stub.Get(provider_pb2.MachineRef(id=machine_id), timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def list(
        self,
        states: Iterable[int] = (),
        max_results: int = 0,
        since_revision: bytes = b"",
    ) -> provider_pb2.MachineList:
        """Machines in ``states`` (all if empty), at most ``max_results`` (0:
        no cap), only those changed since ``since_revision`` if given."""
        request = provider_pb2.ListFilter(
            states=[provider_pb2.MachineState.ValueType(int(s)) for s in states],
            max_results=max_results,
            since_revision=since_revision,
        )
        stub = await self._ready()
        try:
            return await stub.List(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            raise _translate(error) from error

    async def list_all(self, states: Iterable[int] = ()) -> provider_pb2.MachineList:
        """Every machine in ``states`` in one answer, with the provider's
        cursor for later deltas."""
        return await self.list(states, 0, b"")


async def _close_later(channel: grpc.aio.Channel, delay: float) -> None:
    try:
        await asyncio.sleep(delay)
    finally:
        await channel.close(None)


def _translate(error: grpc.aio.AioRpcError) -> ProviderError:
    return error_from_status(error.code(), error.details() or "")


__all__ = ["CredentialsSource", "FencingToken", "ProviderClient"]
