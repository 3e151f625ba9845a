"""The Go reference's wire shape of ``shardread.proto``, written down for tests.

Message and enum names, field names, numbers, types and labels as the
reference (``intUnderflow/bigfleet``, ``api/proto/bigfleet/v1alpha1/
shardread.proto``) declares them — and nothing of BigFleet's own. Tests pin
our contract against it and build a client from it alone.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bigfleet.v1alpha1 import capacity_pb2, provider_pb2

F = descriptor_pb2.FieldDescriptorProto
# The reference's shape: (message, [(field, number, type, label, type_name)]).
_REPEATED, _OPTIONAL = F.LABEL_REPEATED, F.LABEL_OPTIONAL
REFERENCE_SHAPE: list[tuple[str, list[tuple[str, int, int, int, str]]]] = [
    (
        "InspectNeedsRequest",
        [
            ("cluster_id", 1, F.TYPE_STRING, _OPTIONAL, ""),
            ("limit", 2, F.TYPE_INT32, _OPTIONAL, ""),
        ],
    ),
    (
        "InspectNeedsResponse",
        [
            ("header", 1, F.TYPE_MESSAGE, _OPTIONAL, ".ref.InspectNeedsHeader"),
            ("need", 2, F.TYPE_MESSAGE, _OPTIONAL, ".ref.NeedView"),
        ],
    ),
    (
        "InspectNeedsHeader",
        [
            ("cycle", 1, F.TYPE_INT64, _OPTIONAL, ""),
            ("computed_at_unix_nanos", 2, F.TYPE_INT64, _OPTIONAL, ""),
            ("total_needs", 3, F.TYPE_INT32, _OPTIONAL, ""),
        ],
    ),
    (
        "NeedView",
        [
            ("need", 1, F.TYPE_MESSAGE, _OPTIONAL, ".bigfleet.v1alpha1.CapacityNeed"),
            ("cluster_id", 2, F.TYPE_STRING, _OPTIONAL, ""),
            ("arrival_unix_nanos", 3, F.TYPE_INT64, _OPTIONAL, ""),
            ("profile_fingerprint", 4, F.TYPE_STRING, _OPTIONAL, ""),
            ("satisfied", 5, F.TYPE_BOOL, _OPTIONAL, ""),
            ("residual_deficit", 6, F.TYPE_MESSAGE, _OPTIONAL, ".bigfleet.v1alpha1.Resources"),
            ("claimed_machine_count", 7, F.TYPE_INT32, _OPTIONAL, ""),
            ("bootstrap_count", 8, F.TYPE_INT32, _OPTIONAL, ""),
            ("provision_count", 9, F.TYPE_INT32, _OPTIONAL, ""),
            ("same_domain", 10, F.TYPE_STRING, _OPTIONAL, ""),
            ("same_satisfiable", 11, F.TYPE_BOOL, _OPTIONAL, ""),
            ("acquisition_parked", 12, F.TYPE_BOOL, _OPTIONAL, ""),
            ("parked_age_cycles", 13, F.TYPE_INT32, _OPTIONAL, ""),
            ("age_cycles_unmet", 14, F.TYPE_INT32, _OPTIONAL, ""),
            ("unmet_reason", 15, F.TYPE_ENUM, _OPTIONAL, ".ref.UnmetReason"),
            ("matching_supply", 16, F.TYPE_MESSAGE, _OPTIONAL, ".ref.MatchingSupply"),
            ("preemption", 17, F.TYPE_MESSAGE, _OPTIONAL, ".ref.PreemptionSummary"),
            ("same_candidates", 18, F.TYPE_MESSAGE, _REPEATED, ".ref.DomainCoverage"),
        ],
    ),
    (
        "MatchingSupply",
        [
            ("idle", 1, F.TYPE_INT32, _OPTIONAL, ""),
            ("configured", 2, F.TYPE_INT32, _OPTIONAL, ""),
            ("speculative", 3, F.TYPE_INT32, _OPTIONAL, ""),
            ("capped", 4, F.TYPE_BOOL, _OPTIONAL, ""),
        ],
    ),
    (
        "PreemptionSummary",
        [
            ("victims_found", 1, F.TYPE_INT32, _OPTIONAL, ""),
            ("capacity_freed", 2, F.TYPE_MESSAGE, _OPTIONAL, ".bigfleet.v1alpha1.Resources"),
        ],
    ),
    (
        "DomainCoverage",
        [
            ("domain", 1, F.TYPE_STRING, _OPTIONAL, ""),
            ("coverage_per_mille", 2, F.TYPE_INT32, _OPTIONAL, ""),
            ("satisfiable", 3, F.TYPE_BOOL, _OPTIONAL, ""),
        ],
    ),
]
REFERENCE_REASONS = {
    "UNMET_REASON_UNSPECIFIED": 0,
    "UNMET_REASON_PRIORITY_STARVED": 1,
    "UNMET_REASON_NO_MATCHING_SUPPLY": 2,
    "UNMET_REASON_TOPOLOGY_UNSATISFIABLE": 3,
    "UNMET_REASON_PREEMPTION_EXHAUSTED": 4,
}


def reference_shardread() -> dict[str, Any]:
    """Message classes built from the reference's shape alone (package ``ref``)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (capacity_pb2, provider_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    ref = descriptor_pb2.FileDescriptorProto(
        name="ref/shardread.proto",
        package="ref",
        syntax="proto3",
        dependency=[capacity_pb2.DESCRIPTOR.name, provider_pb2.DESCRIPTOR.name],
    )
    for name, fields in REFERENCE_SHAPE:
        message = ref.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name
    response = next(m for m in ref.message_type if m.name == "InspectNeedsResponse")
    response.oneof_decl.add(name="frame")
    for field in response.field:
        field.oneof_index = 0
    enum = ref.enum_type.add(name="UnmetReason")
    for value_name, number in REFERENCE_REASONS.items():
        enum.value.add(name=value_name, number=number)
    pool.Add(ref)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ref.{name}"))
        for name, _ in REFERENCE_SHAPE
    }
