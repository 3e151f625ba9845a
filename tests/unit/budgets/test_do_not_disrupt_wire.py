"""do_not_disrupt_seconds on the wire: a BigFleet extension at field 1001 of CapacityNeed."""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import InvalidRollup, rollup_from_wire
from bigfleet.shard.sessions import SESSION_EXTENSIONS
from bigfleet.v1alpha1 import capacity_pb2


def rollup(seconds: int) -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id="c1",
        timestamp_unix_nanos=1,
        needs=[
            capacity_pb2.CapacityNeed(
                aggregate_resources={"cpu": "4"}, priority=10, do_not_disrupt_seconds=seconds
            )
        ],
    )


def test_a_need_asking_for_do_not_disrupt_reaches_the_engine() -> None:
    [need] = rollup_from_wire(rollup(7200), session_cluster="c1").needs

    assert need.do_not_disrupt_seconds == 7200.0


def test_asking_for_it_does_not_make_the_need_another_need() -> None:
    [plain] = rollup_from_wire(rollup(0), session_cluster="c1").needs
    [asked] = rollup_from_wire(rollup(60), session_cluster="c1").needs

    assert plain.key == asked.key


@pytest.mark.parametrize("seconds", [-1, 30 * 86400 + 1])
def test_an_out_of_range_duration_names_the_field(seconds: int) -> None:
    with pytest.raises(InvalidRollup, match=r"needs\[0\]\.do_not_disrupt_seconds: .* outside 0"):
        rollup_from_wire(rollup(seconds), session_cluster="c1")


def test_a_reference_peer_reading_it_sees_the_same_need() -> None:
    reread = capacity_pb2.ClusterCapacityNeeds.FromString(rollup(3600).SerializeToString())
    reread.needs[0].ClearField("do_not_disrupt_seconds")

    assert reread == rollup(0)
    assert (
        capacity_pb2.CapacityNeed.DESCRIPTOR.fields_by_name["do_not_disrupt_seconds"].number == 1001
    )


def test_the_shard_says_it_honours_the_extension_in_its_hello_acknowledgement() -> None:
    assert "do-not-disrupt" in SESSION_EXTENSIONS
