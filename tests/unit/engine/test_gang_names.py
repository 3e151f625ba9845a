"""Gang names: a gang's identity within its cluster (wire extension ``gang_name``, ADR 0161).

Without a name, gangs that are otherwise alike are told apart by their order
in the roll-up, so when an earlier gang ends each later one takes over the
key of the one before it: its machines' bindings, its arrival and its
shortfall age. A named gang keeps its key whatever other gangs do.
"""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import rollup_from_wire
from bigfleet.shard.sessions import SESSION_EXTENSIONS
from bigfleet.v1alpha1 import capacity_pb2
from shard_engine.model import Need, Operator, Requirement, Rollup
from shard_engine.needs import RollupRejected, validate_rollup

SAME_RACK = Requirement("rack", Operator.SAME)


def gang(servers: int, name: str = "", *, rack: str = "") -> Need:
    same = Requirement("rack", Operator.SAME, (rack,)) if rack else SAME_RACK
    return Need(
        requirements=(same,),
        aggregate={"nvidia.com/gpu": 8.0 * servers},
        priority=900_000,
        min_unit={"nvidia.com/gpu": 8.0},
        gang_name=name,
    )


def keys(*needs: Need) -> dict[str, str]:
    """gang name (or size, unnamed) -> the key validation gives it."""
    merged, _ = validate_rollup(Rollup("train", 1, needs))
    return {n.gang_name or str(n.aggregate["nvidia.com/gpu"]): k for k, n in merged.items()}


def test_a_named_gang_keeps_its_key_when_an_earlier_gang_ends() -> None:
    before = keys(gang(2, "a"), gang(4, "b"), gang(3, "c"))
    after = keys(gang(4, "b"), gang(3, "c"), gang(2, "d"))

    assert after["b"] == before["b"]
    assert after["c"] == before["c"]
    assert after["d"] not in before.values()  # a new gang starts with nothing of "a"'s


def test_unnamed_gangs_still_take_over_the_keys_of_those_before_them() -> None:
    # The behaviour names fix, kept for operators that send none (the Go reference's).
    before = keys(gang(2), gang(4), gang(3))
    after = keys(gang(4), gang(3))

    assert after["32.0"] == before["16.0"]
    assert after["24.0"] == before["32.0"]


def test_a_pinned_named_gang_is_the_same_need() -> None:
    assert keys(gang(3, "c"))["c"] == keys(gang(3, "c", rack="ra"))["c"]


def test_a_named_gang_resized_in_place_keeps_its_name_and_key() -> None:
    merged, previous = validate_rollup(Rollup("train", 1, (gang(3, "c"),)))
    resized, _ = validate_rollup(Rollup("train", 2, (gang(4, "c"),)), previous)

    assert list(resized) == list(merged)
    [need] = resized.values()
    assert (need.gang_name, need.aggregate["nvidia.com/gpu"]) == ("c", 32.0)


@pytest.mark.parametrize(
    ("needs", "field", "reason"),
    [
        ((gang(2, "a"), gang(3, "a")), "needs[1].gang_name", "names gang 'a' a second time"),
        ((gang(2, "x" * 254),), "needs[0].gang_name", "254 characters; at most 253"),
        ((gang(2, "a\nb"),), "needs[0].gang_name", "control characters"),
        (
            (Need(requirements=(), aggregate={"cpu": 1.0}, priority=1, gang_name="a"),),
            "needs[0].gang_name",
            "without a SAME requirement",
        ),
    ],
)
def test_a_bad_gang_name_is_refused_naming_the_field(
    needs: tuple[Need, ...], field: str, reason: str
) -> None:
    with pytest.raises(RollupRejected) as raised:
        validate_rollup(Rollup("train", 1, needs))
    assert raised.value.field == field
    assert reason in str(raised.value)


def test_the_name_arrives_from_the_wire_and_the_shard_says_it_honours_it() -> None:
    msg = capacity_pb2.ClusterCapacityNeeds(
        cluster_id="train",
        timestamp_unix_nanos=1,
        needs=[
            capacity_pb2.CapacityNeed(
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(
                        key="rack", operator=capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME
                    )
                ],
                aggregate_resources={"nvidia.com/gpu": "16"},
                priority=900_000,
                gang_name="train-000803",
            )
        ],
    )
    [need] = rollup_from_wire(msg, session_cluster="train").needs

    assert need.gang_name == "train-000803"
    assert capacity_pb2.CapacityNeed.DESCRIPTOR.fields_by_name["gang_name"].number == 1002
    assert "gang-name" in SESSION_EXTENSIONS
