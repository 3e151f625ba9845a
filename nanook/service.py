"""The gRPC transport: ``compute_scaling.client.v1.ScalingService``.

Thin: requests are decoded here (so malformed bytes are INVALID_ARGUMENT,
not the framework's INTERNAL) and handed to the adapter. Refusals map to
INVALID_ARGUMENT (wrong request), FAILED_PRECONDITION (cannot keep the named
workers yet) and UNAVAILABLE (no shard session; the scheduler retries).
Unknown fields are ignored, as protobuf's compatibility rule wants.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError

from nanook.pool import ScaleConfig, ScaleRefused
from nanook.v1 import scale_config_pb2, scale_to_pb2

if TYPE_CHECKING:
    from nanook.adapter import NanookAdapter

log = logging.getLogger(__name__)

__all__ = ["SERVICE", "add_scaling_service", "config_message"]

SERVICE = "compute_scaling.client.v1.ScalingService"
_CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "conflict": grpc.StatusCode.FAILED_PRECONDITION,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
}


def config_message(state: ScaleConfig) -> scale_config_pb2.ScaleConfigResponse:
    msg = scale_config_pb2.ScaleConfigResponse(
        desired=state.desired, available=state.available, min=state.min
    )
    if state.max is not None:
        msg.max = state.max
    return msg


def _identity(data: bytes) -> bytes:
    return data


class ScalingService:
    """The servicer; methods take raw request bytes (see module docstring)."""

    def __init__(self, adapter: NanookAdapter) -> None:
        self._adapter = adapter

    async def ScaleTo(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> scale_to_pb2.ScaleToResponse:
        try:
            msg = scale_to_pb2.ScaleToRequest.FromString(request)
        except DecodeError as err:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"(body): not a ScaleToRequest: {err}"
            )
        keep = list(msg.workers_to_keep.values) if msg.HasField("workers_to_keep") else None
        delete = list(msg.workers_to_delete.values) if msg.HasField("workers_to_delete") else None
        for field, names in (("workers_to_keep", keep), ("workers_to_delete", delete)):
            for i, name in enumerate(names or ()):
                if not name:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"{field}.values[{i}]: must not be empty"
                    )
        try:
            self._adapter.scale_to(msg.amount, keep=keep, delete=delete)
        except ScaleRefused as err:
            await context.abort(_CODES[err.kind], str(err))
        return scale_to_pb2.ScaleToResponse()

    async def ScaleConfig(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[scale_config_pb2.ScaleConfigResponse]:
        try:
            scale_config_pb2.ScaleConfigRequest.FromString(request)
        except DecodeError as err:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"(body): not a ScaleConfigRequest: {err}"
            )
        async for state in self._adapter.watch():
            yield config_message(state)


def add_scaling_service(server: grpc.aio.Server, adapter: NanookAdapter) -> None:
    """Register the ScalingService on ``server`` for ``adapter``."""
    servicer = ScalingService(adapter)
    handlers = {
        "ScaleTo": grpc.unary_unary_rpc_method_handler(
            servicer.ScaleTo,
            request_deserializer=_identity,
            response_serializer=scale_to_pb2.ScaleToResponse.SerializeToString,
        ),
        "ScaleConfig": grpc.unary_stream_rpc_method_handler(
            servicer.ScaleConfig,
            request_deserializer=_identity,
            response_serializer=scale_config_pb2.ScaleConfigResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
