"""Applying a plain roll-up to an engine in tests: validate it, then apply it.

``ShardEngine.apply_rollup`` takes only a ``ValidatedRollup`` (ADR 0145), so
production's single validation path — ``ShardEngine.validate`` (or the
Session port's intake) — is the only one. Tests build plain ``Rollup``
values; this is the one place they are judged on the way in, so a test that
expects a ``RollupRejected`` still sees it, raised by the validation.
"""

from __future__ import annotations

from shard_engine.engine import RollupOutcome, ShardEngine
from shard_engine.model import Rollup


def apply(engine: ShardEngine, rollup: Rollup, *, now: float) -> RollupOutcome:
    """Validate ``rollup`` by the engine's rules at ``now`` and apply it; the outcome.

    Raises ``RollupRejected`` naming the field, leaving the needs in force.
    """
    return engine.apply_rollup(engine.validate(rollup, now=now), now=now)
