"""Planning a drain and a proportional decommission: whole racks, even spread, exact counts."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.decommission import take_evenly
from shard_engine.membership import DrainingMachine, plan_drain


def _bm(mid: str, rack: str, cluster: str = "", shard: str = "old") -> DrainingMachine:
    return DrainingMachine(mid, shard, group="bm", domain=rack, cluster=cluster)


def test_clusters_go_to_the_least_loaded_active_shards() -> None:
    plan = plan_drain(
        clusters={"a": "old", "b": "old", "c": "old"},
        machines=[],
        active=["s1", "s2"],
        cluster_load={"s1": 5, "s2": 4},
        domain_holdings={},
        group_load={},
    )

    receivers = Counter(m.receiver for m in plan.moves)
    assert receivers == {"s2": 2, "s1": 1}
    assert {m.donor for m in plan.moves} == {"old"}


def test_clusters_sharing_a_rack_move_together_and_the_rack_follows_them() -> None:
    plan = plan_drain(
        clusters={"a": "old", "b": "old", "c": "old"},
        machines=[
            _bm("r1-1", "r1", cluster="a"),
            _bm("r1-2", "r1", cluster="b"),
            _bm("r1-3", "r1"),
            _bm("r2-1", "r2", cluster="c"),
            _bm("r2-2", "r2"),
        ],
        active=["s1", "s2"],
        cluster_load={},
        domain_holdings={},
        group_load={},
    )

    receiver = {m.cluster_id: m.receiver for m in plan.moves}
    assert receiver["a"] == receiver["b"] != receiver["c"]
    handed = {mid: h.receiver for h in plan.handovers for mid in h.machine_ids}
    assert handed == {"r1-3": receiver["a"], "r2-2": receiver["c"]}


def test_a_rack_partly_held_by_an_active_shard_goes_back_to_it() -> None:
    plan = plan_drain(
        clusters={"a": "old"},
        machines=[_bm("r1-1", "r1", cluster="a"), _bm("r1-2", "r1"), _bm("r9-1", "r9")],
        active=["s1", "s2"],
        cluster_load={"s2": 0, "s1": 9},
        domain_holdings={"r1": {"s1": 3}, "r5": {"s2": 1}},
        group_load={},
    )

    assert [(m.cluster_id, m.receiver) for m in plan.moves] == [("a", "s1")]
    handed = {mid: h.receiver for h in plan.handovers for mid in h.machine_ids}
    assert handed["r1-2"] == "s1"
    assert handed["r9-1"] in {"s1", "s2"}


def test_free_racks_spread_over_the_shards_with_fewest_racks() -> None:
    machines = [_bm(f"r{r}-{u}", f"r{r}") for r in range(4) for u in range(3)]
    plan = plan_drain(
        clusters={},
        machines=machines,
        active=["s1", "s2"],
        cluster_load={},
        domain_holdings={"x": {"s1": 1}},
        group_load={},
    )

    owner_of_rack = {mid.split("-")[0]: h.receiver for h in plan.handovers for mid in h.machine_ids}
    assert len(owner_of_rack) == 4
    assert Counter(owner_of_rack.values()) == {"s1": 2, "s2": 2}
    for h in plan.handovers:
        racks = {mid.split("-")[0] for mid in h.machine_ids}
        assert all(owner_of_rack[r] == h.receiver for r in racks), "racks are never split"


def test_a_rack_that_follows_a_cluster_counts_toward_its_receivers_racks() -> None:
    plan = plan_drain(
        clusters={"a": "old"},
        machines=[_bm("r1-1", "r1", cluster="a"), _bm("r1-2", "r1"), _bm("r2-1", "r2")],
        active=["s1", "s2"],
        cluster_load={"s1": 0, "s2": 1},
        domain_holdings={"x": {"s1": 1}, "y": {"s2": 1}},
        group_load={},
    )

    handed = {mid: h.receiver for h in plan.handovers for mid in h.machine_ids}
    assert handed == {"r1-2": "s1", "r2-1": "s2"}, "s1 took r1 with the cluster, so r2 goes to s2"


def test_idle_cloud_machines_even_out_per_quota_group() -> None:
    machines = [DrainingMachine(f"g{i}", "old", group="gpu") for i in range(3)]
    plan = plan_drain(
        clusters={},
        machines=machines,
        active=["s1", "s2"],
        cluster_load={},
        domain_holdings={},
        group_load={"s1": {"gpu": 2}, "s2": {"gpu": 1}},
    )

    got = {h.receiver: len(h.machine_ids) for h in plan.handovers}
    assert got == {"s2": 2, "s1": 1}


def test_nothing_is_planned_without_an_active_shard() -> None:
    plan = plan_drain(
        clusters={"a": "old"},
        machines=[_bm("m", "r")],
        active=[],
        cluster_load={},
        domain_holdings={},
        group_load={},
    )
    assert plan.moves == () and plan.handovers == ()


def test_decommission_takes_the_same_share_from_every_shard() -> None:
    holdings = {
        "s1": [f"a{i}" for i in range(10)],
        "s2": [f"b{i}" for i in range(10)],
        "s3": [f"c{i}" for i in range(20)],
    }

    taken = take_evenly(holdings, 8)

    assert {s: len(ids) for s, ids in taken.items()} == {"s1": 2, "s2": 2, "s3": 4}
    assert taken["s1"] == ["a0", "a1"], "the caller's order decides which machines go"


def test_decommission_refuses_more_than_the_domain_holds() -> None:
    with pytest.raises(ValueError, match="count"):
        take_evenly({"s1": ["a"]}, 2)


@given(
    st.dictionaries(st.sampled_from(["s1", "s2", "s3", "s4"]), st.integers(0, 40), min_size=1),
    st.data(),
)
def test_decommission_counts_add_up_and_stay_within_one_of_the_exact_share(
    sizes: dict[str, int], data: st.DataObject
) -> None:
    holdings = {s: [f"{s}-{i}" for i in range(n)] for s, n in sizes.items()}
    total = sum(sizes.values())
    count = data.draw(st.integers(0, total))

    taken = take_evenly(holdings, count)

    assert sum(len(ids) for ids in taken.values()) == count
    for s, n in sizes.items():
        got = len(taken.get(s, []))
        assert got <= n
        assert abs(got - count * n / total) < 1 if total else got == 0
