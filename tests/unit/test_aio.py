"""A stop that lands in the same turn as a wake still stops (Python 3.11's ``wait_for``).

``asyncio.wait_for`` on 3.11 drops the caller's cancellation when what it
awaits completes in the turn of the cancel; a loop task then never ends.
The decision log's writer waits on an event every cycle sets, and a stop
that cancelled it in such a turn hung the shard's stop for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from bigfleet.aio import wait_set, within
from bigfleet.decisions.entries import Decision
from bigfleet.decisions.log import DecisionLog


async def _stops(loop: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> bool:
    """Start ``loop`` on an event, then set the event and cancel it in one turn."""
    event = asyncio.Event()
    task = asyncio.create_task(loop(event))
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return bool(done) and task.cancelled()


async def _forever(
    wait: Callable[[asyncio.Event], Awaitable[object]], event: asyncio.Event
) -> None:
    while True:
        with contextlib.suppress(TimeoutError):
            await wait(event)
        event.clear()
        await asyncio.sleep(0)  # the loop's work


async def test_a_loop_on_wait_set_stops_when_woken_and_cancelled_in_one_turn() -> None:
    assert await _stops(lambda e: _forever(lambda ev: wait_set(ev, 5.0), e))
    assert await _stops(lambda e: _forever(lambda ev: within(ev.wait(), 5.0), e))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps the cancel from 3.12")
async def test_the_same_loop_on_wait_for_does_not_stop_on_this_python() -> None:
    """The failure ``within`` and ``wait_set`` exist for, shown on this interpreter."""
    assert not await _stops(lambda e: _forever(lambda ev: asyncio.wait_for(ev.wait(), 5.0), e))


async def test_within_and_wait_set_time_out_and_return() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    event.set()
    assert await wait_set(event, 0.01) is True
    assert await within(asyncio.sleep(0, result=7), 1.0) == 7
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(5), 0.01)


class _Sink:
    async def append(self, entries: list[Decision]) -> int:
        return len(entries)

    async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
        return 0


async def test_the_decision_log_writer_stops_when_a_cycle_wakes_it_in_the_stop_turn() -> None:
    writer = DecisionLog("s", _Sink(), clock=lambda: 0.0)
    task = asyncio.create_task(writer.run())
    await asyncio.sleep(0.01)
    writer.defer([])  # a cycle's rows wake the writer ...
    task.cancel()  # ... in the turn the shard stops it
    done, _ = await asyncio.wait({task}, timeout=2.0)
    if not done:
        task.cancel()
    assert done and task.cancelled()
