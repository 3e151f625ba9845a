"""Waiting for a condition in tests: poll it against a generous deadline, never sleep-and-hope.

Deadlines bound a hang on a loaded machine; they are not speed assertions
(a fresh process can take 15-25 s of wall time just to import there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    within: float = ...,
    what: str = ...,
    every: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None], *, within: float = ..., what: str = ..., every: float = ...
) -> T: ...


async def eventually(
    check: Callable[[], Awaitable[T | None] | T | None],
    *,
    within: float = 60.0,
    what: str = "condition",
    every: float = 0.2,
) -> T:
    """Poll ``check`` (a value or a coroutine) every ``every`` seconds until it is truthy,
    for at most ``within`` seconds; return that value."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


__all__ = ["eventually"]
