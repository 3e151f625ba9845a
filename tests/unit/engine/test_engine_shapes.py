"""Shapes and counts from the pods' own shape (issue 18 item 2, ADR 0127).

Hand cases with the simulated cloud's allocatable (what a node of the shape
offers after system reservations): m6i.4xlarge 15.89 cores / 59,824 MiB,
c6i.4xlarge 15.89 / 29,022 MiB, r6i.2xlarge 7.91 / 59,824 MiB; prices are
the catalog's spot prices.

Nine pods of 4 cores / 16 GiB: an m6i holds three (both dimensions bind at
three), a c6i one (memory binds), an r6i one (CPU binds). Per pod hosted:
m6i $0.097, r6i $0.166, c6i $0.262, so 3 × m6i ($0.87/h) is right. Covering
the *aggregate* (36 cores, 144 GiB) by the dominant unit picks 5 × r6i
($0.83/h), which holds five of the nine pods.
"""

from __future__ import annotations

import numpy as np

from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState, Need, Operator, Requirement
from tests.rollups import apply
from tests.unit.engine.engine_fleet import GI, fleet, machine_ids, rollup
from tests.unit.engine.oracles import units_hosted, units_wanted

MI = 2.0**20
TYPE = "node.kubernetes.io/instance-type"


def catalog(engine: ShardEngine, count: int = 12) -> None:
    for name, price, cpu, mib in (
        ("m6i.4xlarge", 0.29, 15.89, 59824),
        ("c6i.4xlarge", 0.262, 15.89, 29022),
        ("r6i.2xlarge", 0.166, 7.91, 59824),
    ):
        fleet(
            engine,
            count,
            prefix=name,
            state=MachineState.SPECULATIVE,
            instance_type=name,
            price=price,
            cpu=cpu,
            memory=mib * MI,
            labels={TYPE: name},
        )


def pods(count: int, cpu: float, gib: float, *types: str) -> Need:
    requirements = (Requirement(TYPE, Operator.IN, types),) if types else ()
    return Need(
        requirements=requirements,
        aggregate={"cpu": cpu * count, "memory": gib * count * GI},
        priority=1000,
        min_unit={"cpu": cpu, "memory": gib * GI},
    )


def bought(engine: ShardEngine, need: Need) -> list[str]:
    apply(engine, rollup("c1", 1, need), now=0)
    return sorted(m.split("-")[0] for m in machine_ids(engine.cycle(now=1).actions))


def test_nine_pods_of_four_cores_and_16_gib_get_three_general_purpose_machines() -> None:
    engine = ShardEngine()
    catalog(engine)

    assert bought(engine, pods(9, 4, 16)) == ["m6i.4xlarge"] * 3


def test_the_count_is_what_the_units_take_not_the_aggregate_over_the_machine() -> None:
    # Only r6i allowed: one pod per machine (7.91 cores), so nine machines, not
    # ceil(36 / 7.91) = 5.
    engine = ShardEngine()
    catalog(engine)

    assert bought(engine, pods(9, 4, 16, "r6i.2xlarge")) == ["r6i.2xlarge"] * 9


def test_a_shape_that_holds_more_units_per_dollar_wins_over_a_cheaper_machine() -> None:
    # Two pods: r6i holds one each ($0.33), one m6i holds both ($0.29).
    engine = ShardEngine()
    catalog(engine)

    assert bought(engine, pods(2, 4, 16)) == ["m6i.4xlarge"]


def test_one_pod_goes_to_the_cheapest_shape_that_holds_it() -> None:
    engine = ShardEngine()
    catalog(engine)

    assert bought(engine, pods(1, 4, 16)) == ["r6i.2xlarge"]


def test_every_dimension_of_the_unit_binds() -> None:
    """On the numpy definition the compiled unit cover is checked against bit for bit."""
    alloc = np.array([[15.89, 59824 * MI], [15.89, 29022 * MI], [7.91, 59824 * MI]])
    unit = np.array([4.0, 16 * GI])

    assert units_hosted(alloc, unit).tolist() == [3, 1, 1]
    assert units_hosted(alloc, np.zeros(2)).tolist() == [0, 0, 0]


def test_the_units_of_a_deficit_are_its_largest_ratio_to_the_unit() -> None:
    """On the numpy definition, as above."""
    unit = np.array([2.5, 9 * GI])

    # Seed 004's anti-correlated burst: 12 pods of 2.5 cores/4.5 GiB and 12 of
    # 1.25 cores/9 GiB, one need: 45 cores, 162 GiB, unit 2.5 cores/9 GiB.
    assert units_wanted(np.array([45.0, 162 * GI]), unit) == 18
    assert units_wanted(np.array([0.0, 0.0]), unit) == 0


def test_the_anti_correlated_burst_gets_the_six_nodes_that_hold_it() -> None:
    # On 8-core/32 GiB machines (7.91 cores, 29.2 GiB allocatable) a node holds
    # two of each kind (7.5 cores, 27 GiB): 6 nodes are optimal, and 3 units of
    # 2.5 cores/9 GiB per node give 18 / 3 = 6.
    engine = ShardEngine()
    fleet(
        engine,
        10,
        prefix="m6i.2xlarge",
        state=MachineState.SPECULATIVE,
        instance_type="m6i.2xlarge",
        price=0.384,
        cpu=7.91,
        memory=29.2 * GI,
    )
    need = Need(
        requirements=(),
        aggregate={"cpu": 45.0, "memory": 162 * GI},
        priority=1000,
        min_unit={"cpu": 2.5, "memory": 9 * GI},
    )

    assert bought(engine, need) == ["m6i.2xlarge"] * 6


def _held_r6i(engine: ShardEngine, count: int) -> None:
    fleet(
        engine,
        count,
        prefix="held",
        state=MachineState.CONFIGURED,
        cluster="c1",
        instance_type="r6i.2xlarge",
        price=0.166,
        cpu=7.91,
        memory=59824 * MI,
        labels={TYPE: "r6i.2xlarge"},
    )


def test_machines_count_for_the_pods_they_hold_not_their_allocatable() -> None:
    # Two r6i.2xlarge of the cluster hold one 4-core pod each (7.91 cores): 15.82
    # allocatable cores "cover" three pods' 12, but only two of the three can run.
    # Counted in units the need is one pod short, and one more machine is bought
    # (the cheapest per pod for one pod: another r6i).
    engine = ShardEngine()
    catalog(engine)
    _held_r6i(engine, 2)

    assert bought(engine, pods(3, 4, 16)) == ["r6i.2xlarge"]


def test_what_a_machine_strands_for_a_need_is_not_excess() -> None:
    # Three r6i.2xlarge for three 4-core pods: 23.7 cores against 12 asked looks like a
    # machine and a half too many, but each holds one pod, so none may be reclaimed.
    engine = ShardEngine()
    catalog(engine)
    _held_r6i(engine, 3)
    apply(engine, rollup("c1", 1, pods(3, 4, 16)), now=0)

    for now in range(1, 2000, 10):
        assert not machine_ids(engine.cycle(now=now).actions)
