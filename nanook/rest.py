"""The REST transport (aiohttp): ``GET /scale_config``, ``POST /scale_to``, ``GET /openapi.json``.

Thin: it validates the body at the edge, once, and calls the adapter. Every
error is JSON, ``{"error": <reason>, "field": <where>}``, with the status the
scheduler expects (seed 003): 400 for a wrong request (negative, fractional,
above max, unknown fields, malformed JSON), 409 for a scale-down that
cannot keep the named workers yet (asked again later), 503 while the shard
session is down (with ``Retry-After``). A fault inside the adapter is a 500,
never a crash.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nanook.pool import ScaleConfig, ScaleRefused

if TYPE_CHECKING:
    from nanook.adapter import NanookAdapter

log = logging.getLogger(__name__)

__all__ = ["OPENAPI", "config_json", "parse_scale_to", "rest_app"]

OPENAPI: dict[str, Any] = json.loads(resources.files("nanook").joinpath("openapi.json").read_text())
"""The OpenAPI document, the seed's schema unchanged."""

UINT32_MAX = 2**32 - 1
_BODY_FIELDS = ("amount", "workers_to_keep", "workers_to_delete")
_STATUS = {"invalid": 400, "conflict": 409, "unavailable": 503}


class BadBody(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def _error(status: int, field: str, reason: str, **headers: str) -> web.Response:
    return web.json_response({"error": reason, "field": field}, status=status, headers=headers)


def config_json(state: ScaleConfig) -> dict[str, int]:
    """``ScaleConfigResponse`` as JSON; ``max`` is left out when unbounded."""
    out = {"desired": state.desired, "available": state.available, "min": state.min}
    if state.max is not None:
        out["max"] = state.max
    return out


def _names(raw: Any, field: str) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadBody(field, f"must be an array of worker names or null, got {type(raw).__name__}")
    for i, name in enumerate(raw):
        if not isinstance(name, str):
            raise BadBody(f"{field}[{i}]", f"must be a string, got {name!r}")
    return raw


def parse_scale_to(text: str) -> tuple[int, list[str] | None, list[str] | None]:
    """Validate a ``ScaleToBody``; returns (amount, workers_to_keep, workers_to_delete)."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadBody("(body)", f"not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadBody("(body)", f"must be a JSON object, got {type(body).__name__}")
    for key in body:
        if key not in _BODY_FIELDS:
            raise BadBody(key, f"unknown field (known: {', '.join(_BODY_FIELDS)})")
    if "amount" not in body:
        raise BadBody("amount", "is required")
    amount = body["amount"]
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise BadBody("amount", f"must be an integer, got {json.dumps(amount)}")
    if isinstance(amount, float):
        if not amount.is_integer():
            raise BadBody("amount", f"must be an integer, got {amount!r}")
        amount = int(amount)
    if amount < 0:
        raise BadBody("amount", f"must not be negative, got {amount}")
    if amount > UINT32_MAX:
        raise BadBody("amount", f"must fit in uint32, got {amount}")
    keep = _names(body.get("workers_to_keep"), "workers_to_keep")
    delete = _names(body.get("workers_to_delete"), "workers_to_delete")
    return amount, keep, delete


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error as JSON; an unexpected fault is a 500, and the server carries on."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return _error(err.status, "(request)", err.reason)
    except Exception:
        log.exception("nanook REST: %s %s failed", request.method, request.path)
        return _error(500, "(server)", "internal error; the request was not applied")


def rest_app(adapter: NanookAdapter) -> web.Application:
    """The aiohttp application serving ``adapter``."""
    app = web.Application(middlewares=[_json_errors], client_max_size=64 * 1024)

    async def get_config(request: web.Request) -> web.Response:
        return web.json_response(config_json(adapter.scale_config()))

    async def post_scale_to(request: web.Request) -> web.StreamResponse:
        try:
            raw = await request.read()
            amount, keep, delete = parse_scale_to(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            return _error(400, "(body)", f"not UTF-8: {err}")
        except BadBody as err:
            return _error(400, err.field, err.reason)
        try:
            adapter.scale_to(amount, keep=keep, delete=delete)
        except ScaleRefused as err:
            headers = {"Retry-After": "1"} if err.kind == "unavailable" else {}
            return _error(_STATUS[err.kind], err.field, err.reason, **headers)
        return web.Response(status=204)

    async def get_openapi(request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    app.router.add_get("/scale_config", get_config)
    app.router.add_post("/scale_to", post_scale_to)
    app.router.add_get("/openapi.json", get_openapi)
    return app
