"""The shard's gRPC server: ``bigfleet.v1alpha1.Shard/Session``, health and reflection."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bigfleet.identity import KeyPairSource, server_credentials
from bigfleet.shard.sessions import RollupSink, SessionHub, ShardServicer
from bigfleet.v1alpha1 import shard_pb2, shard_pb2_grpc

__all__ = ["serve_sessions"]


async def serve_sessions(
    hub: SessionHub, sink: RollupSink, listen: str, *, tls: KeyPairSource | None = None
) -> tuple[grpc.aio.Server, str]:
    """Start serving operator sessions on ``listen`` (port 0: any free port).

    With ``tls`` the port requires mutual TLS (see ``bigfleet.identity``).
    Returns the running server and the ``host:port`` it listens on.
    """
    server = grpc.aio.server()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(hub, sink), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await health.set("bigfleet.v1alpha1.Shard", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (shard_pb2.DESCRIPTOR.services_by_name["Shard"].full_name, reflection.SERVICE_NAME),
        server,
    )
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, server_credentials(tls))
    await server.start()
    return server, f"{listen.rsplit(':', 1)[0]}:{port}"
