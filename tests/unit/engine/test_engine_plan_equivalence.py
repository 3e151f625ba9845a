"""Decisions stay the same while the engine is made faster.

``plan_history`` runs seeded random histories (roll-ups, cycles, dry runs,
settles with failures, observations, removals, pauses, forgotten clusters,
claims) and writes down everything the engine decided. The digests in
``plan_digests.json`` were recorded before the cycle emitted its actions as
arrays; the same inputs must still give the same plans, shortfalls,
reasons and in-flight sets.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.unit.engine.plan_history import DIGESTS, SEEDS, digest

RECORDED: dict[str, str] = json.loads(DIGESTS.read_text())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_history_decides_exactly_as_recorded(seed: int) -> None:
    found, _ = digest(seed)

    assert found == RECORDED[str(seed)], (
        f"seed {seed}: the engine decided differently from the recorded history"
    )


def test_the_recorded_histories_exercise_every_kind_of_action() -> None:
    kinds: Counter[str] = Counter()
    for seed in SEEDS[:8]:
        kinds += digest(seed)[1]

    assert set(kinds) == {"AssignIdle", "Provision", "Preempt", "Reclaim", "Release", "Verify"}
