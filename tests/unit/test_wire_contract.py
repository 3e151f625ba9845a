"""The committed bindings match the .proto files, and the wire shape is the reference's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bigfleet.v1alpha1 import capacity_pb2, provider_pb2, shard_pb2, shardread_pb2
from tests.reference_wire import REFERENCE_REASONS, REFERENCE_SHAPE, F

ROOT = Path(__file__).resolve().parents[2]


def test_generated_bindings_are_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _fields(message: type) -> dict[str, tuple[int, int]]:
    d = message.DESCRIPTOR  # type: ignore[attr-defined]
    return {f.name: (f.number, f.type) for f in d.fields}


def test_fencing_fields_sit_at_the_reference_numbers() -> None:
    assert {k: v[0] for k, v in _fields(provider_pb2.CreateRequest).items()} == {
        "machine_id": 1,
        "shard_id": 3,
        "shard_epoch": 4,
        "sequence_number": 5,
    }
    assert _fields(provider_pb2.ConfigureRequest)["shard_metadata"][0] == 7
    assert _fields(provider_pb2.DeleteRequest)["sequence_number"][0] == 4
    assert _fields(provider_pb2.Machine)["cluster"][0] == 14
    assert _fields(provider_pb2.Machine)["shard_metadata"][0] == 15


def test_capacity_need_keeps_field_four_reserved() -> None:
    numbers = {v[0] for v in _fields(capacity_pb2.CapacityNeed).values()}
    # 1001 and 1002 are our extensions do_not_disrupt_seconds and gang_name, which a
    # reference peer skips.
    assert 4 not in numbers and numbers == {1, 2, 3, 5, 6, 7, 8, 1001, 1002}
    assert capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME == 5
    assert capacity_pb2.PENALTY_BUCKET_PINNED == 27


def test_the_session_is_one_bidirectional_stream_in_the_reference_package() -> None:
    service = shard_pb2.DESCRIPTOR.services_by_name["Shard"]
    method = service.methods_by_name["Session"]
    assert service.full_name == "bigfleet.v1alpha1.Shard"
    assert method.input_type.name == "OperatorMessage" and method.output_type.name == "ShardMessage"
    assert {f.name: f.number for f in shard_pb2.OperatorMessage.DESCRIPTOR.fields} == {
        "hello": 1,
        "rollup": 2,
        "bootstrap_response": 3,
        "reclaim_ack": 4,
    }


def test_our_session_extensions_sit_at_high_numbers_the_reference_does_not_use() -> None:
    # The reference's ClusterCapacityNeeds has fields 1-3 and its Acknowledgement 1-3;
    # our extensions use 1001 so a reference peer skips them as unknown fields.
    assert {k: v[0] for k, v in _fields(capacity_pb2.ClusterCapacityNeeds).items()} == {
        "cluster_id": 1,
        "timestamp_unix_nanos": 2,
        "needs": 3,
        "release": 1001,
    }
    assert {k: v[0] for k, v in _fields(shard_pb2.Acknowledgement).items()} == {
        "echo": 1,
        "coordinator_term": 2,
        "shard_epoch": 3,
        "extensions": 1001,
    }


def test_a_reference_peer_reading_an_extended_rollup_sees_the_same_demand() -> None:
    sent = capacity_pb2.ClusterCapacityNeeds(
        cluster_id="c",
        timestamp_unix_nanos=5,
        release=capacity_pb2.ReleaseMachines(machine_ids=["m-1", "m-2"]),
    )
    # A message without the extension field (as the reference declares it) parses the
    # bytes, keeps the known fields and carries the extension as unknown bytes.
    stripped = capacity_pb2.ClusterCapacityNeeds(cluster_id="c", timestamp_unix_nanos=5)
    reread = capacity_pb2.ClusterCapacityNeeds.FromString(sent.SerializeToString())
    reread.ClearField("release")
    assert reread == stripped


def test_shard_read_keeps_the_reference_numbers_and_types() -> None:
    for name, fields in REFERENCE_SHAPE:
        ours = {f.name: f for f in getattr(shardread_pb2, name).DESCRIPTOR.fields}
        for field_name, number, kind, label, _ in fields:
            assert field_name in ours, f"{name}.{field_name} missing"
            mine = ours[field_name]
            repeated = label == F.LABEL_REPEATED
            assert (mine.number, mine.type, mine.is_repeated) == (number, kind, repeated), (
                f"{name}.{field_name}"
            )
        extra = [f.number for f in ours.values() if f.name not in {x[0] for x in fields}]
        assert all(n >= 100 for n in extra), f"{name}: own fields must be numbered 100+"
    assert dict(shardread_pb2.UnmetReason.items()) == REFERENCE_REASONS
    service = shardread_pb2.DESCRIPTOR.services_by_name["ShardRead"]
    method = service.methods_by_name["InspectNeeds"]
    assert service.full_name == "bigfleet.v1alpha1.ShardRead"
    assert method.server_streaming and not method.client_streaming
