"""Coordinator planning: the paper's order, strict priorities, sanity limits, no double spending."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from shard_engine.coordination import (
    ProfileSupply,
    ShardShortfall,
    ShardView,
    distribute_evenly,
    labels_satisfy,
    plan_transfers,
    quota_group,
    quota_kind,
    units_needed,
)
from shard_engine.model import Operator, Requirement

GPU = {"cpu": 96.0, "memory": 768 * 2.0**30, "nvidia.com/gpu": 8.0}
GPU_LABELS = {"node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "a"}


def _supply(
    idle: int = 0, spec: int = 0, configured: dict[int, int] | None = None
) -> ProfileSupply:
    return ProfileSupply(
        provider="sim",
        instance_type="p5.48xlarge",
        zone="a",
        capacity_type=3,
        labels=GPU_LABELS,
        allocatable=GPU,
        idle=idle,
        speculative=spec,
        configured_by_priority=configured or {},
    )


def _gpu_shortfall(
    machines: int, priority: int = 1_000_000, escalated: bool = False
) -> ShardShortfall:
    return ShardShortfall(
        cluster_id="B",
        need_key="gpu",
        priority=priority,
        deficit={"nvidia.com/gpu": 8.0 * machines},
        min_unit={"nvidia.com/gpu": 8.0},
        escalated=escalated,
    )


def test_idle_machines_elsewhere_are_used_before_speculative_quota() -> None:
    views = {
        "s1": ShardView("s1", 2000, supply=(_supply(idle=10, spec=50),)),
        "s2": ShardView("s2", 2000, shortfalls=(_gpu_shortfall(4),)),
    }
    (ins,) = plan_transfers(views)
    assert (ins.kind, ins.donor, ins.receiver, ins.count) == ("idle", "s1", "s2", 4)


def test_speculative_quota_is_next_when_no_idle_machine_fits() -> None:
    views = {
        "s1": ShardView("s1", 2000, supply=(_supply(idle=1, spec=50),)),
        "s2": ShardView("s2", 2000, shortfalls=(_gpu_shortfall(4),)),
    }
    (ins,) = plan_transfers(views)
    assert ins.kind == "speculative" and ins.count == 4


def test_a_shortfall_waiting_for_an_idle_machine_is_answered_with_idle_machines_only() -> None:
    # The receiver held back its own buying for another shard's idle machine, which a
    # higher shortfall took this round: quota would only move what it could buy with
    # its own next cycle. With the idle machine still there, the wait is answered.
    waiting = dataclasses.replace(_gpu_shortfall(2), awaiting_idle=True)
    gone = {
        "s1": ShardView("s1", 2000, supply=(_supply(spec=50),)),
        "s2": ShardView("s2", 2000, shortfalls=(waiting,)),
    }
    assert plan_transfers(gone) == []
    there = {
        "s1": ShardView("s1", 2000, supply=(_supply(idle=2, spec=50),)),
        "s2": ShardView("s2", 2000, shortfalls=(waiting,)),
    }
    (ins,) = plan_transfers(there)
    assert (ins.kind, ins.count) == ("idle", 2)
    escalated = dataclasses.replace(waiting, escalated=True)
    held = {
        "s1": ShardView("s1", 2000, supply=(_supply(configured={1: 2}),)),
        "s2": ShardView("s2", 2000, shortfalls=(escalated,)),
    }
    assert plan_transfers(held) == [], "nor by preemption: nothing it waits for runs there"


def test_cross_shard_preemption_takes_only_strictly_lower_priorities_and_only_when_escalated() -> (
    None
):
    supply = _supply(configured={500_000: 64, 1_000_000: 64})
    fresh = {
        "s1": ShardView("s1", 2000, supply=(supply,)),
        "s2": ShardView("s2", 2000, shortfalls=(_gpu_shortfall(64),)),
    }
    assert plan_transfers(fresh, max_share=0.5) == []
    escalated = {
        "s1": ShardView("s1", 2000, supply=(supply,)),
        "s2": ShardView("s2", 2000, shortfalls=(_gpu_shortfall(64, escalated=True),)),
    }
    (ins,) = plan_transfers(escalated, max_share=0.5)
    assert ins.kind == "preempt" and ins.count == 64 and ins.below_priority == 1_000_000
    equal = {
        "s1": ShardView("s1", 2000, supply=(_supply(configured={1_000_000: 64}),)),
        "s2": ShardView("s2", 2000, shortfalls=(_gpu_shortfall(64, escalated=True),)),
    }
    assert plan_transfers(equal, max_share=0.5) == [], "equal priority is never preempted"


def test_no_donor_gives_more_than_its_share_in_one_round() -> None:
    views = {
        "s1": ShardView("s1", 100, supply=(_supply(idle=50),)),
        "s2": ShardView("s2", 100, shortfalls=(_gpu_shortfall(10),)),
    }
    assert plan_transfers(views, max_share=0.05) == []
    (ins,) = plan_transfers(views, max_share=0.10)
    assert ins.count == 10


def test_two_shortfalls_never_claim_the_same_machines() -> None:
    views = {
        "s1": ShardView("s1", 10_000, supply=(_supply(idle=5),)),
        "s2": ShardView(
            "s2",
            10_000,
            shortfalls=(_gpu_shortfall(4, priority=10), _gpu_shortfall(4, priority=20)),
        ),
    }
    (ins,) = plan_transfers(views, max_share=1.0)
    assert ins.priority == 20, "the higher priority is served first"


def test_requirements_filter_donor_profiles() -> None:
    sf = ShardShortfall(
        "B",
        "k",
        10,
        {"nvidia.com/gpu": 8.0},
        requirements=(Requirement("topology.kubernetes.io/zone", Operator.IN, ("b",)),),
    )
    views = {
        "s1": ShardView("s1", 1000, supply=(_supply(idle=5),)),
        "s2": ShardView("s2", 1000, shortfalls=(sf,)),
    }
    assert plan_transfers(views, max_share=1.0) == []


def test_label_matching_follows_node_selector_semantics() -> None:
    labels = {"zone": "a", "gpu": "h100"}
    assert labels_satisfy([Requirement("zone", Operator.IN, ("a", "b"))], labels)
    assert not labels_satisfy([Requirement("zone", Operator.NOT_IN, ("a",))], labels)
    assert labels_satisfy([Requirement("gpu", Operator.EXISTS)], labels)
    assert not labels_satisfy([Requirement("rack", Operator.EXISTS)], labels)
    assert labels_satisfy([Requirement("rack", Operator.DOES_NOT_EXIST)], labels)
    assert labels_satisfy([Requirement("zone", Operator.SAME)], labels)
    assert not labels_satisfy([Requirement("zone", Operator.SAME, ("b",))], labels)


def test_units_needed_rounds_up_over_the_tightest_dimension() -> None:
    assert units_needed({"cpu": 10.0, "memory": 1.0}, {"cpu": 4.0, "memory": 100.0}) == 3
    assert units_needed({"nvidia.com/gpu": 1.0}, {"cpu": 4.0}) == 0


@given(
    items=st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=60),
    shards=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, unique=True),
)
def test_distribution_is_even_and_assigns_every_item_once(
    items: list[str], shards: list[str]
) -> None:
    out = distribute_evenly({"g": items}, shards, {})
    assigned = [i for ids in out.values() for i in ids]
    assert sorted(assigned) == sorted(items)
    counts = [len(out.get(s, [])) for s in shards]
    assert max(counts) - min(counts) <= 1


def test_distribution_tops_up_the_emptiest_shard_first() -> None:
    out = distribute_evenly({"g": ["x", "y"]}, ["old", "new"], {"old": {"g": 5}})
    assert out == {"new": ["x", "y"]}


# -- scarce capacity: even spread per kind, several donations per shortfall (ADR 0111)

G5 = {"cpu": 4.0, "memory": 16 * 2.0**30, "nvidia.com/gpu": 1.0}


def _g5(zone: str, capacity_type: int, *, idle: int = 0, spec: int = 0) -> ProfileSupply:
    return ProfileSupply(
        provider="sim",
        instance_type="g5.xlarge",
        zone=zone,
        capacity_type=capacity_type,
        labels={
            "node.kubernetes.io/instance-type": "g5.xlarge",
            "topology.kubernetes.io/zone": zone,
        },
        allocatable=G5,
        idle=idle,
        speculative=spec,
    )


def _g5_shortfall(machines: int, *, gang: bool = False) -> ShardShortfall:
    reqs = [Requirement("node.kubernetes.io/instance-type", Operator.IN, ("g5.xlarge",))]
    if gang:
        reqs.append(Requirement("topology.kubernetes.io/zone", Operator.SAME))
    return ShardShortfall(
        cluster_id="b",
        need_key="g5",
        priority=100,
        deficit={"nvidia.com/gpu": float(machines)},
        min_unit={"nvidia.com/gpu": 1.0},
        requirements=tuple(reqs),
    )


def test_a_shortfall_no_single_profile_covers_takes_several_donations() -> None:
    views = {
        "s0": ShardView(
            "s0", 100, supply=(_g5("a", 3, spec=1), _g5("a", 4, spec=1), _g5("b", 3, spec=2))
        ),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(4),)),
    }
    planned = plan_transfers(views, max_share=1.0)
    assert {(i.zone, i.capacity_type, i.count) for i in planned} == {
        ("a", 3, 1),
        ("a", 4, 1),
        ("b", 3, 2),
    }
    assert {(i.kind, i.donor, i.receiver, i.need_key) for i in planned} == {
        ("speculative", "s0", "s1", "g5")
    }


def test_donations_may_come_from_several_donors() -> None:
    views = {
        "s0": ShardView("s0", 100, supply=(_g5("a", 3, spec=1),)),
        "s2": ShardView("s2", 100, supply=(_g5("b", 4, spec=1),)),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(2),)),
    }
    planned = plan_transfers(views, max_share=1.0)
    assert sorted((i.donor, i.count) for i in planned) == [("s0", 1), ("s2", 1)]


def test_one_profile_that_covers_the_whole_shortfall_is_preferred() -> None:
    views = {
        "s0": ShardView("s0", 100, supply=(_g5("a", 3, spec=1), _g5("b", 3, spec=4))),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(3),)),
    }
    (ins,) = plan_transfers(views, max_share=1.0)
    assert (ins.zone, ins.count) == ("b", 3)


def test_a_step_that_cannot_cover_the_shortfall_even_combined_moves_nothing() -> None:
    views = {
        "s0": ShardView("s0", 100, supply=(_g5("a", 3, idle=1, spec=0), _g5("b", 3, idle=1))),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(4),)),
    }
    assert plan_transfers(views, max_share=1.0) == []


def test_a_gang_is_never_split_over_profiles() -> None:
    views = {
        "s0": ShardView("s0", 100, supply=(_g5("a", 3, spec=2), _g5("b", 3, spec=2))),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(4, gang=True),)),
    }
    assert plan_transfers(views, max_share=1.0) == []
    views["s0"] = ShardView("s0", 100, supply=(_g5("a", 3, spec=2), _g5("b", 3, spec=4)))
    (ins,) = plan_transfers(views, max_share=1.0)
    assert (ins.zone, ins.count) == ("b", 4)


def test_combined_donations_respect_the_donors_share_and_never_double_spend() -> None:
    views = {
        "s0": ShardView("s0", 40, supply=(_g5("a", 3, spec=1), _g5("b", 3, spec=1))),
        "s1": ShardView("s1", 100, shortfalls=(_g5_shortfall(2),)),
    }
    assert plan_transfers(views, max_share=0.025) == [], "a share of one machine cannot give two"
    second = ShardShortfall(
        "c", "g5", 50, {"nvidia.com/gpu": 2.0}, min_unit={"nvidia.com/gpu": 1.0}
    )
    views["s1"] = ShardView("s1", 100, shortfalls=(_g5_shortfall(2), second))
    planned = plan_transfers(views, max_share=1.0)
    assert {i.cluster_id for i in planned} == {"b"}, "the lower priority finds nothing left"
    assert sum(i.count for i in planned) == 2


@given(
    demand=st.integers(1, 12),
    profiles=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from([3, 4]), st.integers(0, 4)),
        min_size=1,
        max_size=6,
        unique_by=lambda p: (p[0], p[1]),
    ),
)
def test_several_donations_cover_exactly_when_the_donors_together_can(
    demand: int, profiles: list[tuple[str, int, int]]
) -> None:
    supply = tuple(_g5(zone, cap, spec=n) for zone, cap, n in profiles)
    views = {
        "s0": ShardView("s0", 1000, supply=supply),
        "s1": ShardView("s1", 1000, shortfalls=(_g5_shortfall(demand),)),
    }
    planned = plan_transfers(views, max_share=1.0)
    offered = sum(n for _, _, n in profiles)
    if offered >= demand:
        assert sum(i.count for i in planned) == demand
        held = {(zone, cap): n for zone, cap, n in profiles}
        assert all(i.count <= held[(i.zone, i.capacity_type)] for i in planned)
    else:
        assert planned == []


def test_four_gpu_machines_in_four_quota_groups_split_two_and_two() -> None:
    groups = {
        quota_group("sim", zone, "g5.xlarge", cap): [f"g5-{zone}-{cap}"]
        for zone in ("a", "b")
        for cap in (3, 4)
    }
    out = distribute_evenly(groups, ["shard-0", "shard-1"], {})
    assert sorted(len(ids) for ids in out.values()) == [2, 2]


def test_quota_groups_are_keyed_by_provider_zone_type_and_capacity() -> None:
    group = quota_group("sim", "us-east-1a", "g5.xlarge", 4)
    assert group == "sim/us-east-1a/g5.xlarge/4"
    assert quota_kind(group) == "sim/g5.xlarge"
    assert quota_kind("rack-7") == "rack-7"


@given(
    groups=st.dictionaries(
        st.tuples(
            st.sampled_from(["p", "q"]),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["g5.xlarge", "p5.48xlarge", "m6i.large"]),
            st.sampled_from([3, 4]),
        ),
        st.integers(0, 5),
        max_size=12,
    ),
    shards=st.lists(st.sampled_from(["s0", "s1", "s2"]), min_size=1, unique=True),
)
def test_every_group_and_every_instance_type_ends_within_one_across_shards(
    groups: dict[tuple[str, str, str, int], int], shards: list[str]
) -> None:
    items = {
        quota_group(*key): [f"{quota_group(*key)}#{i}" for i in range(n)]
        for key, n in groups.items()
    }
    out = distribute_evenly(items, shards, {})
    owner = {item: s for s, ids in out.items() for item in ids}
    assert sorted(owner) == sorted(i for ids in items.values() for i in ids)
    for key in {quota_kind(g) for g in items} | set(items):
        counts = [
            sum(
                1
                for g, ids in items.items()
                for i in ids
                if key in (g, quota_kind(g)) and owner[i] == s
            )
            for s in shards
        ]
        assert max(counts) - min(counts) <= 1, (key, counts)


RACK = "topology.kubernetes.io/rack"


def _server(zone: str, rack: str, idle: int, slots: int = 0) -> ProfileSupply:
    """One rack's H100 servers: ``idle`` claimed and idle, ``slots`` not claimed yet."""
    return ProfileSupply(
        provider="metal",
        instance_type="h100",
        zone=zone,
        capacity_type=4,
        labels={**GPU_LABELS, "topology.kubernetes.io/zone": zone, RACK: rack},
        allocatable=GPU,
        idle=idle,
        speculative=slots,
        domain=rack,
    )


def _gang(servers: int) -> ShardShortfall:
    return ShardShortfall(
        cluster_id="gangs",
        need_key="train",
        priority=900_000,
        deficit={"nvidia.com/gpu": 8.0 * servers},
        requirements=(Requirement(RACK, Operator.SAME),),
        min_unit={"nvidia.com/gpu": 8.0},
    )


def test_a_gang_rack_split_over_two_shards_is_completed_from_the_other() -> None:
    # The scarce fleet's seed-1 episode: rack b-r03 has two idle servers on each shard,
    # rack a-r04 two on the donor. A gang of four is short on s0, which holds half of
    # b-r03: the donor gives its two b-r03 servers, not a-r04's, and only those.
    views = {
        "s0": ShardView("s0", 100, supply=(_server("b", "b-r03", 2),), shortfalls=(_gang(4),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "a-r04", 2), _server("b", "b-r03", 2))),
    }
    (ins,) = plan_transfers(views)
    assert (ins.kind, ins.donor, ins.receiver, ins.zone, ins.domain, ins.count) == (
        "idle",
        "s1",
        "s0",
        "b",
        "b-r03",
        2,
    )


def test_a_gang_rack_is_assembled_from_several_donors() -> None:
    # The receiver holds one server of r1; s1 and s2 hold one more each, s3 two of r2:
    # r1 needs two moves (one from each), r2 three it cannot get. Two instructions, r1.
    views = {
        "s0": ShardView("s0", 100, supply=(_server("a", "r1", 1),), shortfalls=(_gang(3),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "r1", 1),)),
        "s2": ShardView("s2", 100, supply=(_server("a", "r1", 1),)),
        "s3": ShardView("s3", 100, supply=(_server("a", "r2", 2),)),
    }
    moves = sorted((i.donor, i.domain, i.count) for i in plan_transfers(views))
    assert moves == [("s1", "r1", 1), ("s2", "r1", 1)]


def test_a_gang_is_never_spread_over_racks_to_complete_it() -> None:
    # Two servers in each of two racks and none on the receiver: four servers, but no
    # rack holds four, so nothing moves.
    views = {
        "s0": ShardView("s0", 100, shortfalls=(_gang(4),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "r1", 2), _server("a", "r2", 2))),
    }
    assert plan_transfers(views) == []


def test_a_gang_takes_a_racks_idle_servers_and_new_ones_beside_them() -> None:
    # The one-day mixed day, seed 3, at 9,510 s: a gang of three on s0, whose own rack
    # has only unclaimed slots; s1's rack a-r04 holds two idle servers and nine slots.
    # Two idle and one slot of a-r04 cost one claim; three slots anywhere cost three.
    views = {
        "s0": ShardView("s0", 100, supply=(_server("b", "b-r03", 0, 9),), shortfalls=(_gang(3),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "a-r04", 2, 9),)),
    }
    moves = [(i.kind, i.donor, i.domain, i.count) for i in plan_transfers(views)]
    assert moves == [("idle", "s1", "a-r04", 2), ("speculative", "s1", "a-r04", 1)]


def test_the_rack_reusing_the_most_idle_servers_is_completed() -> None:
    views = {
        "s0": ShardView("s0", 100, shortfalls=(_gang(4),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "r1", 1, 9), _server("a", "r2", 3, 9))),
    }
    moves = [(i.kind, i.domain, i.count) for i in plan_transfers(views)]
    assert moves == [("idle", "r2", 3), ("speculative", "r2", 1)]


def test_a_rack_of_idle_servers_alone_still_comes_first() -> None:
    views = {
        "s0": ShardView("s0", 100, shortfalls=(_gang(3),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "r1", 2, 9), _server("a", "r2", 3, 0))),
    }
    assert [(i.kind, i.domain, i.count) for i in plan_transfers(views)] == [("idle", "r2", 3)]


def test_the_receivers_own_machines_in_the_rack_count_before_the_donors() -> None:
    # s0 already holds two idle servers of r1 (one arrived, say): one more slot of r1
    # from s1 completes it; s1's idle server of r1 is taken first.
    views = {
        "s0": ShardView("s0", 100, supply=(_server("a", "r1", 2, 0),), shortfalls=(_gang(4),)),
        "s1": ShardView("s1", 100, supply=(_server("a", "r1", 1, 5),)),
    }
    moves = [(i.kind, i.domain, i.count) for i in plan_transfers(views)]
    assert moves == [("idle", "r1", 1), ("speculative", "r1", 1)]


def test_a_need_that_is_not_a_gang_takes_no_mixed_answer() -> None:
    # Two idle GPU machines do not cover three; quota alone answers, as before.
    views = {
        "s0": ShardView("s0", 100, shortfalls=(_gpu_shortfall(3),)),
        "s1": ShardView("s1", 100, supply=(_supply(idle=2, spec=9),)),
    }
    assert [(i.kind, i.count) for i in plan_transfers(views)] == [("speculative", 3)]
