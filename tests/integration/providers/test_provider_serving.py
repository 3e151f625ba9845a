"""Serving: health checking, reflection, the client's error mapping and the
command line."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from typer.testing import CliRunner

from bigfleet.v1alpha1 import provider_pb2_grpc
from providers.cli import app
from providers.client import ProviderClient
from providers.errors import (
    Fenced,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    ProviderError,
    ProviderUnavailable,
    Unimplemented,
)
from providers.server import SERVICE_NAME
from providers.wire import ERROR_CODES, error_from_status, status_code
from tests.integration.providers.provider_harness import Harness, serve


async def test_health_reports_serving_for_the_provider_service(harness: Harness) -> None:
    async with grpc.aio.insecure_channel(harness.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_provider_service(harness: Harness) -> None:
    async with grpc.aio.insecure_channel(harness.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in stub.ServerReflectionInfo(iter([request])):
            names = {s.name for s in answer.list_services_response.service}
            assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
            break
        else:  # pragma: no cover
            raise AssertionError("no reflection answer")


async def test_a_stopped_provider_is_unavailable_and_that_is_retryable() -> None:
    running = await serve("sim-cloud")
    address = running.address
    await running.stop(grace=None)
    async with ProviderClient(address, timeout=2.0) as client:
        with pytest.raises(ProviderUnavailable) as caught:
            await client.list_all()
    assert caught.value.retryable


class _CancellingProvider(provider_pb2_grpc.CapacityProviderServicer):
    """Stands for a proxy or a provider shutting down: every call it answers
    is cut off with CANCELLED."""

    async def _cut_off(self, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.CANCELLED, "cancelled on the way")

    async def Create(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)

    async def Configure(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)

    async def Drain(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)

    async def Delete(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)

    async def Get(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._cut_off(context)


async def test_a_cancelled_call_is_unavailable_and_that_is_retryable() -> None:
    server = grpc.aio.server()
    provider_pb2_grpc.add_CapacityProviderServicer_to_server(_CancellingProvider(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with ProviderClient(f"127.0.0.1:{port}", timeout=5.0) as client:
            with pytest.raises(ProviderUnavailable) as read:
                await client.get("simcloud-anything")
            with pytest.raises(ProviderUnavailable) as drain:
                await client.drain("simcloud-anything", 0, None)
    finally:
        await server.stop(None)
    for caught in (read, drain):
        assert caught.value.retryable
        assert "cancelled on the way" in caught.value.message


def test_every_error_has_its_own_code_and_maps_back() -> None:
    assert len(set(ERROR_CODES.values())) == len(ERROR_CODES)
    assert ERROR_CODES[Fenced] == grpc.StatusCode.FAILED_PRECONDITION
    for cls in (Fenced, InvalidArgument, NotFound, InvalidTransition, Unimplemented):
        back = error_from_status(status_code(cls("x")), "x")
        assert type(back) is cls and not back.retryable
    deadline = error_from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "slow")
    assert isinstance(deadline, ProviderUnavailable) and deadline.retryable
    cancelled = error_from_status(grpc.StatusCode.CANCELLED, "cut off")
    assert isinstance(cancelled, ProviderUnavailable) and cancelled.retryable
    internal = error_from_status(grpc.StatusCode.INTERNAL, "invalid state transition")
    assert type(internal) is ProviderError and "INTERNAL" in internal.message


def test_the_cli_documents_serve() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in ("--kind", "--addr", "--state", "--seed", "--time-factor", "--catalog", "--name"):
        assert flag in result.output
    assert runner.invoke(app, ["serve", "--kind", "mainframe"]).exit_code != 0
