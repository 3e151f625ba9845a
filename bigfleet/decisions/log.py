"""The decision log as a shard writes it: bounded in memory, flushed to PostgreSQL off the cycle.

Writing must never slow the cycle (issue 19): the cycle loop only hands
over the cycle's rows, not yet built (``defer``: a lazy iterator over the
immutable plan); a separate task (``run``) builds them a few hundred at a
time between other work on the loop, buffers them, writes
batches with one statement each and prunes the shard's rows past
retention. At most ``pending_cycles`` cycles wait to be built; beyond
that the oldest is dropped whole and counted. If PostgreSQL is slow or down, the buffer
fills and the *oldest* unwritten rows are dropped and counted
(``bigfleet_decisions_dropped_total``) — the log is evidence, not state,
and a shard that stops deciding because its log is slow would be worse.

Repetition is not evidence: a need short for an hour, or a drain a budget
holds for a day, would otherwise write the same row every cycle. ``unmet``
and ``held`` rows — and every row of a dry run, whose plans mark nothing
and so repeat — are written when they first appear and when their reason
changes, and again at most every ``repeat_seconds`` (so a query "at" any
instant finds a row no older than that).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from bigfleet import metrics
from bigfleet.aio import wait_set
from bigfleet.decisions.entries import Decision

__all__ = ["DecisionLog", "DecisionSink", "LogLimits"]

log = logging.getLogger(__name__)


class DecisionSink(Protocol):
    """Where rows go (``bigfleet.store.decisions.DecisionStore``)."""

    async def append(self, entries: list[Decision]) -> int:
        """Write a batch; raises on a database failure (the batch is kept and retried)."""
        ...

    async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
        """Drop the shard's rows past retention and past the cap."""
        ...


@dataclass(frozen=True, slots=True)
class LogLimits:
    """The log's bounds (ADR 0143: a week, a million rows per shard)."""

    retention_seconds: float = 7 * 24 * 3600.0
    max_rows_per_shard: int = 1_000_000
    buffer_rows: int = 50_000
    batch_rows: int = 5_000
    flush_interval_s: float = 1.0
    prune_every_s: float = 300.0
    repeat_seconds: float = 600.0
    pending_cycles: int = 120
    build_slice_rows: int = 500


class DecisionLog:
    """One shard's decision log writer (see module docstring)."""

    def __init__(
        self,
        shard_id: str,
        sink: DecisionSink,
        *,
        limits: LogLimits | None = None,
        clock: Callable[[], float],
    ) -> None:
        self.shard_id = shard_id
        self.limits = limits or LogLimits()
        self._sink = sink
        self._clock = clock
        self._buffer: deque[Decision] = deque(maxlen=self.limits.buffer_rows)
        self._deferred: deque[Iterator[Decision]] = deque()
        self.dropped_cycles = 0
        self._last_said: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        # Keys of repeatable rows the cycle being built has said so far (``build``).
        self._seen: set[tuple[str, str, str, str]] = set()
        self.written = 0
        self.dropped = 0
        self._wake = asyncio.Event()

    def defer(self, rows: Iterable[Decision]) -> None:
        """Queue a cycle's rows to be built and buffered by the writer task. O(1)."""
        if len(self._deferred) >= self.limits.pending_cycles:
            self._deferred.popleft()
            self._seen = set()  # what a dropped cycle said so far does not count
            self.dropped_cycles += 1
            log.warning("shard %s: decision log behind; a cycle's rows dropped", self.shard_id)
        self._deferred.append(iter(rows))
        self._wake.set()

    async def build(self) -> int:
        """Build and buffer every deferred cycle's rows, yielding to the loop between slices."""
        built = 0
        size = self.limits.build_slice_rows
        while self._deferred:
            rows = list(itertools.islice(self._deferred[0], size))
            built += self._buffer_rows(rows, self._seen)
            if len(rows) < size:
                # The cycle is all built: what it did not say again is news next time.
                self._deferred.popleft()
                self._forget_unseen(self._seen)
                self._seen = set()
            await asyncio.sleep(0)
        return built

    def _buffer_rows(self, rows: Iterable[Decision], seen: set[tuple[str, str, str, str]]) -> int:
        """Buffer part of a cycle's rows (repeats of ``unmet``/``held`` suppressed), adding
        the keys of its repeatable rows to ``seen``. Never blocks."""
        added = 0
        limits = self.limits
        buffer = self._buffer
        for row in rows:
            if row.kind in ("unmet", "held") or row.mode == "dry-run":
                key = (row.kind, row.machine_id, row.cluster_id, row.need_key)
                seen.add(key)
                said = self._last_said.get(key)
                if (
                    said is not None
                    and said[0] == row.reason
                    and row.decided_at - said[1] < limits.repeat_seconds
                ):
                    continue
                self._last_said[key] = (row.reason, row.decided_at)
            if len(buffer) == buffer.maxlen:
                self.dropped += 1
                metrics.DECISIONS_DROPPED.labels(self.shard_id).inc()
            buffer.append(row)
            added += 1
        if len(buffer) >= limits.batch_rows:
            self._wake.set()
        return added

    def _forget_unseen(self, seen: set[tuple[str, str, str, str]]) -> None:
        """A cycle ended: a need satisfied, a hold released, is news again when it reappears."""
        if len(seen) < len(self._last_said):
            for key in [k for k in self._last_said if k not in seen]:
                del self._last_said[key]

    @property
    def pending(self) -> int:
        """Rows buffered and not yet written."""
        return len(self._buffer)

    async def flush(self) -> int:
        """Build what was deferred, then write everything buffered, in batches. Returns rows
        written; raises on failure, leaving the unwritten rows buffered."""
        await self.build()
        total = 0
        while self._buffer:
            batch = [self._buffer[i] for i in range(min(self.limits.batch_rows, len(self._buffer)))]
            await self._sink.append(batch)
            for _ in batch:
                self._buffer.popleft()
            total += len(batch)
            self.written += len(batch)
            metrics.DECISIONS_WRITTEN.labels(self.shard_id).inc(len(batch))
        return total

    async def prune(self) -> int:
        """Apply retention and the row cap to this shard's rows."""
        return await self._sink.prune(
            self.shard_id,
            retention_seconds=self.limits.retention_seconds,
            max_rows=self.limits.max_rows_per_shard,
        )

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` (or when a batch is full) and prune now and then,
        until cancelled; a failing write is logged and retried at the next tick."""
        next_prune = self._clock()
        while True:
            await wait_set(self._wake, self.limits.flush_interval_s)
            self._wake.clear()
            try:
                await self.flush()
                if self._clock() >= next_prune:
                    await self.prune()
                    next_prune = self._clock() + self.limits.prune_every_s
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning(
                    "shard %s: decision log write failed; retrying", self.shard_id, exc_info=True
                )
