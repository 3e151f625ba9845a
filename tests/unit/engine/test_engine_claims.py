"""A machine counts for one need of its cluster (ADR 0128).

Two needs of one cluster with the same requirements used to count every
machine each: with the nodes full of batch pods, a production wave looked
covered and waited for batch to finish (the priority-tiers production p99
of issue 18).
"""

from __future__ import annotations

import numpy as np

from shard_engine.claims import claim
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState, Provision, Reclaim
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, need, of_kind, rollup

EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)


def test_a_higher_priority_need_does_not_count_the_machines_a_lower_one_fills() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="held", state=MachineState.CONFIGURED, cluster="tiers")
    fleet(engine, 4, prefix="spare", state=MachineState.IDLE)
    batch = need(cpu=16, priority=100_000)
    production = need(cpu=8, priority=1_000_000, interruption_penalty=1024)
    apply(engine, rollup("tiers", 1, batch, production), now=0)

    plan = engine.cycle(now=1)

    # 4 machines of 4 cores for 24 cores asked: 2 more, whichever need they are for.
    assert len(plan.actions) == 2
    assert all(a.cluster_id == "tiers" for a in plan.actions)  # type: ignore[union-attr]


def test_needs_that_together_fit_in_what_the_cluster_holds_ask_for_nothing() -> None:
    engine = ShardEngine()
    fleet(engine, 6, prefix="held", state=MachineState.CONFIGURED, cluster="tiers")
    fleet(engine, 4, prefix="spare", state=MachineState.IDLE)
    apply(
        engine,
        rollup("tiers", 1, need(cpu=16, priority=100_000), need(cpu=8, priority=1_000_000)),
        now=0,
    )

    assert engine.cycle(now=1).actions == ()


def test_machines_two_needs_share_are_excess_only_beyond_both() -> None:
    engine = ShardEngine(EAGER)
    fleet(engine, 8, prefix="held", state=MachineState.CONFIGURED, cluster="tiers")
    apply(
        engine,
        rollup("tiers", 1, need(cpu=16, priority=100_000), need(cpu=8, priority=1_000_000)),
        now=0,
    )

    plans = Carrier(engine).run(now=1, cycles=10)

    # 24 cores asked of 32 held: two machines go, not the four either need alone leaves.
    assert sum(len(of_kind(p, Reclaim)) for p in plans) == 2
    assert not any(of_kind(p, Provision) for p in plans)


def test_claims_are_taken_in_order_and_a_spare_machine_counts_for_everyone() -> None:
    matrix = np.array([[True, True], [True, True]])
    alloc = np.array([[4.0], [4.0]])
    aggregate = np.array([[8.0], [4.0]])

    claims = claim(matrix, aggregate, np.array([2, 2]), alloc)

    assert claims is not None
    # The first need takes half of each profile (8 of 16 cores), the second a
    # quarter; one machine's worth is left over and both may count it.
    assert claims.have(0).tolist() == [12.0]
    assert claims.have(1).tolist() == [8.0]


def test_needs_on_disjoint_machines_are_left_to_the_plain_sum() -> None:
    matrix = np.array([[True, False], [False, True]])

    assert claim(matrix, np.ones((2, 1)), np.array([1, 1]), np.ones((2, 1))) is None


def test_a_need_does_not_claim_machines_without_the_resource_it_still_lacks() -> None:
    # Twelve GPU-only servers (0 cores, 4 GPUs) and two CPU servers (4 cores);
    # every profile equally contested, so the first need walks them in order.
    alloc = np.array([[0.0, 4.0]] * 12 + [[4.0, 0.0]])
    supply = np.array([1] * 12 + [2])
    matrix = np.ones((2, 13), dtype=bool)
    aggregate = np.array([[8.0, 4.0], [0.0, 4.0]])  # 8 cores and 4 GPUs; then 4 GPUs

    claims = claim(matrix, aggregate, supply, alloc)

    # The first need takes one GPU server and both CPU servers; the eleven other
    # GPU servers hold nothing it still lacks. The second takes one of those
    # and may count the ten left over: 44 GPUs. Summing past a dozen
    # candidates, the first need took all twelve and left the second none.
    assert claims is not None
    assert claims.have(1).tolist() == [0.0, 44.0]
    assert claims.have(0).tolist() == [8.0, 44.0]
