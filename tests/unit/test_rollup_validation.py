"""Roll-ups are validated once at the edge; a bad one names its field and changes nothing."""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import InvalidMachine, InvalidRollup, machine_record, rollup_from_wire
from bigfleet.v1alpha1 import capacity_pb2, provider_pb2
from shard_engine.model import MachineState, Operator


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
    *needs: capacity_pb2.CapacityNeed, cluster: str = "c1"
) -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id=cluster, timestamp_unix_nanos=5, needs=needs
    )


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
        (
            _need(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="", operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_IN
                    )
                ]
            ),
            "needs[0].requirements[0].key",
        ),
        (
            _need(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="zone",
                        operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_UNSPECIFIED,
                    )
                ]
            ),
            "needs[0].requirements[0].operator",
        ),
        (
            _need(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="zone", operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_IN
                    )
                ]
            ),
            "needs[0].requirements[0].values",
        ),
        (
            _need(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="gpu",
                        operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_EXISTS,
                        values=["x"],
                    )
                ]
            ),
            "needs[0].requirements[0].values",
        ),
        (
            _need(spread=[capacity_pb2.TopologySpread(topology_key="zone", max_skew=0)]),
            "needs[0].spread[0].max_skew",
        ),
        (_need(interruption_penalty_bucket=99), "needs[0].interruption_penalty_bucket"),
    ],
)
def test_an_invalid_need_is_refused_naming_its_field(
    need: capacity_pb2.CapacityNeed, field: str
) -> None:
    with pytest.raises(InvalidRollup) as caught:
        rollup_from_wire(_rollup(_need(), need), session_cluster="c1")
    assert caught.value.field == field.replace("needs[0]", "needs[1]")
    assert field.replace("needs[0]", "needs[1]") in str(caught.value)


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
    ],
)
def test_nonsense_from_a_provider_is_refused_not_absorbed(
    kw: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidMachine) as caught:
        machine_record("sim", _machine(**kw))
    assert caught.value.field == field
