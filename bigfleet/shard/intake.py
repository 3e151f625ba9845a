"""Roll-ups accepted but not yet applied: the hand-off between the ack path and the engine.

    Session thread:  validate -> Intake.offer() -> ack          (never touches the engine)
    shard loop:      Intake.take() -> engine.apply_rollup()      (in slices of a few ms)
                     Intake.take_all() before every cycle        (the cycle sees every ack)

An acknowledged roll-up is one the shard has validated and will apply before
its next decision cycle. "Validated" means by the engine's own rules
(``shard_engine.needs.validate_rollup``: names, ranges, requirements,
spreads, counts) and its clock-skew bound (``check_clock``), run here on the
sessions thread so a refusal reaches the operator as ``rollup-rejected``
naming the field (ADR 0110). Each cluster's last accepted rows are kept:
a row that *is* one of them (the edge hands back the same object for a
need re-sent unchanged, ``convert.rollup_from_wire``) was checked already
and is not looked at again; only the other rows go through the engine's
validator, each beside its predecessor at the same index, so one changed
only in size is not checked in full either. The engine's later verdict
(applied, or quarantined as a suspicious drop) is logged and counted rather
than sent back.

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
from shard_engine.needs import (
    MAX_NEEDS,
    RollupRejected,
    Validated,
    check_clock,
    validate_rollup,
)

__all__ = ["STALE", "Intake"]

STALE = "rollup-stale"

_Accepted = tuple[tuple[Validated, ...], dict[int, Validated]]
"""A cluster's last accepted rows, in order, and the same rows by ``id`` of the need sent."""


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
        # Per cluster: its last accepted rows as validated (index-aligned), and
        # those rows by identity (every one of them passed the engine's rules).
        self._validated: dict[str, _Accepted] = {}
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
            previous = self._validated.get(rollup.cluster_id)
        validated = _check(rollup, previous)
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


def _check(rollup: Rollup, previous: _Accepted | None) -> _Accepted:
    """Run the engine's rules over the rows not already accepted; what to remember.

    Raises ``RollupRejected`` with the field path of the whole roll-up
    (``needs[i]`` counts every row, checked or not).
    """
    rows, accepted = previous if previous is not None else ((), {})
    needs = rollup.needs
    known = [accepted.get(id(need)) for need in needs]
    fresh = [i for i, row in enumerate(known) if row is None or row[0] is not needs[i]]
    if len(needs) > MAX_NEEDS or len(fresh) == len(needs):
        _, checked = validate_rollup(rollup, rows)
    else:
        # The roll-up's own fields, and every row not accepted before beside its
        # predecessor at the same index (``fresh`` ascends, so those are a prefix).
        subset = Rollup(
            rollup.cluster_id,
            rollup.timestamp_ns,
            tuple(needs[i] for i in fresh),
            reported_nodes=rollup.reported_nodes,
            release=rollup.release,
        )
        try:
            _, some = validate_rollup(subset, tuple(rows[i] for i in fresh if i < len(rows)))
        except RollupRejected as err:
            raise RollupRejected(_renumbered(err.field, fresh), err.reason) from None
        merged: list[Validated | None] = known
        for i, row in zip(fresh, some, strict=True):
            merged[i] = row
        checked = tuple(row for row in merged if row is not None)
    return checked, {id(row[0]): row for row in checked}


def _renumbered(field: str, fresh: list[int]) -> str:
    """``needs[j]...`` of the checked subset as ``needs[i]...`` of the roll-up."""
    if not field.startswith("needs["):
        return field
    index, bracket, rest = field[len("needs[") :].partition("]")
    if not bracket or not index.isdigit() or int(index) >= len(fresh):
        return field
    return f"needs[{fresh[int(index)]}]{rest}"
