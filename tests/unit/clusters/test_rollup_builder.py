"""The roll-up builder aggregates pods the way the Go reference operator does, on the real wire."""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import rollup_from_wire
from bigfleet.v1alpha1 import capacity_pb2
from clusters.pods import PodSpec
from clusters.rollup import Upcoming, bucket_for_dollars, build_rollup, reasks
from shard_engine.model import (
    AppClass,
    Operator,
    Requirement,
    TopologySpread,
    WhenUnsatisfiable,
    penalty_bucket_dollars,
)

GI = float(2**30)
ZONE_A = Requirement("topology.kubernetes.io/zone", Operator.IN, ("us-east-1a",))


def _pod(name: str, cpu: float, mem_gi: float, **kw: object) -> PodSpec:
    return PodSpec.build(name, {"cpu": cpu, "memory": mem_gi * GI}, **kw)  # type: ignore[arg-type]


def _roundtrip(msg: capacity_pb2.ClusterCapacityNeeds) -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds.FromString(msg.SerializeToString())


def test_pods_with_one_key_become_one_need_summing_requests_with_the_largest_pod_as_min_unit() -> (
    None
):
    pods = [_pod("a", 0.5, 1), _pod("b", 2, 0.5), _pod("c", 1, 4)]
    msg = _roundtrip(build_rollup("c1", pods, timestamp_ns=7))
    assert msg.cluster_id == "c1" and msg.timestamp_unix_nanos == 7
    (need,) = msg.needs
    assert dict(need.aggregate_resources) == {"cpu": "3500m", "memory": "5632Mi"}
    assert dict(need.min_unit) == {"cpu": "2", "memory": "4Gi"}
    rollup = rollup_from_wire(msg, session_cluster="c1")
    (engine_need,) = rollup.needs
    assert engine_need.aggregate == {"cpu": 3.5, "memory": 5.5 * GI}
    assert engine_need.min_unit == {"cpu": 2.0, "memory": 4 * GI}


def test_priority_requirements_penalty_buckets_and_hard_spreads_split_needs() -> None:
    spread = TopologySpread("topology.kubernetes.io/zone", 1)
    pods = [
        _pod("base", 1, 1),
        _pod("prio", 1, 1, priority=5),
        _pod("zone", 1, 1, requirements=(ZONE_A,)),
        _pod("pen", 1, 1, interruption_penalty=100.0),
        _pod("rec", 1, 1, reclamation_penalty=3.0),
        _pod("spread", 1, 1, spread=(spread,)),
        # Same bucket as "pen" ($100 and $120 both fall in the $128 bucket): aggregates with it.
        _pod("pen2", 1, 1, interruption_penalty=120.0),
    ]
    msg = build_rollup("c1", pods, timestamp_ns=1)
    assert len(msg.needs) == 6
    assert msg.needs[0].priority == 5  # highest priority first
    buckets = sorted(n.interruption_penalty_bucket for n in msg.needs)
    assert buckets.count(capacity_pb2.PENALTY_BUCKET_128) == 1
    pen = next(
        n for n in msg.needs if n.interruption_penalty_bucket == capacity_pb2.PENALTY_BUCKET_128
    )
    assert pen.aggregate_resources["cpu"] == "2"
    assert len(rollup_from_wire(msg, session_cluster="c1").needs) == 6


def test_schedule_anyway_spreads_are_dropped_and_do_not_split_needs() -> None:
    soft = TopologySpread("topology.kubernetes.io/zone", 1, WhenUnsatisfiable.SCHEDULE_ANYWAY)
    msg = build_rollup("c1", [_pod("a", 1, 1), _pod("b", 1, 1, spread=(soft,))], timestamp_ns=1)
    (need,) = msg.needs
    assert list(need.spread) == []
    assert need.aggregate_resources["cpu"] == "2"


def test_a_colocation_group_adds_a_same_requirement_and_stays_apart_from_other_groups() -> None:
    rack = "topology.kubernetes.io/rack"
    gang_a = [_pod(f"a{i}", 8, 64, colocation="job-a", colocation_key=rack) for i in range(4)]
    gang_b = [_pod(f"b{i}", 8, 64, colocation="job-b", colocation_key=rack) for i in range(2)]
    msg = build_rollup("c1", [*gang_a, *gang_b], timestamp_ns=1)
    assert len(msg.needs) == 2
    for need in msg.needs:
        (req,) = need.requirements
        assert (
            req.key == rack and req.operator == capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME
        )
    assert sorted(n.aggregate_resources["cpu"] for n in msg.needs) == ["16", "32"]
    rollup = rollup_from_wire(msg, session_cluster="c1")
    assert all(n.requirements == (Requirement(rack, Operator.SAME),) for n in rollup.needs)


def test_best_effort_pods_in_the_gap_are_not_asked_for_and_the_rest_at_their_limit() -> None:
    pods = [
        _pod("web", 2, 4, app_class=AppClass.LATENCY_SENSITIVE, reservation={"cpu": 1.0}),
        _pod("be1", 1, 1, app_class=AppClass.BEST_EFFORT),
        _pod("be2", 3, 2, app_class=AppClass.BEST_EFFORT),
    ]
    msg = build_rollup("c1", pods, timestamp_ns=1, in_gap=["be1"])
    (need,) = msg.needs
    # web at its limit (latency-sensitive) + be2 at its limit; be1 lives in the gap.
    assert dict(need.aggregate_resources) == {"cpu": "5", "memory": "6Gi"}
    without = build_rollup("c1", pods, timestamp_ns=1, gap=False, in_gap=["be1"])
    assert dict(without.needs[0].aggregate_resources) == {"cpu": "6", "memory": "7Gi"}


def test_batch_is_asked_for_at_its_reservation_latency_sensitive_at_its_limit() -> None:
    batch = _pod("b", 4, 8, reservation={"cpu": 2.0, "memory": 4 * GI})
    web = _pod("w", 4, 8, app_class=AppClass.LATENCY_SENSITIVE, reservation={"cpu": 1.0})
    assert build_rollup("c", [batch], timestamp_ns=1).needs[0].aggregate_resources["cpu"] == "2"
    assert build_rollup("c", [web], timestamp_ns=1).needs[0].aggregate_resources["cpu"] == "4"


def test_the_fragmentation_allowance_asks_once_more_for_a_named_pod() -> None:
    msg = build_rollup("c", [_pod("a", 1, 1), _pod("b", 2, 2)], timestamp_ns=1, extra={"b": 1})
    assert msg.needs[0].aggregate_resources["cpu"] == "5"


def test_no_pods_is_an_empty_rollup_that_the_shard_accepts() -> None:
    msg = build_rollup("c", [], timestamp_ns=1)
    assert list(msg.needs) == []
    assert rollup_from_wire(msg, session_cluster="c").needs == ()


@pytest.mark.parametrize(
    ("dollars", "bucket"),
    [
        (0, 1),
        (0.25, 2),
        (0.5, 2),
        (0.75, 3),
        (1, 3),
        (1.5, 4),
        (100, 10),
        (8_388_608, 26),
        (1e9, 27),
    ],
)
def test_dollars_fall_in_the_smallest_bucket_whose_bound_holds_them(
    dollars: float, bucket: int
) -> None:
    assert bucket_for_dollars(dollars) == bucket
    if 2 <= bucket <= 26:
        assert penalty_bucket_dollars(bucket) >= dollars


def test_bad_pods_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"limit\[cpu\]"):
        PodSpec.build("x", {"cpu": -1.0})
    with pytest.raises(ValueError, match="unknown resource"):
        PodSpec.build("x", {"cpus": 1.0})
    with pytest.raises(ValueError, match="reservation"):
        PodSpec.build("x", {"cpu": 1.0}, reservation={"cpu": 2.0})
    with pytest.raises(ValueError, match="reservation"):
        PodSpec.build("x", {"cpu": 1.0}, app_class=AppClass.BEST_EFFORT, reservation={"cpu": 1.0})
    with pytest.raises(ValueError, match="colocation_key"):
        PodSpec.build("x", {"cpu": 1.0}, colocation="g")
    with pytest.raises(ValueError, match="interruption_penalty"):
        PodSpec.build("x", {"cpu": 1.0}, interruption_penalty=float("nan"))


M6I_4XL = Upcoming(allocatable=(15.89, 59824 * 2.0**20, 0.0), labels={})


def test_a_re_ask_that_a_machine_on_its_way_holds_asks_for_nothing() -> None:
    # Nine pods of 4 cores/16 GiB, three m6i.4xlarge bought: two have joined with
    # three pods each, the last three pods are pending and count as fragmented
    # (the two nodes hold them in total). The third machine, still configuring,
    # holds all three: nothing more is asked.
    pending = [(_pod(f"web-{i}", 4, 16), True) for i in range(6, 9)]

    assert reasks(pending, [M6I_4XL]) == {}
    assert reasks(pending, []) == {"web-6": 1, "web-7": 1, "web-8": 1}


def test_machines_on_their_way_serve_the_pending_pods_they_were_bought_for_first() -> None:
    # The machine on its way holds three pods; four are pending, the first three
    # not fragmented (it was bought for them): the fragmented fourth is re-asked.
    pending = [(_pod(f"new-{i}", 4, 16), False) for i in range(3)]
    pending.append((_pod("late", 4, 16), True))

    assert reasks(pending, [M6I_4XL]) == {"late": 1}


def test_a_machine_on_its_way_that_the_pod_cannot_use_does_not_cover_it() -> None:
    pod = _pod("zonal", 4, 16, requirements=(ZONE_A,))
    elsewhere = Upcoming(M6I_4XL.allocatable, {"topology.kubernetes.io/zone": "us-east-1b"})
    there = Upcoming(M6I_4XL.allocatable, {"topology.kubernetes.io/zone": "us-east-1a"})

    assert reasks([(pod, True)], [elsewhere]) == {"zonal": 1}
    assert reasks([(pod, True)], [there]) == {}
