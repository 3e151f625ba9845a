"""Coordinator planning: the paper's order, strict priorities, sanity limits, no double spending."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shard_engine.coordination import (
    ProfileSupply,
    ShardShortfall,
    ShardView,
    distribute_evenly,
    labels_satisfy,
    plan_transfers,
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
