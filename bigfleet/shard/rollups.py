"""The shard's side of its operator sessions: who may connect, and roll-ups into the engine.

    Hello            admit_cluster   the shard acts, the cluster is ours (Admissions:
                                     batched look-ups), its moved machines adopted
    roll-up (ack)    apply_rollup    judged once into a ValidatedRollup and staged in the
                                     Intake, or deferred while the cluster moves away
                                     (sessions thread)
    shard loop       run / apply     staged roll-ups -> engine.apply_rollup, a few ms at
                                     a time; every one before a cycle (apply_staged)
    acknowledgement  ack_fields      (highest coordinator term seen, lease epoch)

This is the :class:`~bigfleet.shard.sessions.RollupSink` the Session port
serves. The acknowledgement never waits for the engine (ADR 0066).

Every acknowledged roll-up is counted once in ``bigfleet_shard_rollups_total``
with its final outcome: ``rejected``, ``stale`` or ``deferred`` when the ack
says so; ``superseded`` when a newer roll-up of its cluster replaced it
before it was applied (it is dropped, not applied); ``departed`` when its
cluster started leaving first; else the engine's verdict (``applied``,
``quarantined``, ``stale``). The sum over outcomes is the number of acks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from bigfleet.metrics import ROLLUPS
from bigfleet.shard.admissions import Admissions
from bigfleet.shard.intake import DEFERRED, STALE, Intake
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.membership import ShardMembership
from bigfleet.shard.sessions import ShardUnavailable
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.engine import ShardEngine
from shard_engine.model import Rollup
from shard_engine.needs import ValidatedRollup

log = logging.getLogger(__name__)

__all__ = ["SessionSink"]


class SessionSink:
    """Admits operators and feeds their acknowledged roll-ups to the engine."""

    def __init__(
        self,
        *,
        shard_id: str,
        acting: Callable[[], bool],
        lease: LeaseKeeper,
        admissions: Admissions,
        membership: ShardMembership,
        intake: Intake,
        engine: ShardEngine,
        terms: CoordinatorTerms,
        clock: Callable[[], float],
        slice_s: float,
        coalesce_s: float,
    ) -> None:
        self._shard_id = shard_id
        self._acting = acting
        self._lease = lease
        self._admissions = admissions
        self._membership = membership
        self.intake = intake
        self._engine = engine
        self._terms = terms
        self._clock = clock
        self._slice_s = slice_s
        self._coalesce_s = coalesce_s
        self._staged = asyncio.Event()
        intake.set_deferral(membership.deferral)
        intake.set_on_dropped(self.settled)
        membership.on_departure(intake.drop_staged)

    async def admit_cluster(self, cluster_id: str) -> None:
        """Refuse while the shard does not act, or when another shard serves the cluster."""
        if not self._acting():
            raise ShardUnavailable(
                f"shard {self._shard_id} is not acting (it cannot prove it holds its lease); "
                "reconnect"
            )
        owner = await self._admissions.owner(cluster_id)
        if owner != self._shard_id:
            raise await self._membership.elsewhere(cluster_id, owner)
        # A cluster that just moved here may connect before its machines were adopted.
        await self._membership.adopt_bound(cluster_id)

    def apply_rollup(self, rollup: Rollup) -> str:
        """Judge a roll-up and stage it for the engine (called on the sessions thread).

        The acknowledgement does not wait for the engine: the roll-up is
        applied within milliseconds by :meth:`run`, and in any case before
        the next cycle (ADR 0066). Raises ``RollupRejected`` naming the field
        (the Session port counts that refusal, :meth:`settled`).
        """
        echo = self.intake.offer(rollup)
        if echo.startswith(STALE):
            self.settled("stale")
        elif echo.startswith(DEFERRED):
            self.settled("deferred")
        return echo

    def settled(self, outcome: str, count: int = 1) -> None:
        """Count ``count`` acknowledged roll-ups' final outcome (from either thread)."""
        ROLLUPS.labels(self._shard_id, outcome).inc(count)

    def relayed(self, rollup: ValidatedRollup) -> None:
        """Stage a roll-up an edge process judged and acknowledged ``rollup`` (ADR 0147).

        Its ack is already sent; what happens here is its final outcome: the
        engine's verdict once applied, ``superseded`` if a newer one of its
        cluster arrives first, ``departed`` if its cluster started leaving
        while it was on its way, ``stale`` if the engine holds a newer one.
        """
        echo = self.intake.stage(rollup)
        if echo.startswith(STALE):
            self.settled("stale")
        elif echo.startswith(DEFERRED):
            self.settled("departed")

    def ack_fields(self) -> tuple[int, int]:
        """(highest coordinator term seen, lease epoch) for every acknowledgement."""
        return self._terms.highest, self._lease.epoch

    def apply(self, rollup: ValidatedRollup, *, counted: bool = True) -> None:
        """Apply one staged, validated roll-up to the engine (on the shard's loop).

        Nothing is judged again here: not the rules, not the clock, not the
        cluster's departure (a departure drops the staged roll-up, see
        ``Intake.drop_staged``). ``counted=False``: a roll-up an edge resends
        to a restarted engine process, acknowledged (and counted) before.
        """
        try:
            result = self._engine.apply_rollup(rollup, now=self._clock())
        except ValueError as err:
            if counted:
                ROLLUPS.labels(self._shard_id, "rejected").inc()
            log.warning("cluster %s: roll-up refused by the engine: %s", rollup.cluster_id, err)
            return
        if counted:
            ROLLUPS.labels(self._shard_id, result.status).inc()
        if result.status == "quarantined":
            log.info("cluster %s: roll-up quarantined: %s", rollup.cluster_id, result.detail)

    def apply_staged(self) -> int:
        """Apply every staged roll-up now (before a cycle). Returns how many."""
        staged = self.intake.take_all()
        for rollup in staged:
            self.apply(rollup)
        return len(staged)

    async def run(self) -> None:
        """Apply staged roll-ups as they come, a few milliseconds at a time.

        The applier waits ``coalesce_s`` after the first roll-up arrives, so a
        cluster that sends faster than that has only its newest roll-up
        applied; the engine's needs lag the acks by about that much, and
        never beyond the next cycle (the cycle applies what is staged).
        """
        loop = asyncio.get_running_loop()

        def ready() -> None:
            loop.call_soon_threadsafe(self._staged.set)

        self.intake.set_on_ready(ready)
        while True:
            await self._staged.wait()
            # Let a cluster's roll-ups coalesce: only the newest one is applied.
            await asyncio.sleep(self._coalesce_s)
            self._staged.clear()
            while len(self.intake):
                deadline = time.monotonic() + self._slice_s
                while time.monotonic() < deadline:
                    batch = self.intake.take(16)
                    if not batch:
                        break
                    for rollup in batch:
                        self.apply(rollup)
                await asyncio.sleep(0)
