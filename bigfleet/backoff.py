"""Retrying a connection at start-up, with exponential back-off, until a deadline.

In a deployment the parts start in any order: a shard may come up before
PostgreSQL accepts connections or before Temporal's frontend answers.
Every process therefore retries what it connects to at start-up —
PostgreSQL (and the migration), Temporal, and (through their own loops)
the providers — with back-off doubling from ``initial_s`` to ``max_s``,
logging one line per failed attempt, until ``BIGFLEET_CONNECT_TIMEOUT_SECONDS``
has passed; then the last error is raised. An error that retrying cannot
fix (a configuration error, a refused login) is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["retrying", "transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def transient(err: BaseException) -> bool:
    """Whether retrying may help: the peer is not there yet (refused, unreachable, timed out)."""
    if isinstance(err, ConnectionError | TimeoutError | OSError):
        return True
    text = str(err).lower()
    markers = (
        "connection refused",
        "connect call failed",
        "failed client connect",
        "unavailable",
        "the database system is starting up",
        "could not connect",
        "timed out",
        "name or service not known",
        "temporary failure in name resolution",
    )
    return any(marker in text for marker in markers)


async def retrying(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    within_s: float,
    initial_s: float = 0.5,
    max_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``attempt()`` until it succeeds, a non-transient error, or ``within_s`` seconds."""
    deadline = clock() + within_s
    delay = initial_s
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except Exception as err:
            if not transient(err) or clock() + delay > deadline:
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            log.warning(
                "waiting for %s (attempt %d: %s); retrying in %.1f s", what, tries, first, delay
            )
        await asyncio.sleep(delay)
        delay = min(max_s, delay * 2)
