"""Readiness probes: is a BigFleet gRPC server, or a Temporal frontend, ready? (``bigfleet health``)

    bigfleet health HOST:PORT [--service NAME]    grpc.health.v1 Check -> SERVING?
    bigfleet health HOST:PORT --temporal           Temporal answers and knows the namespace?

Container healthchecks and start-up scripts run these. A gRPC probe speaks
the process's own transport: mutual TLS with ``BIGFLEET_TLS_*`` when they are
set (the health service answers any certificate the CA signed; it is not
guarded by role), plaintext otherwise. A Temporal probe presents the TLS files
only when ``BIGFLEET_TEMPORAL_TLS`` asks for it, as the processes do.

Each probe returns a short description of what it saw, or raises
:class:`NotReady` with one line naming the address and the reason; it never
retries (the caller's healthcheck interval does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bigfleet.aio import within
from bigfleet.identity import ChannelSecurity, channel

if TYPE_CHECKING:
    from temporalio.service import TLSConfig

__all__ = ["NotReady", "probe_grpc", "probe_temporal"]


class NotReady(Exception):
    """The probed endpoint is unreachable or does not report itself ready."""


async def probe_grpc(
    address: str,
    *,
    security: ChannelSecurity | None,
    service: str = "",
    timeout_s: float = 5.0,
) -> str:
    """``grpc.health.v1.Health/Check`` of ``service`` ("" is the server as a whole).

    Returns ``"SERVING"``; raises :class:`NotReady` for any other status or an
    unreachable server.
    """
    async with channel(address, security) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            detail = (err.details() or "").strip().splitlines()
            why = f"{err.code().name}: {detail[0]}" if detail else err.code().name
            raise NotReady(f"{address}: {why}") from err
    status: str = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        named = f" (service {service!r})" if service else ""
        raise NotReady(f"{address}{named}: {status}")
    return status


async def probe_temporal(
    address: str,
    *,
    namespace: str = "default",
    tls: TLSConfig | None = None,
    timeout_s: float = 5.0,
) -> str:
    """Temporal's frontend answers its health check and knows ``namespace``.

    ``tls`` presents a client certificate (None: plaintext). That is what
    every BigFleet process needs before it can start a worker.
    """
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client
    from temporalio.service import RPCError

    async def check() -> str:
        client = await Client.connect(
            address,
            namespace=namespace,
            tls=tls or False,
        )
        if not await client.service_client.check_health():
            raise NotReady(f"{address}: Temporal reports NOT_SERVING")
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
        return f"SERVING (namespace {namespace})"

    try:
        return await within(check(), timeout_s)
    except NotReady:
        raise
    except TimeoutError as err:
        raise NotReady(f"{address}: no answer within {timeout_s:g} s") from err
    except RPCError as err:
        raise NotReady(f"{address}: {err.status.name}: {err.message}") from err
    except RuntimeError as err:  # the SDK's "Failed client connect: ..."
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise NotReady(f"{address}: {first[:200]}") from err
