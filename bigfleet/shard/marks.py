"""Marks a shard's work in flight with the shard's mode, so the Temporal UI shows a pause.

    Adoption.refresh --mode changed--> ModeMarker.observe(mode)
        --pass (background)--> list BigFleetShardId = S, Running, mode != M
                               signal each "shard-mode" {M} --> workflow upserts BigFleetShardMode

Nothing new starts while a shard is paused or in dry run (``gate.py``),
so a mode on *new* workflows alone would tell an operator nothing about a
pause. What they need to see is the work still finishing during one:
``BigFleetShardMode = 'paused' AND ExecutionStatus = 'Running'``. Each
workflow the shard starts carries the mode at its start (the executor
sets it); when a control lands, this marker signals every running
workflow of the shard whose mark differs, and the workflow upserts the
attribute itself (only a workflow can change its search attributes).

Visibility lags behind starts (about a second), so a workflow started in
the cycle just before a pause may be missing from the first listing: the
marker passes again on every refresh for ``settle_s`` after a change, and
until a pass finds nothing left to mark. A pass is cheap when there is
nothing to do — one visibility query that returns no rows. Marking is
visibility only: a failed pass is logged and retried on the next refresh,
and it never delays a cycle (it runs as its own task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes as sa
from workflows.contracts import SHARD_MODES, ShardModeSignal, ShardSignal

__all__ = ["ModeMarker"]

log = logging.getLogger(__name__)


class ModeMarker:
    """Keeps BigFleetShardMode on a shard's running workflows equal to the shard's mode."""

    def __init__(
        self,
        temporal: Client,
        *,
        shard_id: str,
        settle_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._temporal = temporal
        self._shard_id = shard_id
        self._settle_s = settle_s
        self._clock = clock
        self._mode = ""
        self._reason = ""
        self._changed_at = 0.0
        self._pending = False  # a pass is still owed for the current mode
        self._task: asyncio.Task[int] | None = None
        #: Workflows signalled so far (tests, logs).
        self.marked = 0

    @property
    def mode(self) -> str:
        """The mode being kept ("" before the first observation)."""
        return self._mode

    def observe(self, mode: str, reason: str = "") -> None:
        """Called after each control read: start a marking pass if one is owed.

        The first observation after start owes a pass too, whatever the mode:
        a restarted or taken-over shard may find work its predecessor marked
        before a resume it did not live to see.
        """
        if mode not in SHARD_MODES:
            raise ValueError(f"mode: {mode!r} is not one of {sorted(SHARD_MODES)}")
        if mode != self._mode:
            self._mode, self._reason = mode, reason
            self._changed_at = self._clock()
            self._pending = True
        if self._task is not None and not self._task.done():
            return
        if self._pending:
            self._task = asyncio.create_task(self._pass(), name=f"mark-{self._shard_id}")

    async def _pass(self) -> int:
        mode = self._mode
        try:
            found = await self.mark(mode, self._reason)
        except Exception:
            log.warning("shard %s: marking work as %s failed", self._shard_id, mode, exc_info=True)
            return 0
        settled = self._clock() - self._changed_at >= self._settle_s
        if mode == self._mode and found == 0 and settled:
            self._pending = False
        return found

    async def mark(self, mode: str, reason: str = "") -> int:
        """One pass: signal every running workflow of the shard not marked ``mode``.

        Returns how many were signalled. A workflow that closed in between is
        skipped; other errors raise.
        """
        signal = ShardModeSignal(mode=mode, reason=reason)
        count = 0
        query = sa.in_flight_query(self._shard_id, not_mode=mode)
        async for execution in self._temporal.list_workflows(query):
            handle = self._temporal.get_workflow_handle(execution.id, run_id=execution.run_id)
            try:
                await handle.signal(ShardSignal.MODE.value, signal)
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
                continue
            count += 1
        if count:
            self.marked += count
            log.info("shard %s: marked %d workflow(s) in flight as %s", self._shard_id, count, mode)
        return count

    async def close(self) -> None:
        """Stop a pass in progress (the next holder marks what is left)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
