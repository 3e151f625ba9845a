"""The worker pool's decisions: what it accepts, what it asks the shard for, what it reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bigfleet.v1alpha1 import provider_pb2
from nanook.config import parse_pool_config
from nanook.pool import ScaleRefused, SupplyHint, WorkerPool

CONFIGURED = provider_pb2.MACHINE_STATE_CONFIGURED
CREATING = provider_pb2.MACHINE_STATE_CREATING
DRAINING = provider_pb2.MACHINE_STATE_DRAINING
SHAPE = {"node.kubernetes.io/instance-type": "m6i.xlarge"}


def pool(*, minimum: int = 0, maximum: int | None = 16, honours: bool = True) -> WorkerPool:
    config = parse_pool_config(
        {
            "worker": {
                "resources": {"cpu": "3920m"},
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": ["m6i.xlarge"],
                    }
                ],
            },
            "min": minimum,
            "max": maximum,
        }
    )
    p = WorkerPool(config, shard_honours_release=honours)
    p.connected = True
    return p


def with_workers(p: WorkerPool, count: int, state: int = CONFIGURED) -> list[str]:
    ids = [f"m-{i}" for i in range(count)]
    for machine_id in ids:
        p.node_state(machine_id, state)
    return ids


def test_a_new_target_is_reported_as_desired_at_once() -> None:
    p = pool()
    p.scale_to(6)
    state = p.scale_config()
    assert (state.desired, state.available, state.min, state.max) == (6, 0, 0, 16)
    assert p.demand().workers == 6 and p.demand().release == frozenset()


def test_available_counts_configured_workers_only() -> None:
    p = pool()
    with_workers(p, 3)
    p.node_state("new", CREATING)
    assert p.available() == 3 and len(p.live()) == 4
    p.node_state("m-0", DRAINING)  # leaving the cluster
    assert p.available() == 2 and "m-0" not in p.workers


@pytest.mark.parametrize(
    ("amount", "kind", "field"),
    [(17, "invalid", "amount"), (1, "invalid", "amount")],
)
def test_amounts_outside_min_and_max_are_refused_and_change_nothing(
    amount: int, kind: str, field: str
) -> None:
    p = pool(minimum=2)
    p.scale_to(4)
    with pytest.raises(ScaleRefused) as caught:
        p.scale_to(amount)
    assert (caught.value.kind, caught.value.field) == (kind, field)
    assert p.desired == 4


def test_without_a_session_every_scale_to_is_unavailable() -> None:
    p = pool()
    p.connected = False
    with pytest.raises(ScaleRefused) as caught:
        p.scale_to(1)
    assert caught.value.kind == "unavailable"


def test_scaling_down_below_the_workers_to_keep_is_refused() -> None:
    p = pool()
    ids = with_workers(p, 6)
    p.scale_to(6)
    with pytest.raises(ScaleRefused) as caught:
        p.scale_to(2, keep=ids[:3])
    assert (caught.value.kind, caught.value.field) == ("conflict", "workers_to_keep")
    assert p.desired == 6 and p.keep == frozenset()


def test_a_shard_without_named_release_refuses_scale_down_with_a_keep_list_only() -> None:
    p = pool(honours=False)
    ids = with_workers(p, 4)
    with pytest.raises(ScaleRefused):
        p.scale_to(2, keep=ids[:1])
    p.scale_to(2)  # nothing to keep: any worker may go
    assert p.desired == 2


def test_scale_down_offers_unkept_configured_workers_and_never_a_kept_one() -> None:
    p = pool()
    ids = with_workers(p, 6)
    p.node_state("booting", CREATING)
    p.scale_to(3, keep=[ids[0], ids[5]])
    demand = p.demand()
    assert demand.workers == 3
    assert len(demand.release) == 4
    assert not demand.release & {ids[0], ids[5]}
    assert "booting" not in demand.release  # configured ones first: they can go right away


def test_workers_to_delete_go_first_and_are_replaced_first() -> None:
    p = pool()
    ids = with_workers(p, 4)
    p.scale_to(4, delete=[ids[1]])
    # Three others for a target of four: ask for a replacement, offer nothing yet.
    assert p.demand().workers == 5 and p.demand().release == frozenset()
    p.node_state("replacement", CREATING)
    demand = p.demand()
    assert demand.workers == 4 and demand.release == frozenset({ids[1]})


def test_a_reclaim_instruction_takes_workers_out_of_available_at_once() -> None:
    p = pool()
    ids = with_workers(p, 4)
    assert p.reclaim([ids[0], ids[1], "not-ours"]) == 2
    assert p.available() == 2 and p.reclaimed_total == 2
    assert p.reclaim([ids[0]]) == 0  # a repeated instruction counts once


def test_max_is_bounded_by_live_workers_plus_the_supply_the_shard_reports() -> None:
    p = pool(maximum=16)
    with_workers(p, 2)
    assert p.max() == 16  # no hint yet: the pool's own limit
    p.supply_hint("a", SupplyHint(labels=SHAPE, resources={"cpu": 3.92}, count=3))
    p.supply_hint("b", SupplyHint(labels={"x": "y"}, resources={"cpu": 64}, count=50))
    p.supply_hint("c", SupplyHint(labels=SHAPE, resources={"cpu": 1.0}, count=50))
    assert p.max() == 5  # 2 live + 3 that fit; b misses the requirement, c is too small
    p.supply_hint("a", SupplyHint(labels=SHAPE, resources={"cpu": 3.92}, count=0))
    assert p.max() == 2  # none free any more: not unknown


def test_max_stays_absent_while_unbounded_and_no_supply_is_reported() -> None:
    assert pool(maximum=None).scale_config().max is None


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(st.sampled_from([CONFIGURED, CREATING]), min_size=0, max_size=20),
    keep=st.sets(st.integers(0, 25)),
    delete=st.sets(st.integers(0, 25)),
    amount=st.integers(0, 20),
)
def test_a_kept_worker_is_never_offered_for_release(
    states: list[int], keep: set[int], delete: set[int], amount: int
) -> None:
    p = pool(maximum=None)
    for i, state in enumerate(states):
        p.node_state(f"m-{i}", state)
    keep_ids = [f"m-{i}" for i in keep]
    try:
        p.scale_to(amount, keep=keep_ids, delete=[f"m-{i}" for i in delete])
    except ScaleRefused:
        assert sum(1 for i in keep if i < len(states)) > amount
        return
    demand = p.demand()
    assert not demand.release & set(keep_ids)
    assert len(states) - len(demand.release) >= min(amount, len(states))


def test_until_the_first_scale_to_the_pool_adopts_the_workers_it_finds() -> None:
    p = pool()
    with_workers(p, 5)
    assert p.scale_config().desired == 5
    assert p.demand().workers == 5 and p.demand().release == frozenset()
    p.scale_to(2)
    assert p.scale_config().desired == 2 and len(p.demand().release) == 3
