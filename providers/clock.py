"""Time for the simulated providers: a clock and a scheduler in one protocol.

The provider core never sleeps and never reads the wall clock. It asks a
`Scheduler` what time it is and to call it back later. On a server that is the
event loop (`AsyncioScheduler`); in a unit test it is `ManualScheduler`, whose
time moves only when the test calls `advance`, so every latency, deadline and
spot interruption is deterministic.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """A pending callback that can be cancelled."""

    def cancel(self) -> None:
        """Prevent the callback from running; harmless if it already ran."""


class Scheduler(Protocol):
    """Monotonic time in seconds and delayed callbacks."""

    def now(self) -> float:
        """Current time in seconds on this scheduler's own monotonic scale."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once, ``delay`` seconds from now (negative means now)."""


class AsyncioScheduler:
    """Schedules on the running asyncio event loop (the server's loop).

    The loop is looked up on first use, so the scheduler can be built before
    the loop runs; every later call must happen on that same loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        """The loop's monotonic time."""
        return self._get_loop().time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Schedule ``callback`` on the loop."""
        return self._get_loop().call_later(max(0.0, delay), callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """A virtual clock for deterministic tests: time stands still until
    `advance` moves it, and due callbacks then run in time order (ties in
    scheduling order)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _ManualTimer]] = []
        self._counter = itertools.count()

    def now(self) -> float:
        """The virtual time."""
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """Queue ``callback`` at ``now + max(delay, 0)``."""
        timer = _ManualTimer(self._now + max(0.0, delay), callback)
        heapq.heappush(self._heap, (timer.when, next(self._counter), timer))
        return timer

    @property
    def pending(self) -> int:
        """How many callbacks are queued and not cancelled."""
        return sum(1 for _, _, timer in self._heap if not timer.cancelled)

    def advance(self, seconds: float) -> int:
        """Move time forward by ``seconds``, running every callback that falls
        due (including ones scheduled by callbacks, if they fall due too).
        Returns how many callbacks ran."""
        if seconds < 0:
            raise ValueError("time cannot move backwards")
        horizon = self._now + seconds
        ran = 0
        while self._heap and self._heap[0][0] <= horizon:
            when, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback()
            ran += 1
        self._now = horizon
        return ran


__all__ = ["AsyncioScheduler", "ManualScheduler", "Scheduler", "Timer"]
