"""A scaling-service client that behaves as the Nanook scheduler does (seed 003).

Both transports, with the scheduler's rules:

- 5 seconds per request;
- REST: a request that times out, cannot connect, or is answered 429 is
  retried up to four times, waiting a second longer before each attempt
  (1 s, 2 s, 3 s, 4 s); any other error is final;
- gRPC: ScaleTo answered UNAVAILABLE (or not answered in time) is retried the
  same way; other statuses are final;
- the configuration is re-read periodically (:class:`Scheduler`).

The end-to-end tests drive BigFleet's adapter with it, and it is a handy
tool against any scaling service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import aiohttp
import grpc

from nanook.pool import ScaleConfig
from nanook.v1 import scale_config_pb2, scale_to_pb2, scaling_service_pb2_grpc

log = logging.getLogger(__name__)

__all__ = [
    "GrpcScalingClient",
    "RestScalingClient",
    "ScalingClient",
    "ScalingError",
    "Scheduler",
]

REQUEST_TIMEOUT_S = 5.0
RETRIES = 4

Sleep = Callable[[float], Awaitable[None]]
T = TypeVar("T")


class ScalingError(Exception):
    """A final answer other than success: ``status`` is the HTTP status or gRPC code name."""

    def __init__(self, status: str, message: str, attempts: int) -> None:
        self.status, self.message, self.attempts = status, message, attempts
        super().__init__(f"{status}: {message} (after {attempts} attempts)")


class ScalingClient(Protocol):
    """What a scheduler needs of a scaling service."""

    async def scale_config(self) -> ScaleConfig: ...

    async def scale_to(
        self,
        amount: int,
        *,
        keep: Sequence[str] | None = None,
        delete: Sequence[str] | None = None,
    ) -> None: ...


class _Retry(Exception):
    def __init__(self, status: str, message: str) -> None:
        self.status, self.message = status, message


async def _with_retries(call: Callable[[], Awaitable[T]], sleep: Sleep) -> T:
    attempts = 0
    while True:
        attempts += 1
        try:
            return await call()
        except _Retry as err:
            if attempts > RETRIES:
                raise ScalingError(err.status, err.message, attempts) from None
            log.info("scaling request: %s; retrying in %d s", err.status, attempts)
            await sleep(float(attempts))
        except ScalingError as err:
            err.attempts = attempts
            raise


class RestScalingClient:
    """The REST transport, base URL as in the scheduler's ``scaling.rest`` uri."""

    def __init__(
        self, base_url: str, *, timeout_s: float = REQUEST_TIMEOUT_S, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.sleep = sleep
        self.attempts = 0  # requests sent, retries included

    async def _request(self, method: str, path: str, body: object | None = None) -> bytes:
        self.attempts += 1
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.request(method, self.base_url + path, json=body) as resp,
            ):
                data = await resp.read()
                if resp.status == 429:
                    raise _Retry("429", data.decode(errors="replace"))
                if resp.status >= 400:
                    raise ScalingError(str(resp.status), data.decode(errors="replace"), 1)
                return data
        except TimeoutError:
            raise _Retry("timeout", f"no answer within {self.timeout.total} s") from None
        except aiohttp.ClientConnectionError as err:
            raise _Retry("connect", str(err)) from None

    async def scale_config(self) -> ScaleConfig:
        data = await _with_retries(lambda: self._request("GET", "/scale_config"), self.sleep)
        doc = json.loads(data)
        return ScaleConfig(
            desired=int(doc["desired"]),
            available=int(doc["available"]),
            min=int(doc["min"]),
            max=None if doc.get("max") is None else int(doc["max"]),
        )

    async def scale_to(
        self,
        amount: int,
        *,
        keep: Sequence[str] | None = None,
        delete: Sequence[str] | None = None,
    ) -> None:
        body = {
            "amount": amount,
            "workers_to_keep": list(keep) if keep is not None else None,
            "workers_to_delete": list(delete) if delete is not None else None,
        }
        await _with_retries(lambda: self._request("POST", "/scale_to", body), self.sleep)


@dataclass
class GrpcScalingClient:
    """The gRPC transport (``scaling.grpc``)."""

    address: str
    timeout_s: float = REQUEST_TIMEOUT_S
    sleep: Sleep = asyncio.sleep
    attempts: int = 0

    def __post_init__(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = scaling_service_pb2_grpc.ScalingServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    async def _scale_to_once(self, request: scale_to_pb2.ScaleToRequest) -> None:
        self.attempts += 1
        try:
            await self._stub.ScaleTo(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            code = err.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise _Retry(code.name, err.details() or "") from None
            raise ScalingError(code.name, err.details() or "", 1) from None

    async def scale_to(
        self,
        amount: int,
        *,
        keep: Sequence[str] | None = None,
        delete: Sequence[str] | None = None,
    ) -> None:
        request = scale_to_pb2.ScaleToRequest(amount=amount)
        if keep is not None:
            request.workers_to_keep.values.extend(keep)
        if delete is not None:
            request.workers_to_delete.values.extend(delete)
        await _with_retries(lambda: self._scale_to_once(request), self.sleep)

    async def watch(self) -> AsyncIterator[ScaleConfig]:
        """The service's configuration stream: one message now, then one per change."""
        call = self._stub.ScaleConfig(scale_config_pb2.ScaleConfigRequest())
        try:
            async for msg in call:
                yield ScaleConfig(
                    desired=msg.desired,
                    available=msg.available,
                    min=msg.min,
                    max=msg.max if msg.HasField("max") else None,
                )
        finally:
            call.cancel()

    async def scale_config(self) -> ScaleConfig:
        async with asyncio.timeout(self.timeout_s):
            async for state in self.watch():
                return state
        raise ScalingError("UNAVAILABLE", "the ScaleConfig stream ended without a message", 1)


class Scheduler:
    """The scheduler's view: the configuration, re-read on an interval, and scaling calls."""

    def __init__(self, client: ScalingClient, *, reread_interval_s: float = 300.0) -> None:
        self.client = client
        self.reread_interval_s = reread_interval_s
        self.config: ScaleConfig | None = None
        self.refused: list[ScalingError] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> ScaleConfig:
        """Read the configuration (the leader fails to start without it), then keep re-reading."""
        self.config = await self.client.scale_config()
        self._task = asyncio.create_task(self._reread())
        return self.config

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _reread(self) -> None:
        while True:
            await asyncio.sleep(self.reread_interval_s)
            try:
                self.config = await self.client.scale_config()
            except ScalingError as err:
                log.warning("scheduler: scale_config failed: %s", err)

    async def scale(self, amount: int, *, keep: Sequence[str] = ()) -> bool:
        """One scaling decision; a refusal is logged and kept, as the scheduler does."""
        try:
            await self.client.scale_to(amount, keep=list(keep))
        except ScalingError as err:
            log.warning("scheduler: scale to %d refused: %s", amount, err)
            self.refused.append(err)
            return False
        return True
