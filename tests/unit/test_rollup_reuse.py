"""Converting a session's roll-ups reuses the needs it sent unchanged last time."""

from __future__ import annotations

import pytest

from bigfleet.shard.convert import InvalidRollup, rollup_from_wire
from bigfleet.v1alpha1 import capacity_pb2
from shard_engine.model import Need


def _msg(*cpus: str, ts: int = 1) -> capacity_pb2.ClusterCapacityNeeds:
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id="c1",
        timestamp_unix_nanos=ts,
        needs=[
            capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu}, priority=10 + i)
            for i, cpu in enumerate(cpus)
        ],
    )


def test_an_unchanged_need_is_the_same_value_and_a_changed_one_is_converted_anew() -> None:
    known: dict[bytes, Need] = {}
    first = rollup_from_wire(_msg("4", "8"), session_cluster="c1", known=known)
    second = rollup_from_wire(_msg("4", "16", ts=2), session_cluster="c1", known=known)
    assert second.needs[0] is first.needs[0]
    assert second.needs[1] is not first.needs[1]
    assert second.needs[1].aggregate["cpu"] == 16.0
    assert len(known) == 2  # only the latest roll-up's needs are kept


def test_the_result_equals_a_conversion_without_reuse() -> None:
    known: dict[bytes, Need] = {}
    rollup_from_wire(_msg("4", "8"), session_cluster="c1", known=known)
    reused = rollup_from_wire(_msg("4", "9", ts=2), session_cluster="c1", known=known)
    fresh = rollup_from_wire(_msg("4", "9", ts=2), session_cluster="c1")
    assert reused == fresh


def test_a_rejected_rollup_leaves_the_known_needs_as_they_were() -> None:
    known: dict[bytes, Need] = {}
    rollup_from_wire(_msg("4", "8"), session_cluster="c1", known=known)
    before = dict(known)
    with pytest.raises(InvalidRollup, match=r"needs\[1\]\.aggregate_resources\[cpu\]"):
        rollup_from_wire(_msg("4", "eight", ts=2), session_cluster="c1", known=known)
    assert known == before
