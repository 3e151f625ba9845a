"""Roll-ups accepted but not yet applied: the hand-off between the ack path and the engine.

    Session thread:  Intake.offer(): judge once -> ValidatedRollup -> stage -> ack
    shard loop:      Intake.take() -> engine.apply_rollup(validated)   (slices of a few ms)
                     Intake.take_all() before every cycle              (the cycle sees every ack)

An acknowledged roll-up is one the shard has validated and will apply before
its next decision cycle, unless a newer one from the same cluster replaces
it first. It is validated here, once, on the sessions thread — by the
engine's own rules and its clock-skew bound
(``shard_engine.needs.ValidatedRollup.check``), so a refusal reaches the
operator as ``rollup-rejected`` naming the field (ADR 0110) — and the
engine applies the :class:`~shard_engine.needs.ValidatedRollup` without
judging it again (ADR 0145). The one cache is each cluster's last accepted
``ValidatedRollup``: the next roll-up of the cluster reuses its rows (the
Session port hands back the very ``Need`` objects for needs re-sent
unchanged, so an unchanged re-send costs one comparison).

Whether the cluster is leaving this shard (``deferral``) is decided here
too, once, under the intake's lock: a departure calls :meth:`drop_staged`
under the same lock, so a roll-up is either deferred at its ack or staged
before the departure and dropped by it — never applied after it.

Only the newest roll-up of a cluster is kept: roll-ups are full
replacements, so a newer one makes an older unapplied one moot; the older
one is dropped (counted as ``superseded``), not applied, and the intake
holds at most one roll-up per cluster.

Thread-safe: :meth:`offer` runs on the session thread, the rest on the shard's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shard_engine.model import Rollup
from shard_engine.needs import ValidatedRollup

__all__ = ["DEFERRED", "STALE", "Intake"]

STALE = "rollup-stale"
DEFERRED = "rollup-deferred"


def _never(_cluster_id: str) -> str:
    return ""


class Intake:
    """The newest unapplied roll-up per cluster, and each cluster's newest timestamp."""

    def __init__(
        self,
        *,
        on_ready: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        max_skew_s: float | None = 300.0,
        deferral: Callable[[str], str] = _never,
    ) -> None:
        self._lock = threading.Lock()
        self._staged: dict[str, ValidatedRollup] = {}
        self._newest: dict[str, int] = {}
        # Per cluster: its last accepted roll-up, what validating the next one reuses.
        self._accepted: dict[str, ValidatedRollup] = {}
        self._on_ready = on_ready
        self._on_dropped: Callable[[str], None] | None = None
        self._clock = clock
        self._max_skew_s = max_skew_s
        self._deferral = deferral
        self.offered = 0
        self.superseded = 0

    def set_on_ready(self, on_ready: Callable[[], None]) -> None:
        """Called (from the offering thread) when the intake goes from empty to not empty."""
        self._on_ready = on_ready

    def set_deferral(self, deferral: Callable[[str], str]) -> None:
        """Why a cluster's roll-ups are deferred ('' when not); asked under the intake's lock."""
        self._deferral = deferral

    def set_on_dropped(self, listener: Callable[[str], None]) -> None:
        """Called once per acknowledged roll-up dropped unapplied: with ``superseded`` (a newer
        one of its cluster replaced it) or ``departed`` (its cluster started leaving)."""
        self._on_dropped = listener

    def offer(self, rollup: Rollup) -> str:
        """Judge a roll-up once and stage it; the acknowledgement echo.

        ``rollup``, or ``rollup-stale: ...`` (older than the newest accepted
        for the cluster) or ``rollup-deferred: ...`` (the cluster is leaving
        this shard). Raises ``RollupRejected`` naming the field when the
        engine's rules or the clock-skew bound refuse it; nothing is staged or
        remembered then.
        """
        cluster = rollup.cluster_id
        with self._lock:
            previous = self._accepted.get(cluster)
        validated = ValidatedRollup.check(
            rollup, previous, now=self._clock(), max_skew_seconds=self._max_skew_s
        )
        return self.stage(validated)

    def stage(self, validated: ValidatedRollup) -> str:
        """Stage a roll-up judged already; the acknowledgement echo, as :meth:`offer`'s.

        :meth:`offer` calls it after judging; the engine process of a shard
        with edge processes calls it with what an edge judged and relayed
        (``bigfleet.edge``, ADR 0147).
        """
        rollup = validated.rollup
        cluster = rollup.cluster_id
        dropped = False
        with self._lock:
            deferred = self._deferral(cluster)
            if deferred:
                return f"{DEFERRED}: {deferred}"
            newest = self._newest.get(cluster)
            if newest is not None and rollup.timestamp_ns < newest:
                return f"{STALE}: timestamp {rollup.timestamp_ns} older than {newest}"
            self._newest[cluster] = rollup.timestamp_ns
            self._accepted[cluster] = validated
            was_empty = not self._staged
            if self._staged.pop(cluster, None) is not None:
                self.superseded += 1
                dropped = True
            self._staged[cluster] = validated
            self.offered += 1
        if dropped and self._on_dropped is not None:
            self._on_dropped("superseded")
        if was_empty and self._on_ready is not None:
            self._on_ready()
        return "rollup"

    def take(self, limit: int) -> list[ValidatedRollup]:
        """Up to ``limit`` staged roll-ups, oldest first."""
        with self._lock:
            out: list[ValidatedRollup] = []
            while self._staged and len(out) < limit:
                cluster = next(iter(self._staged))
                out.append(self._staged.pop(cluster))
            return out

    def take_all(self) -> list[ValidatedRollup]:
        with self._lock:
            out = list(self._staged.values())
            self._staged.clear()
            return out

    def drop_staged(self, cluster_id: str) -> bool:
        """The cluster started leaving: its staged roll-up is not applied. True if one was."""
        with self._lock:
            dropped = self._staged.pop(cluster_id, None) is not None
        if dropped and self._on_dropped is not None:
            self._on_dropped("departed")
        return dropped

    def accepted(self) -> list[ValidatedRollup]:
        """Each cluster's last accepted roll-up (an edge resends them to a restarted engine)."""
        with self._lock:
            return list(self._accepted.values())

    def forget(self, cluster_id: str) -> None:
        """The cluster left this shard: drop its staged roll-up, its timestamp and its cache."""
        with self._lock:
            self._staged.pop(cluster_id, None)
            self._newest.pop(cluster_id, None)
            self._accepted.pop(cluster_id, None)

    def __len__(self) -> int:
        return len(self._staged)
