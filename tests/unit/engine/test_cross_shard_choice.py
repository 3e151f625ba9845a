"""A donor's choices for the coordinator: which machines it gives, which it drains.

Pure functions of ``shard_engine.transfers``; cross-shard victims are ordered
by the same victim score as a local preemption (ADR 0004).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.config import EngineConfig
from shard_engine.model import AppClass, CapacityType, MachineRecord, MachineState
from shard_engine.preemption import blend_weights, victim_order, victim_scores
from shard_engine.resources import APP_CLASS_VICTIM_RANK
from shard_engine.transfers import (
    TransferProfile,
    VictimTerms,
    choose_cross_shard_victims,
    choose_donations,
    saturation_of,
)

GPU = TransferProfile("simcloud", "g5.xlarge", "z1", int(CapacityType.ON_DEMAND))
CONFIG = EngineConfig()


def _machine(
    machine_id: str,
    state: MachineState = MachineState.CONFIGURED,
    *,
    cluster: str = "",
    instance_type: str = "g5.xlarge",
    zone: str = "z1",
) -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=state,
        provider="simcloud",
        instance_type=instance_type,
        zone=zone,
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=1.0,
        interruption_probability=0.0,
        allocatable={"cpu": 4.0, "nvidia.com/gpu": 1.0},
        cluster=cluster,
    )


def _victims(
    machines: list[MachineRecord],
    priorities: dict[str, int],
    *,
    preemptor: int = 900_000,
    count: int = 10,
    busy: frozenset[str] = frozenset(),
    terms: dict[str, VictimTerms] | None = None,
    drain: dict[str, float] | None = None,
    saturation: float = 0.0,
) -> list[str]:
    chosen = choose_cross_shard_victims(
        machines,
        profile=GPU,
        preemptor_priority=preemptor,
        count=count,
        busy=busy,
        priorities=priorities,
        terms=terms or {},
        drain_seconds=drain or {},
        saturation=saturation,
        config=CONFIG,
    )
    return [v.machine_id for v in chosen]


# ------------------------------------------------------------------ donations


def test_a_donor_gives_only_settled_unbound_machines_of_the_instructions_profile() -> None:
    machines = [
        _machine("idle-b", MachineState.IDLE),
        _machine("idle-a", MachineState.IDLE),
        _machine("idle-busy", MachineState.IDLE),
        _machine("idle-bound", MachineState.IDLE, cluster="c1"),
        _machine("idle-other-zone", MachineState.IDLE, zone="z2"),
        _machine("idle-other-type", MachineState.IDLE, instance_type="m6i.large"),
        _machine("spec-1", MachineState.SPECULATIVE),
        _machine("configuring", MachineState.CONFIGURING),
    ]
    chosen = choose_donations(
        machines, profile=GPU, state=MachineState.IDLE, count=5, busy={"idle-busy"}
    )
    assert [r.id for r in chosen] == ["idle-a", "idle-b"], "by id, and only what is free"
    spec = choose_donations(
        machines, profile=GPU, state=MachineState.SPECULATIVE, count=5, busy=set()
    )
    assert [r.id for r in spec] == ["spec-1"]


def test_a_donor_gives_no_more_than_the_count_and_nothing_for_a_count_of_zero() -> None:
    machines = [_machine(f"idle-{i}", MachineState.IDLE) for i in range(5)]
    two = choose_donations(machines, profile=GPU, state=MachineState.IDLE, count=2, busy=())
    assert [r.id for r in two] == ["idle-0", "idle-1"]
    assert choose_donations(machines, profile=GPU, state=MachineState.IDLE, count=0, busy=()) == ()


def test_an_instruction_for_one_rack_gives_only_machines_in_that_rack() -> None:
    rack = "topology.kubernetes.io/rack"
    machines = [
        replace(_machine(f"{r}-{i}", MachineState.IDLE), labels={rack: r})
        for r in ("r1", "r2")
        for i in range(2)
    ]
    profile = replace(GPU, domain="r2")
    chosen = choose_donations(machines, profile=profile, state=MachineState.IDLE, count=3, busy=())
    assert [r.id for r in chosen] == ["r2-0", "r2-1"]


# -------------------------------------------------------------------- victims


def test_victims_serve_a_strictly_lower_priority_and_never_an_equal_one() -> None:
    machines = [_machine("equal", cluster="a"), _machine("lower", cluster="b")]
    chosen = _victims(machines, {"equal": 900_000, "lower": 899_999})
    assert chosen == ["lower"]


def test_busy_and_other_profiles_are_never_victims() -> None:
    machines = [
        _machine("busy", cluster="a"),
        _machine("other-zone", cluster="a", zone="z2"),
        _machine("idle", MachineState.IDLE),
        _machine("ok", cluster="a"),
    ]
    assert _victims(machines, {}, busy=frozenset({"busy"})) == ["ok"]


def test_under_normal_load_the_lowest_priority_goes_first() -> None:
    machines = [_machine(f"m{p}", cluster=f"c{p}") for p in (3, 1, 2)]
    priorities = {"m1": 100_000, "m2": 200_000, "m3": 300_000}
    assert _victims(machines, priorities, count=2) == ["m1", "m2"]


def test_in_a_saturated_shard_a_fast_drain_wins_over_a_slightly_lower_priority() -> None:
    machines = [_machine("slow", cluster="slow"), _machine("fast", cluster="fast")]
    priorities = {"slow": 0, "fast": 150_000}
    drain = {"slow": 3_600.0, "fast": 5.0}
    normal = _victims(machines, priorities, preemptor=300_000, drain=drain, count=1)
    assert normal == ["slow"], "priority dominates under normal load"
    full = _victims(machines, priorities, preemptor=300_000, drain=drain, count=1, saturation=1.0)
    assert full == ["fast"], "drain speed dominates in a saturated shard"


def test_among_equal_priorities_best_effort_goes_before_batch_before_latency_sensitive() -> None:
    machines = [_machine(n, cluster="c") for n in ("latency", "batch", "best")]
    terms = {
        "latency": VictimTerms(app_class=AppClass.LATENCY_SENSITIVE),
        "batch": VictimTerms(app_class=AppClass.BATCH),
        "best": VictimTerms(app_class=AppClass.BEST_EFFORT),
    }
    priorities = dict.fromkeys(terms, 100_000)
    assert _victims(machines, priorities, terms=terms) == ["best", "batch", "latency"]


def test_a_costly_interruption_protects_a_victim_of_equal_priority() -> None:
    machines = [_machine("pinned", cluster="a"), _machine("cheap", cluster="b")]
    terms = {"pinned": VictimTerms(interruption_penalty=1e6, reclamation_penalty=1e6)}
    assert _victims(machines, {"pinned": 0, "cheap": 0}, terms=terms, count=1) == ["cheap"]


def test_each_victim_gets_the_grace_its_priority_gap_earns() -> None:
    machines = [_machine("a", cluster="a"), _machine("b", cluster="b")]
    chosen = choose_cross_shard_victims(
        machines,
        profile=GPU,
        preemptor_priority=1_000_000,
        count=2,
        busy=(),
        priorities={"a": 500_000, "b": 50_000},
        terms={},
        drain_seconds={},
        saturation=0.0,
        config=CONFIG,
    )
    graces = {v.machine_id: (v.priority, v.cluster_id, v.grace_seconds) for v in chosen}
    assert graces == {"b": (50_000, "b", 10), "a": (500_000, "a", 120)}


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1_000_000),
            st.floats(min_value=0, max_value=7_200),
            st.sampled_from(list(AppClass)),
        ),
        min_size=1,
        max_size=12,
    ),
    st.floats(min_value=0, max_value=1),
)
def test_the_order_is_the_local_preemptions_victim_order(
    rows: list[tuple[int, float, AppClass]], saturation: float
) -> None:
    machines = [_machine(f"m{i:02d}", cluster=f"c{i:02d}") for i in range(len(rows))]
    priorities = {m.id: p for m, (p, _, _) in zip(machines, rows, strict=True)}
    drain = {m.cluster: d for m, (_, d, _) in zip(machines, rows, strict=True)}
    terms = {m.id: VictimTerms(app_class=a) for m, (_, _, a) in zip(machines, rows, strict=True)}
    preemptor = 1_000_001
    chosen = _victims(
        machines,
        priorities,
        preemptor=preemptor,
        count=len(rows),
        terms=terms,
        drain=drain,
        saturation=saturation,
    )
    prio = np.array([p for p, _, _ in rows], dtype=np.int64)
    score = victim_scores(
        gap=(preemptor - prio).astype(np.float64),
        drain=np.array([d for _, d, _ in rows]),
        interruption=np.zeros(len(rows)),
        reclamation=np.zeros(len(rows)),
        weights=blend_weights(
            CONFIG.victim_weights_normal, CONFIG.victim_weights_saturated, saturation
        ),
        config=CONFIG,
    )
    rank = np.array([APP_CLASS_VICTIM_RANK[a] for _, _, a in rows], dtype=np.int64)
    order = victim_order(score, prio, rank)
    assert chosen == [machines[i].id for i in order.tolist()]


# ----------------------------------------------------------------- saturation


def test_saturation_counts_free_idle_and_speculative_machines_against_all_but_failed() -> None:
    machines = [
        _machine("conf", cluster="a"),
        _machine("idle", MachineState.IDLE),
        _machine("idle-busy", MachineState.IDLE),
        _machine("spec", MachineState.SPECULATIVE),
        _machine("failed", MachineState.FAILED),
    ]
    assert saturation_of(machines, busy={"idle-busy"}) == 0.5
    assert saturation_of([], busy=()) == 1.0
