"""How a command runs: settings read once, asyncio, signals, and failures as one line.

Every command body is a coroutine handed to :func:`run` (or :func:`result`
when it returns a value). An endpoint that is not configured, a missing
extra, or a peer that cannot be reached ends the command with exit code 2
and one line on stderr naming what it was trying to reach
(:data:`REACHING`, appended to by :mod:`bigfleet.cli.connections`) and where
to look; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn

import typer

from bigfleet.config import ConfigError, Settings
from bigfleet.endpoints import EndpointsMissing

__all__ = [
    "REACHING",
    "configure_logging",
    "fail",
    "hint",
    "result",
    "run",
    "run_configured",
    "settings",
    "until_signalled",
]

# What a command is trying to reach, for the one-line error when it cannot.
REACHING: list[str] = []


def configure_logging(verbose: bool) -> None:
    """INFO (DEBUG with -v) for BigFleet; the chatty libraries only from WARNING."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # pgserver logs initdb's whole output at INFO; the others chatter likewise.
    for noisy in ("temporalio", "sqlalchemy", "alembic", "asyncio", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a long-lived ``main(stop)``; SIGINT or SIGTERM sets ``stop``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await main(stop)


def settings() -> Settings:
    """The BIGFLEET_* settings; a malformed variable fails the command naming it."""
    try:
        return Settings.from_env()
    except ConfigError as err:
        fail(str(err))


def fail(message: str) -> NoReturn:
    """``error: MESSAGE`` on stderr, exit code 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def run(coro: Awaitable[None]) -> None:
    """Run a command's body that returns nothing (see :func:`result`)."""
    result(coro)  # type: ignore[arg-type]


def run_configured(coro: Awaitable[None]) -> None:
    """Run a process; a configuration error found while wiring it is a clear failure."""
    try:
        run(coro)
    except ConfigError as err:
        fail(str(err))


def result(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a command's body; a missing endpoint or an unreachable peer is one line."""
    from bigfleet.extras import MissingExtra

    try:
        return asyncio.run(coro)
    except (EndpointsMissing, MissingExtra) as err:
        fail(str(err))
    except Exception as err:
        line = hint(err)
        if line is None:
            raise
        fail(line)


def hint(err: BaseException) -> str | None:
    """One line for an error from reaching PostgreSQL, Temporal or a gRPC peer, else None."""
    import grpc
    from sqlalchemy.exc import SQLAlchemyError

    what = REACHING[-1] if REACHING else "a BigFleet endpoint"
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, RuntimeError) and "client connect" in detail:
        detail = "connection refused" if "Connection refused" in str(err) else detail
    elif isinstance(err, SQLAlchemyError):
        detail = str(getattr(err, "orig", err)).strip().splitlines()[0]
    elif isinstance(err, grpc.aio.AioRpcError):
        detail = f"{err.code().name}: {err.details()}"
    elif not isinstance(err, OSError | TimeoutError):
        return None
    return f"cannot reach {what}: {detail[:200]} ({_where_to_look()})"


def _where_to_look() -> str:
    """The hint after "cannot reach": a deployment's settings, or the local dev stack."""
    configured = [
        v for v in ("BIGFLEET_DATABASE_URL", "BIGFLEET_TEMPORAL_ADDRESS") if os.environ.get(v)
    ]
    if configured:
        return f"check {' / '.join(configured)}, or --database-url / --address"
    return "is `make dev` running? --database-url / --address point elsewhere"
