"""Safe adoption at the actuator seam: shadow mode, pause and dry run, and the decision log.

    controls (PostgreSQL) --refresh, before every cycle--> Modes --> engine.paused,
                                                                    cycle(dry_run=...)
    ShardCore --Operation--> GatedActuator --active--> Executor (workflows)
                                  │ shadow: nothing starts; the machine stays marked
                                  │ paused / dry run: nothing starts; the core settles it
    Plan + engine.holds --after_cycle--> DecisionLog (bounded buffer -> PostgreSQL)

Three switches, each stopping everything new from starting:

- **Shadow** (``BIGFLEET_MODE=shadow``, for the process's life). The shard
  takes roll-ups and Hellos and runs its cycles; every operation is
  recorded and swallowed: no workflow, so no provider mutation, reclaim
  instruction or bootstrap request. Its machines stay marked as on their
  way, so a would-be action is decided (and recorded) once, not every
  cycle, until a plausible delay has passed; then the operation settles in
  the shard's memory only (``virtual.py``), so later cycles can reclaim
  what demand no longer needs. It sends no coordinator report and runs no reconcile repairs,
  so nothing outside learns of decisions that were never carried out.
- **Pause** (``bigfleet pause``, durable). The engine plans with no actions
  (why-not ``actuation paused``); any operation that still reaches the
  actuator — a coordinator's cross-shard drain — is refused and its
  machines planned again after resume. In-flight workflows finish
  (ADR 0142).
- **Dry run** (``bigfleet pause --dry-run``, durable). Cycles run with
  ``dry_run`` (nothing is marked) and the plan is recorded, not started.

A control read that fails keeps the last one known; a process starts
with a read before its first cycle, so a restarted or taken-over shard
that was paused never acts in between.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass

from bigfleet import metrics
from bigfleet.aio import within
from bigfleet.decisions import DecisionLog, Mode, decisions_of
from bigfleet.shard.core import Actuator, Operation, Started, machines_of
from bigfleet.shard.marks import ModeMarker
from bigfleet.shard.virtual import VirtualSettlement
from bigfleet.store.controls import Control, ControlStore
from shard_engine.engine import ShardEngine
from shard_engine.model import Plan
from workflows.contracts import SHARD_ACTIVE, SHARD_DRY_RUN, SHARD_PAUSED

__all__ = ["Adoption", "GatedActuator", "Modes"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Modes:
    """What the shard may do right now (see the module docstring)."""

    shadow: bool = False
    paused: bool = False
    dry_run: bool = False
    reason: str = ""

    @property
    def mode(self) -> Mode:
        """The decision log's word for it (shadow before paused before dry run)."""
        if self.shadow:
            return Mode.SHADOW
        if self.paused:
            return Mode.PAUSED
        if self.dry_run:
            return Mode.DRY_RUN
        return Mode.ACTIVE

    @property
    def shard_mode(self) -> str:
        """The BigFleetShardMode value of what this shard starts or has in flight (ADR 0153).

        Shadow is not one: a shadow shard starts nothing for its own
        decisions, and an operator's command it carries out does act.
        """
        if self.paused:
            return SHARD_PAUSED
        if self.dry_run:
            return SHARD_DRY_RUN
        return SHARD_ACTIVE


class GatedActuator:
    """An actuator that passes operations to ``inner`` only while the shard is active."""

    def __init__(
        self, inner: Actuator, modes: Modes, *, settlement: VirtualSettlement | None = None
    ) -> None:
        self._inner = inner
        self._modes = modes
        # Shadow mode: would-be operations settle in memory after a delay (virtual.py).
        self._settlement = settlement
        #: Operations withheld, by the mode that withheld them (tests and `bigfleet shards`).
        self.withheld: Counter[str] = Counter()

    @property
    def acting(self) -> bool:
        return self._inner.acting

    async def start(self, op: Operation) -> Started:
        modes = self._modes
        if modes.shadow:
            self.withheld[Mode.SHADOW] += 1
            if self._settlement is not None:
                self._settlement.record(op)  # settles in memory once a plausible delay passed
            return Started()  # the machine stays marked until then: decided once, recorded once
        if modes.paused or modes.dry_run:
            self.withheld[modes.mode] += 1
            return Started(refused=machines_of(op))
        return await self._inner.start(op)


class Adoption:
    """A shard's controls and decision log, driven by the shard process's loops."""

    def __init__(
        self,
        *,
        shard_id: str,
        engine: ShardEngine,
        modes: Modes,
        controls: ControlStore | None,
        decisions: DecisionLog | None,
        marker: ModeMarker | None = None,
        read_timeout_s: float = 1.0,
    ) -> None:
        self.shard_id = shard_id
        self.modes = modes
        self.control = Control(shard_id)
        self._engine = engine
        self._controls = controls
        self._decisions = decisions
        self._marker = marker
        self._read_timeout_s = read_timeout_s
        metrics.SHARD_SHADOW.labels(shard_id).set(1 if modes.shadow else 0)
        self._publish()

    @property
    def dry_run(self) -> bool:
        """Plan without marking anything (dry run; a paused engine plans no actions)."""
        return self.modes.dry_run and not self.modes.shadow

    @property
    def reaches_out(self) -> bool:
        """May the shard report to the coordinator and repair drift? Not in shadow mode."""
        return not self.modes.shadow

    @property
    def decisions(self) -> DecisionLog | None:
        return self._decisions

    async def start(self) -> None:
        """Say whether this process runs in shadow mode (for ``bigfleet shards``), then read
        the controls before the first cycle. A failure is logged: the loop reads again."""
        if self._controls is not None:
            try:
                await within(
                    self._controls.publish_shadow(self.shard_id, shadow=self.modes.shadow),
                    self._read_timeout_s,
                )
            except Exception:
                log.warning("shard %s: could not publish its mode", self.shard_id, exc_info=True)
        await self.refresh()

    async def refresh(self) -> Control:
        """Read the shard's control (its row with ``*``) and apply it; keeps the last on failure."""
        if self._controls is None:
            return self.control
        try:
            control = await within(self._controls.get(self.shard_id), self._read_timeout_s)
        except Exception:
            log.warning(
                "shard %s: reading pause/dry run failed; keeping %s",
                self.shard_id,
                self.modes.mode,
                exc_info=True,
            )
            return self.control
        if (control.paused, control.dry_run) != (self.modes.paused, self.modes.dry_run):
            log.warning(
                "shard %s: paused=%s dry_run=%s (%s, by %s)",
                self.shard_id,
                control.paused,
                control.dry_run,
                control.reason or "no reason given",
                control.changed_by or "unknown",
            )
        self.control = control
        self.modes.paused = control.paused
        self.modes.dry_run = control.dry_run
        self.modes.reason = control.reason
        self._publish()
        if self._marker is not None and not self.modes.shadow:
            self._marker.observe(self.modes.shard_mode, control.reason)
        return control

    def _publish(self) -> None:
        self._engine.paused = self.modes.paused
        metrics.SHARD_PAUSED.labels(self.shard_id).set(1 if self.modes.paused else 0)
        metrics.SHARD_DRY_RUN.labels(self.shard_id).set(1 if self.modes.dry_run else 0)

    def after_cycle(self, plan: Plan, *, cycle: int) -> None:
        """Hand a cycle's decisions (actions, holds, unmet needs) to the decision log."""
        holds = self._engine.holds
        for cause, count in Counter(h.cause for h in holds).items():
            metrics.DRAINS_HELD.labels(self.shard_id, cause).inc(count)
        if self._decisions is None:
            return
        # Built by the writer task, off the cycle: the plan and the holds are immutable.
        self._decisions.defer(
            decisions_of(
                plan,
                shard_id=self.shard_id,
                cycle=cycle,
                mode=self.modes.mode,
                holds=holds,
                profile_of=self._engine.profile_of,
            )
        )

    async def run(self) -> None:
        """Write the decision log until cancelled."""
        if self._decisions is not None:
            await self._decisions.run()

    async def close(self, *, timeout_s: float = 2.0) -> None:
        """Write what is buffered, briefly (a stopping process must not hang on its log)."""
        if self._marker is not None:
            await self._marker.close()
        if self._decisions is not None:
            with contextlib.suppress(Exception):
                await within(self._decisions.flush(), timeout_s)
