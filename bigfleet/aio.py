"""Waiting with a time limit without losing a cancellation.

On Python 3.11, ``asyncio.wait_for`` drops the caller's cancellation when
the awaited thing completes in the same turn of the event loop as the
cancel (CPython gh-86296, fixed in 3.12): the caller returns normally and
a loop task that was told to stop goes round again, for ever. A shard's
decision-log writer waits on an event that every cycle sets, so a stop that
cancels it in the cycle's turn hung ``ShardProcess.stop``. ``within`` is
``asyncio.wait_for`` on ``asyncio.timeout``, which keeps the cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["wait_set", "within"]

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """Await ``awaitable`` for at most ``seconds`` (None: no limit); raises ``TimeoutError``."""
    async with asyncio.timeout(seconds):
        return await awaitable


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until ``event`` is set or ``seconds`` pass; True when it was set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
