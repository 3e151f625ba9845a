"""Roll-ups accepted but not yet applied: the hand-off between the ack path and the engine.

    Session thread:  validate -> Intake.offer() -> ack          (never touches the engine)
    shard loop:      Intake.take() -> engine.apply_rollup()      (in slices of a few ms)
                     Intake.take_all() before every cycle        (the cycle sees every ack)

An acknowledged roll-up is one the shard has validated and will apply before
its next decision cycle. "Validated" means by the engine's own rules
(``shard_engine.needs.validate_rollup``: names, ranges, requirements,
spreads, counts) and its clock-skew bound (``check_clock``), run here on the
sessions thread so a refusal reaches the operator as ``rollup-rejected``
naming the field (ADR 0110). Each cluster's last accepted rows are kept so
that a row re-sent unchanged, or changed only in size, is not checked in
full again. The engine's later verdict (applied, or quarantined as a
suspicious drop) is logged and counted rather than sent back.

Only the newest roll-up of a cluster is kept: roll-ups are full
replacements, so a newer one makes an older unapplied one moot, and the
intake holds at most one roll-up per cluster.

Thread-safe: :meth:`offer` runs on the session thread, the rest on the shard's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shard_engine.model import Rollup
from shard_engine.needs import Validated, check_clock, validate_rollup

__all__ = ["STALE", "Intake"]

STALE = "rollup-stale"


class Intake:
    """The newest unapplied roll-up per cluster, and each cluster's newest timestamp."""

    def __init__(
        self,
        *,
        on_ready: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        max_skew_s: float | None = 300.0,
    ) -> None:
        self._lock = threading.Lock()
        self._staged: dict[str, Rollup] = {}
        self._newest: dict[str, int] = {}
        self._validated: dict[str, tuple[Validated, ...]] = {}
        self._on_ready = on_ready
        self._clock = clock
        self._max_skew_s = max_skew_s
        self.offered = 0
        self.superseded = 0

    def set_on_ready(self, on_ready: Callable[[], None]) -> None:
        """Called (from the offering thread) when the intake goes from empty to not empty."""
        self._on_ready = on_ready

    def offer(self, rollup: Rollup) -> str:
        """Check a roll-up and stage it; the acknowledgement echo (``rollup`` or stale).

        Raises ``RollupRejected`` naming the field when the engine's rules or
        the clock-skew bound refuse it; nothing is staged or remembered then.
        """
        check_clock(rollup.timestamp_ns, now=self._clock(), max_skew_seconds=self._max_skew_s)
        with self._lock:
            previous = self._validated.get(rollup.cluster_id, ())
        _, validated = validate_rollup(rollup, previous)
        with self._lock:
            newest = self._newest.get(rollup.cluster_id)
            if newest is not None and rollup.timestamp_ns < newest:
                return f"{STALE}: timestamp {rollup.timestamp_ns} older than {newest}"
            self._newest[rollup.cluster_id] = rollup.timestamp_ns
            self._validated[rollup.cluster_id] = validated
            was_empty = not self._staged
            if self._staged.pop(rollup.cluster_id, None) is not None:
                self.superseded += 1
            self._staged[rollup.cluster_id] = rollup
            self.offered += 1
        if was_empty and self._on_ready is not None:
            self._on_ready()
        return "rollup"

    def take(self, limit: int) -> list[Rollup]:
        """Up to ``limit`` staged roll-ups, oldest first."""
        with self._lock:
            out: list[Rollup] = []
            while self._staged and len(out) < limit:
                cluster = next(iter(self._staged))
                out.append(self._staged.pop(cluster))
            return out

    def take_all(self) -> list[Rollup]:
        with self._lock:
            out = list(self._staged.values())
            self._staged.clear()
            return out

    def forget(self, cluster_id: str) -> None:
        """The cluster left this shard: drop its staged roll-up and its timestamp."""
        with self._lock:
            self._staged.pop(cluster_id, None)
            self._newest.pop(cluster_id, None)
            self._validated.pop(cluster_id, None)

    def __len__(self) -> int:
        return len(self._staged)
