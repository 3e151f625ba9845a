"""Serving a provider core over gRPC: the CapacityProvider servicer, health
checking and reflection on one ``grpc.aio`` server.

The servicer is thin on purpose: each RPC unpacks its request, calls the
core (which validates, fences and decides) and packs the answer; a
`ProviderError` becomes its status code through `providers.wire`.

With a `ServerSecurity` the server speaks mutual TLS and asks its
`CallerPolicy` before every call: who may mutate (a shard, only with its own
fencing token's shard id) and who may read. The policy is injected — the
application builds it from the caller's certificate identity — so this
package stays free of the application's configuration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bigfleet.metrics import ProviderRequestMetrics
from bigfleet.v1alpha1 import provider_pb2, provider_pb2_grpc
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.errors import ProviderError
from providers.kinds import build_provider
from providers.wire import ack_to_pb, list_to_pb, machine_to_pb, status_code, token_from

log = logging.getLogger(__name__)

SERVICE_NAME: str = provider_pb2.DESCRIPTOR.services_by_name["CapacityProvider"].full_name

#: Generous message caps: a bootstrap blob may be up to 1 MiB, and a List of a
#: large inventory is several MiB.
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]

_Reply = TypeVar("_Reply")
#: The asyncio health servicer (the published stubs only describe the sync one).
_AsyncHealthServicer: Any = health.aio.HealthServicer  # type: ignore[attr-defined]
_Context = grpc.aio.ServicerContext[Any, Any]


class CallerPolicy(Protocol):
    """Who may call a provider. Each method aborts the call (PERMISSION_DENIED) to refuse."""

    async def may_mutate(self, context: _Context, shard_id: str) -> None:
        """Create/Configure/Drain/Delete carrying a fencing token for ``shard_id``."""

    async def may_read(self, context: _Context) -> None:
        """Get and List."""


@dataclass(frozen=True)
class ServerSecurity:
    """Mutual TLS for a provider server: its credentials and the caller policy."""

    credentials: grpc.ServerCredentials
    policy: CallerPolicy


class _OpenPolicy:
    """Plaintext: anyone who reaches the port may call (the network is trusted)."""

    async def may_mutate(self, context: _Context, shard_id: str) -> None:
        return None

    async def may_read(self, context: _Context) -> None:
        return None


class CapacityProviderServicer(provider_pb2_grpc.CapacityProviderServicer):
    """bigfleet.v1alpha1.CapacityProvider over a `ProviderCore`."""

    def __init__(self, provider: ProviderCore, policy: CallerPolicy | None = None) -> None:
        self._provider = provider
        self._policy: CallerPolicy = policy or _OpenPolicy()

    async def Create(
        self, request: provider_pb2.CreateRequest, context: _Context
    ) -> provider_pb2.TransitionAck:
        """Accept SPECULATIVE -> IDLE; see `ProviderCore.create`."""
        await self._policy.may_mutate(context, request.shard_id)
        token = token_from(request.shard_id, request.shard_epoch, request.sequence_number)
        return await _answer(
            context, lambda: ack_to_pb(self._provider.create(request.machine_id, token))
        )

    async def Configure(
        self, request: provider_pb2.ConfigureRequest, context: _Context
    ) -> provider_pb2.TransitionAck:
        """Accept IDLE -> CONFIGURED; see `ProviderCore.configure`."""
        await self._policy.may_mutate(context, request.shard_id)
        token = token_from(request.shard_id, request.shard_epoch, request.sequence_number)
        return await _answer(
            context,
            lambda: ack_to_pb(
                self._provider.configure(
                    request.machine_id,
                    request.cluster_id,
                    request.bootstrap_blob,
                    token,
                    dict(request.shard_metadata),
                )
            ),
        )

    async def Drain(
        self, request: provider_pb2.DrainRequest, context: _Context
    ) -> provider_pb2.TransitionAck:
        """Accept CONFIGURED -> IDLE; see `ProviderCore.drain`."""
        await self._policy.may_mutate(context, request.shard_id)
        token = token_from(request.shard_id, request.shard_epoch, request.sequence_number)
        return await _answer(
            context,
            lambda: ack_to_pb(
                self._provider.drain(request.machine_id, request.grace_period_seconds, token)
            ),
        )

    async def Delete(
        self, request: provider_pb2.DeleteRequest, context: _Context
    ) -> provider_pb2.TransitionAck:
        """Accept IDLE -> SPECULATIVE; see `ProviderCore.delete`."""
        await self._policy.may_mutate(context, request.shard_id)
        token = token_from(request.shard_id, request.shard_epoch, request.sequence_number)
        return await _answer(
            context, lambda: ack_to_pb(self._provider.delete(request.machine_id, token))
        )

    async def Get(
        self, request: provider_pb2.MachineRef, context: _Context
    ) -> provider_pb2.Machine:
        """One machine; see `ProviderCore.get`."""
        await self._policy.may_read(context)
        return await _answer(context, lambda: machine_to_pb(self._provider.get(request.id)))

    async def List(
        self, request: provider_pb2.ListFilter, context: _Context
    ) -> provider_pb2.MachineList:
        """Machines by state, capped, optionally changed-since; see `ProviderCore.list`."""
        await self._policy.may_read(context)
        return await _answer(
            context,
            lambda: list_to_pb(
                self._provider.list(
                    [int(s) for s in request.states],
                    request.max_results,
                    request.since_revision,
                )
            ),
        )


async def _answer(context: _Context, call: Callable[[], _Reply]) -> _Reply:
    try:
        return call()
    except ProviderError as error:
        log.debug("provider refused: %s", error)
        await context.abort(status_code(error), error.message)


@dataclass
class RunningProvider:
    """A provider being served. ``provider`` is the core, for inspection."""

    address: str
    port: int
    provider: ProviderCore
    server: grpc.aio.Server
    health: Any

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop answering (in-flight RPCs get ``grace`` seconds; None cuts them
        off), cancel the simulation timers and write a final snapshot."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        self.provider.close()


async def start_provider_server(
    config: ProviderConfig,
    addr: str = "127.0.0.1:0",
    *,
    provider: ProviderCore | None = None,
    security: ServerSecurity | None = None,
) -> RunningProvider:
    """Build the provider ``config`` describes (or serve ``provider``), start
    it on the running loop and serve it at ``addr`` (port 0 picks a free one),
    with health checking and reflection; plaintext, or mutual TLS with
    ``security``. Building reads the provider's state and, for a cloud, its
    catalog (EC2: quotas, offerings and spot prices of every region), so it
    runs on a worker thread rather than stall the loop's other tasks."""
    core = provider if provider is not None else await asyncio.to_thread(build_provider, config)
    server = grpc.aio.server(
        options=SERVER_OPTIONS, interceptors=[ProviderRequestMetrics(config.name)]
    )
    provider_pb2_grpc.add_CapacityProviderServicer_to_server(
        CapacityProviderServicer(core, security.policy if security else None), server
    )
    health_servicer = _AsyncHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    if security is None:
        port = server.add_insecure_port(addr)
    else:
        port = server.add_secure_port(addr, security.credentials)
    if port == 0:
        raise OSError(f"cannot listen on {addr}")
    core.start()
    await server.start()
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    host = addr.rsplit(":", 1)[0]
    address = f"{host}:{port}"
    log.info(
        "%s provider %r serving %s on %s (%s)",
        config.kind,
        core.name,
        SERVICE_NAME,
        address,
        "mutual TLS" if security else "plaintext",
    )
    return RunningProvider(address, port, core, server, health_servicer)


__all__ = [
    "SERVICE_NAME",
    "CallerPolicy",
    "CapacityProviderServicer",
    "RunningProvider",
    "ServerSecurity",
    "start_provider_server",
]
