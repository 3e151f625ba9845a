"""Announced interruptions: a warned machine is drained and replaced in the same cycle.

The trace, worked out on paper: cluster c1 needs 12 cores and holds three
configured 4-core spot machines (exactly covered). The provider then warns
that ``spot-0001`` will be interrupted (probability 0.99). The cluster is
now short by that machine's 4 cores, so the cycle drains it (reason
``interruption``, the configured grace) and covers the 4 cores with one
new machine. A cheaper idle machine that is itself under a warning is not
the replacement. Nothing else happens: no reclaim (no excess), no second
replacement while the first is on its way.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bigfleet.decisions.entries import Mode, decisions_of
from shard_engine.budgets import Budget, DrainReason
from shard_engine.config import EngineConfig
from shard_engine.engine import ShardEngine
from shard_engine.model import (
    REASON_INTERRUPTION,
    AssignIdle,
    CapacityType,
    MachineState,
    Provision,
    Reclaim,
    Release,
)
from tests.rollups import apply
from tests.unit.engine.engine_fleet import (
    Carrier,
    fleet,
    machine,
    machine_ids,
    need,
    of_kind,
    rollup,
)

SPOT = {"capacity_type": CapacityType.SPOT, "price": 0.3, "probability": 0.05}


def covered(config: EngineConfig | None = None) -> tuple[ShardEngine, list[str]]:
    """c1 needs 12 cores and holds three 4-core spot machines; three on-demand slots are free."""
    engine = ShardEngine(config or EngineConfig())
    held = fleet(engine, 3, prefix="spot", state=MachineState.CONFIGURED, cluster="c1", **SPOT)
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE, price=1.0)
    apply(engine, rollup("c1", 1, need(cpu=12)), now=1)
    assert engine.cycle(now=1).actions == ()  # exactly covered
    return engine, held


def warn(engine: ShardEngine, machine_id: str, probability: float = 0.99) -> None:
    record = engine.machine(machine_id)
    assert record is not None
    engine.upsert_machine(replace(record, interruption_probability=probability), now=2)


def test_a_warned_machine_is_drained_and_replaced_in_the_same_cycle() -> None:
    engine, held = covered()
    warn(engine, held[1])

    plan = engine.cycle(now=3)

    [drain] = of_kind(plan, Reclaim)
    assert drain == Reclaim(held[1], "c1", grace_seconds=90, reason=REASON_INTERRUPTION)
    [provision] = of_kind(plan, Provision)
    assert provision.cluster_id == "c1"
    assert len(provision.machine_ids) == 1
    assert machine_ids([provision])[0].startswith("spec-")
    assert len(plan.actions) == 2


def test_the_replacement_is_never_an_idle_machine_under_a_warning() -> None:
    engine, held = covered()
    engine.upsert_machine(
        machine("doomed-idle", capacity_type=CapacityType.SPOT, price=0.1, probability=0.99),
        now=2,
    )
    warn(engine, held[0])

    plan = engine.cycle(now=3)

    assert of_kind(plan, AssignIdle) == []
    [provision] = of_kind(plan, Provision)
    assert "doomed-idle" not in provision.machine_ids


def test_nothing_more_happens_while_the_drain_and_the_replacement_are_in_flight() -> None:
    engine, held = covered()
    warn(engine, held[2])
    engine.cycle(now=3)

    assert engine.cycle(now=4).actions == ()


def test_once_both_settle_the_cluster_is_covered_and_the_drained_machine_is_not_reused() -> None:
    engine, held = covered()
    warn(engine, held[2])
    carrier = Carrier(engine)
    carrier.carry(engine.cycle(now=3), now=4)

    drained = engine.machine(held[2])
    assert drained is not None and drained.state == MachineState.IDLE
    later = carrier.run(now=5, cycles=3)
    assert [a for plan in later for a in plan.actions if not isinstance(a, Release)] == []


def test_a_rebalance_recommendation_below_the_threshold_drains_nothing() -> None:
    engine, held = covered()
    warn(engine, held[1], probability=0.5)

    assert of_kind(engine.cycle(now=3), Reclaim) == []


def test_the_threshold_and_grace_are_settings() -> None:
    config = EngineConfig(interruption_drain_threshold=0.5, interruption_grace_seconds=30)
    engine, held = covered(config)
    warn(engine, held[1], probability=0.5)

    [drain] = of_kind(engine.cycle(now=3), Reclaim)
    assert (drain.machine_id, drain.grace_seconds, drain.reason) == (held[1], 30, "interruption")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("interruption_drain_threshold", 0.0, "interruption_drain_threshold: must be within"),
        ("interruption_drain_threshold", 1.5, "interruption_drain_threshold: must be within"),
        ("interruption_grace_seconds", -1, "interruption_grace_seconds: must not be negative"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_a_dry_run_marks_nothing() -> None:
    engine, held = covered()
    warn(engine, held[1])

    first = engine.cycle(now=3, dry_run=True)
    second = engine.cycle(now=3)

    assert of_kind(first, Reclaim) == of_kind(second, Reclaim)
    assert len(of_kind(second, Provision)) == 1


def test_a_budget_for_reclaim_does_not_hold_an_interruption_drain() -> None:
    engine, held = covered()
    engine.budgets = (Budget("no-reclaim", count=0),)
    warn(engine, held[1])

    plan = engine.cycle(now=3)

    assert [a.machine_id for a in of_kind(plan, Reclaim)] == [held[1]]
    assert engine.holds == ()


def test_a_budget_that_names_interruption_holds_the_drain_but_not_the_replacement() -> None:
    engine, held = covered()
    engine.budgets = (
        Budget("no-interruption-drains", count=0, reasons=frozenset({DrainReason.INTERRUPTION})),
    )
    warn(engine, held[1])

    plan = engine.cycle(now=3)

    assert of_kind(plan, Reclaim) == []
    assert len(of_kind(plan, Provision)) == 1
    [hold] = engine.holds
    assert (hold.machine_id, hold.reason, hold.budget) == (
        held[1],
        DrainReason.INTERRUPTION,
        "no-interruption-drains",
    )


def test_the_decision_log_says_why_the_machine_was_drained() -> None:
    engine, held = covered()
    warn(engine, held[1])
    plan = engine.cycle(now=3)

    rows = list(
        decisions_of(plan, shard_id="s", cycle=2, mode=Mode.ACTIVE, profile_of=engine.profile_of)
    )

    [drained] = [r for r in rows if r.machine_id == held[1]]
    assert drained.kind == "reclaim"
    assert drained.reason.startswith("interruption: its provider announced an interruption")
    assert "0.99" in drained.reason
    assert drained.inputs["interruption_probability"] == pytest.approx(0.99)
