"""Serving: health checking, reflection, the client's error mapping and the
command line."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from provider_harness import Harness, serve
from typer.testing import CliRunner

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


def test_every_error_has_its_own_code_and_maps_back() -> None:
    assert len(set(ERROR_CODES.values())) == len(ERROR_CODES)
    assert ERROR_CODES[Fenced] == grpc.StatusCode.FAILED_PRECONDITION
    for cls in (Fenced, InvalidArgument, NotFound, InvalidTransition, Unimplemented):
        back = error_from_status(status_code(cls("x")), "x")
        assert type(back) is cls and not back.retryable
    deadline = error_from_status(grpc.StatusCode.DEADLINE_EXCEEDED, "slow")
    assert isinstance(deadline, ProviderUnavailable) and deadline.retryable
    internal = error_from_status(grpc.StatusCode.INTERNAL, "invalid state transition")
    assert type(internal) is ProviderError and "INTERNAL" in internal.message


def test_the_cli_documents_serve() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in ("--kind", "--addr", "--state", "--seed", "--time-factor", "--catalog", "--name"):
        assert flag in result.output
    assert runner.invoke(app, ["serve", "--kind", "mainframe"]).exit_code != 0
