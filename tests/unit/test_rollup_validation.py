"""Roll-ups are translated at the edge and validated once, by the engine.

Whichever of the two refuses a roll-up, the operator reads the wire's name
of the offending field, and nothing of the roll-up is applied.
"""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import (
    InvalidMachine,
    InvalidRollup,
    machine_record,
    metadata_priority,
    need_to_wire,
    rollup_from_wire,
    wire_field,
)
from bigfleet.v1alpha1 import capacity_pb2, provider_pb2
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState, Operator
from shard_engine.needs import RollupRejected
from tests.rollups import apply


def _need(**kw: object) -> capacity_pb2.CapacityNeed:
    base: dict[str, object] = {
        "aggregate_resources": {"cpu": "8", "memory": "32Gi"},
        "min_unit": {"cpu": "2", "memory": "4Gi"},
        "priority": 1000,
        "interruption_penalty_bucket": capacity_pb2.PENALTY_BUCKET_8,
    }
    base.update(kw)
    return capacity_pb2.CapacityNeed(**base)  # type: ignore[arg-type]


def _rollup(
    *needs: capacity_pb2.CapacityNeed, cluster: str = "c1", stamp: int = 5
) -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id=cluster, timestamp_unix_nanos=stamp, needs=needs
    )


def _refused(msg: capacity_pb2.ClusterCapacityNeeds) -> tuple[str, str]:
    """(wire field, reason) of the refusal, as the session reports it; fails if accepted."""
    engine = ShardEngine()
    try:
        apply(engine, rollup_from_wire(msg, session_cluster="c1"), now=1000.0)
    except (InvalidRollup, RollupRejected) as err:
        assert engine.summary().needs == 0
        return wire_field(err.field), err.reason
    raise AssertionError("the roll-up was accepted")


def _requirement(key: str, operator: int, *values: str) -> capacity_pb2.NodeSelectorRequirement:
    return capacity_pb2.NodeSelectorRequirement(key=key, operator=operator, values=values)  # type: ignore[arg-type]


def test_a_valid_rollup_converts_to_canonical_units() -> None:
    rollup = rollup_from_wire(_rollup(_need()), session_cluster="c1")
    (need,) = rollup.needs
    assert need.aggregate == {"cpu": 8.0, "memory": 32 * 2**30}
    assert need.min_unit == {"cpu": 2.0, "memory": 4 * 2**30}
    assert need.interruption_penalty == 8.0  # PENALTY_BUCKET_8
    assert rollup.cluster_id == "c1" and rollup.timestamp_ns == 5


def test_an_empty_rollup_is_valid_and_means_no_demand() -> None:
    assert rollup_from_wire(_rollup(), session_cluster="c1").needs == ()


@pytest.mark.parametrize(
    ("need", "field"),
    [
        (_need(aggregate_resources={"cpu": "lots"}), "needs[0].aggregate_resources[cpu]"),
        (_need(aggregate_resources={"cpu": "-1"}), "needs[0].aggregate_resources[cpu]"),
        (_need(aggregate_resources={}), "needs[0].aggregate_resources"),
        (_need(min_unit={"cpu": "16"}), "needs[0].min_unit[cpu]"),
        (_need(requirements=[_requirement("", 1, "a")]), "needs[0].requirements[0].key"),
        (_need(requirements=[_requirement("zone", 0, "a")]), "needs[0].requirements[0].operator"),
        (_need(requirements=[_requirement("zone", 1)]), "needs[0].requirements[0].values"),
        (_need(requirements=[_requirement("gpu", 3, "x")]), "needs[0].requirements[0].values"),
        (
            _need(spread=[capacity_pb2.TopologySpread(topology_key="zone", max_skew=0)]),
            "needs[0].spread[0].max_skew",
        ),
        (_need(interruption_penalty_bucket=99), "needs[0].interruption_penalty_bucket"),
        # Hostile input: overflow, underflow, NUL bytes, over-long and blank names.
        (_need(aggregate_resources={"cpu": "1e400"}), "needs[0].aggregate_resources[cpu]"),
        (_need(aggregate_resources={"cpu": "1e-400"}), "needs[0].aggregate_resources[cpu]"),
        (_need(aggregate_resources={"cpu": "9" * 5000}), "needs[0].aggregate_resources[cpu]"),
        (_need(min_unit={"cpu": "1e-10"}), "needs[0].min_unit[cpu]"),
        (_need(aggregate_resources={"cpu\x00": "1"}, min_unit={}), "needs[0].aggregate_resources"),
        # A bad name with a bad quantity: the name is quoted in the reason, never put
        # into the path (found by the wire fuzz test: a resource named "]").
        (_need(aggregate_resources={"]": ":"}, min_unit={}), "needs[0].aggregate_resources"),
        (_need(aggregate_resources={"": ""}, min_unit={}), "needs[0].aggregate_resources"),
        (
            _need(aggregate_resources={"x" * 10_000: "1"}, min_unit={}),
            "needs[0].aggregate_resources",
        ),
        (
            _need(aggregate_resources={"cpu": "1", "  ": "1"}, min_unit={}),
            "needs[0].aggregate_resources",
        ),
        (_need(requirements=[_requirement("zone\x00", 1, "a")]), "needs[0].requirements[0].key"),
        (_need(requirements=[_requirement("   ", 3)]), "needs[0].requirements[0].key"),
        (_need(requirements=[_requirement("k" * 400, 3)]), "needs[0].requirements[0].key"),
        (
            _need(requirements=[_requirement("zone", 1, "a", "b\x00")]),
            "needs[0].requirements[0].values[1]",
        ),
        (
            _need(requirements=[_requirement("zone", 2, "v" * 10_000)]),
            "needs[0].requirements[0].values[0]",
        ),
        (
            _need(spread=[capacity_pb2.TopologySpread(topology_key="\t", max_skew=1)]),
            "needs[0].spread[0].topology_key",
        ),
    ],
)
def test_an_invalid_need_is_refused_naming_its_field(
    need: capacity_pb2.CapacityNeed, field: str
) -> None:
    refused, reason = _refused(_rollup(_need(), need))
    assert refused == field.replace("needs[0]", "needs[1]")
    assert reason and len(reason) < 400


def test_a_refusal_never_echoes_a_long_value_in_full() -> None:
    _, reason = _refused(_rollup(_need(aggregate_resources={"y" * 10_000: "1"}, min_unit={})))
    assert "10000 characters" in reason and len(reason) < 200


def test_a_rollup_stamped_before_the_epoch_is_refused() -> None:
    assert _refused(_rollup(_need(), stamp=-1))[0] == "timestamp_unix_nanos"


def test_a_rollup_stamped_beyond_the_clock_skew_bound_is_refused_with_the_reason() -> None:
    # The shard's clock reads 1000 s; the bound is 300 s.
    field, reason = _refused(_rollup(_need(), stamp=1_301 * 10**9 + 1))
    assert field == "timestamp_unix_nanos"
    assert "ahead of the shard's clock" in reason and "300 s" in reason


def test_a_rollup_within_the_clock_skew_bound_is_applied() -> None:
    engine = ShardEngine()
    rollup = rollup_from_wire(_rollup(_need(), stamp=1_299 * 10**9), session_cluster="c1")
    assert apply(engine, rollup, now=1000.0).status == "applied"


def test_the_engines_field_names_map_onto_the_wires() -> None:
    assert wire_field("timestamp_ns") == "timestamp_unix_nanos"
    assert wire_field("needs[3].aggregate[cpu]") == "needs[3].aggregate_resources[cpu]"
    assert wire_field("needs[3].aggregate") == "needs[3].aggregate_resources"
    assert wire_field("needs[0].reclamation_penalty") == "needs[0].reclamation_penalty_bucket"
    assert wire_field("needs[0].requirements[1].key") == "needs[0].requirements[1].key"


def test_machines_offered_for_release_arrive_as_a_set() -> None:
    msg = _rollup(_need())
    msg.release.machine_ids.extend(["m-2", "m-1", "m-2"])
    assert rollup_from_wire(msg, session_cluster="c1").release == frozenset({"m-1", "m-2"})


def test_a_present_empty_release_list_differs_from_none_at_all() -> None:
    offered_none = _rollup(_need())
    offered_none.release.SetInParent()
    assert rollup_from_wire(offered_none, session_cluster="c1").release == frozenset()
    assert rollup_from_wire(_rollup(_need()), session_cluster="c1").release is None


def test_an_empty_machine_id_offered_for_release_is_refused_naming_its_index() -> None:
    msg = _rollup(_need())
    msg.release.machine_ids.extend(["m-1", ""])
    with pytest.raises(InvalidRollup) as caught:
        rollup_from_wire(msg, session_cluster="c1")
    assert caught.value.field == "release.machine_ids[1]"


def test_a_rollup_for_another_cluster_is_refused() -> None:
    with pytest.raises(InvalidRollup, match="cluster_id"):
        rollup_from_wire(_rollup(_need(), cluster="other"), session_cluster="c1")


def test_same_operator_keeps_its_optional_values() -> None:
    req = capacity_pb2.NodeSelectorRequirement(
        key="topology.kubernetes.io/rack",
        operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME,
    )
    (need,) = rollup_from_wire(_rollup(_need(requirements=[req])), session_cluster="c1").needs
    assert need.requirements[0].operator is Operator.SAME


def _machine(**kw: object) -> provider_pb2.Machine:
    base: dict[str, object] = {
        "id": "m1",
        "state": provider_pb2.MACHINE_STATE_IDLE,
        "price_per_hour": 1.0,
        "interruption_probability": 0.0,
        "allocatable": provider_pb2.Resources(resources={"cpu": "16", "memory": "64Gi"}),
    }
    base.update(kw)
    return provider_pb2.Machine(**base)  # type: ignore[arg-type]


def test_a_provider_machine_converts_with_allocatable_in_canonical_units() -> None:
    rec = machine_record("sim", _machine())
    assert rec.state is MachineState.IDLE and rec.allocatable["memory"] == 64 * 2**30


def test_allocatable_falls_back_to_resources_when_unset() -> None:
    m = _machine()
    m.ClearField("allocatable")
    m.resources.resources["cpu"] = "4"
    assert machine_record("sim", m).allocatable == {"cpu": 4.0}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"price_per_hour": float("nan")}, "price_per_hour"),
        ({"price_per_hour": -1.0}, "price_per_hour"),
        ({"interruption_probability": 1.5}, "interruption_probability"),
        ({"interruption_probability": float("nan")}, "interruption_probability"),
        ({"allocatable": provider_pb2.Resources(resources={"cpu": "x"})}, "allocatable"),
        ({"allocatable": provider_pb2.Resources(resources={"cpu": "1e400"})}, "allocatable"),
        ({"allocatable": provider_pb2.Resources(resources={"c\x00": "1"})}, "allocatable"),
        ({"id": "m\x001"}, "id"),
        ({"id": "m" * 10_000}, "id"),
        ({"id": " "}, "id"),
        ({"labels": {"zone\x00": "a"}}, "labels"),
        ({"labels": {"topology.kubernetes.io/zone": "a b"}}, "labels[topology.kubernetes.io/zone]"),
        ({"zone": "x" * 64}, "zone"),
        ({"instance_type": "m5\x00large"}, "instance_type"),
        ({"cluster": "c1\x00"}, "cluster"),
    ],
)
def test_nonsense_from_a_provider_is_refused_not_absorbed(
    kw: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidMachine) as caught:
        machine_record("sim", _machine(**kw))
    assert caught.value.field == field


def test_a_providers_error_text_is_kept_short_and_without_nul_bytes() -> None:
    rec = machine_record("sim", _machine(last_error="boom\x00" + "x" * 5000))
    assert "\x00" not in rec.last_error and len(rec.last_error) <= 1024


@pytest.mark.parametrize(
    ("raw", "priority"),
    [
        ("1000", 1000),
        ("-5", -5),
        ("", None),
        ("-", None),
        ("12a", None),
        ("²", None),
        ("9" * 5000, None),
        (str(2**31), None),
        (str(-(2**31)), -(2**31)),
    ],
)
def test_a_stamped_priority_is_read_only_when_it_is_an_int32(
    raw: str, priority: int | None
) -> None:
    machine = _machine(shard_metadata={"bigfleet.io/priority": raw})
    assert metadata_priority(machine, "bigfleet.io/priority") == priority


@pytest.mark.parametrize("bucket", list(range(1, 28)))
def test_a_need_goes_back_to_the_wire_with_the_bucket_it_came_with(bucket: int) -> None:
    sent = capacity_pb2.CapacityNeed(
        aggregate_resources={"cpu": "1500m", "memory": "3Gi"},
        priority=7,
        interruption_penalty_bucket=bucket,  # type: ignore[arg-type]
        reclamation_penalty_bucket=bucket,  # type: ignore[arg-type]
        min_unit={"cpu": "500m"},
    )
    rollup = rollup_from_wire(
        capacity_pb2.ClusterCapacityNeeds(cluster_id="c", timestamp_unix_nanos=1, needs=[sent]),
        session_cluster="c",
    )

    back = need_to_wire(rollup.needs[0])

    assert back.interruption_penalty_bucket == back.reclamation_penalty_bucket == bucket
    assert dict(back.aggregate_resources) == {"cpu": "1500m", "memory": "3Gi"}
    assert dict(back.min_unit) == {"cpu": "500m"} and back.priority == 7
