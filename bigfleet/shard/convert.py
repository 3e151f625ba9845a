"""Translation between the wire (``bigfleet.v1alpha1``) and the engine's values.

Validation happens here, once, at the edge: a roll-up either converts into a
fully valid :class:`shard_engine.model.Rollup` or raises :class:`InvalidRollup`
naming the offending field path (``needs[2].min_unit[cpu]``) and the reason.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

from bigfleet.v1alpha1 import capacity_pb2, provider_pb2
from shard_engine.model import (
    CapacityType,
    MachineRecord,
    MachineState,
    Need,
    Operator,
    Requirement,
    Rollup,
    TopologySpread,
    WhenUnsatisfiable,
    penalty_bucket_dollars,
)
from shard_engine.quantity import InvalidQuantity, format_quantity, parse_quantity
from workflows.contracts import RequirementSpec

__all__ = [
    "InvalidMachine",
    "InvalidRollup",
    "machine_record",
    "requirement_specs",
    "requirements_to_wire",
    "resources_to_wire",
    "rollup_from_wire",
]


class InvalidRollup(ValueError):
    """A roll-up the shard refuses; the previous needs of the cluster stay in force."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


class InvalidMachine(ValueError):
    """A provider record the shard cannot use (unparseable allocatable, bad price, ...)."""

    def __init__(self, machine_id: str, field: str, reason: str) -> None:
        self.machine_id, self.field, self.reason = machine_id, field, reason
        super().__init__(f"machine {machine_id!r}: {field}: {reason}")


_MAX_NEEDS = 10_000
_MAX_RELEASE = 100_000
_VALUED = (Operator.IN, Operator.NOT_IN)
_UNVALUED = (Operator.EXISTS, Operator.DOES_NOT_EXIST)


#: Quantity strings repeat across roll-ups ("4", "16Gi"): parse each once. Bounded;
#: an invalid string raises every time (exceptions are not cached).
_quantity = functools.lru_cache(maxsize=16384)(parse_quantity)


def _resources(raw: Mapping[str, str], field: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, text in raw.items():
        if not name:
            raise InvalidRollup(field, "resource name must not be empty")
        try:
            out[name] = _quantity(text)
        except InvalidQuantity as err:
            raise InvalidRollup(
                f"{field}[{name}]", f"invalid quantity {text!r}: {err.reason}"
            ) from None
    return out


def _requirement(req: capacity_pb2.NodeSelectorRequirement, field: str) -> Requirement:
    if not req.key:
        raise InvalidRollup(f"{field}.key", "must not be empty")
    try:
        op = Operator(req.operator)
    except ValueError:
        raise InvalidRollup(
            f"{field}.operator", f"unknown or unspecified operator {req.operator}"
        ) from None
    values = tuple(req.values)
    if op in _VALUED and not values:
        raise InvalidRollup(f"{field}.values", f"{op.name} needs at least one value")
    if op in _UNVALUED and values:
        raise InvalidRollup(f"{field}.values", f"{op.name} takes no values")
    return Requirement(req.key, op, values)


def _spread(spread: capacity_pb2.TopologySpread, field: str) -> TopologySpread:
    if not spread.topology_key:
        raise InvalidRollup(f"{field}.topology_key", "must not be empty")
    if spread.max_skew < 1:
        raise InvalidRollup(f"{field}.max_skew", f"must be at least 1, got {spread.max_skew}")
    try:
        when = WhenUnsatisfiable(spread.when_unsatisfiable)
    except ValueError:
        raise InvalidRollup(f"{field}.when_unsatisfiable", "unknown value") from None
    if when is WhenUnsatisfiable.UNSPECIFIED:
        when = WhenUnsatisfiable.DO_NOT_SCHEDULE
    return TopologySpread(spread.topology_key, spread.max_skew, when)


def _penalty(bucket: int, field: str) -> float:
    try:
        return penalty_bucket_dollars(bucket)
    except ValueError:
        raise InvalidRollup(field, f"unknown penalty bucket {bucket}") from None


_PENALTIES: dict[int, float] = {}


def _penalty_of(bucket: int, field: str) -> float:
    cached = _PENALTIES.get(bucket)
    if cached is not None:
        return cached
    value = _penalty(bucket, field)
    _PENALTIES[bucket] = value
    return value


def _need(need: capacity_pb2.CapacityNeed, i: int) -> Need:
    """One need; field paths (``needs[i].min_unit[cpu]``) are built only for an error."""
    field = f"needs[{i}]"
    aggregate = _resources(need.aggregate_resources, f"{field}.aggregate_resources")
    if not aggregate:
        raise InvalidRollup(f"{field}.aggregate_resources", "must name at least one resource")
    min_unit = _resources(need.min_unit, f"{field}.min_unit") if need.min_unit else {}
    for name, unit in min_unit.items():
        if unit > aggregate.get(name, 0.0):
            raise InvalidRollup(
                f"{field}.min_unit[{name}]",
                f"{need.min_unit[name]} exceeds the aggregate "
                f"{need.aggregate_resources.get(name, '0')}",
            )
    return Need(
        requirements=tuple(
            _requirement(r, f"{field}.requirements[{k}]") for k, r in enumerate(need.requirements)
        ),
        aggregate=aggregate,
        priority=need.priority,
        min_unit=min_unit,
        spread=tuple(_spread(s, f"{field}.spread[{k}]") for k, s in enumerate(need.spread)),
        interruption_penalty=_penalty_of(
            need.interruption_penalty_bucket, f"{field}.interruption_penalty_bucket"
        ),
        reclamation_penalty=_penalty_of(
            need.reclamation_penalty_bucket, f"{field}.reclamation_penalty_bucket"
        ),
    )


def rollup_from_wire(
    msg: capacity_pb2.ClusterCapacityNeeds,
    *,
    session_cluster: str,
    known: dict[bytes, Need] | None = None,
) -> Rollup:
    """Validate and convert one roll-up received on ``session_cluster``'s session.

    ``known`` maps the wire bytes of the needs of the session's previous
    roll-up to their converted values. A need sent again unchanged (most of
    them, every ten seconds) is then reused instead of converted again; the
    engine also recognises a reused value at once. The map is replaced, in
    place, by this roll-up's needs — so it never holds more than one roll-up.
    """
    if msg.cluster_id and msg.cluster_id != session_cluster:
        raise InvalidRollup(
            "cluster_id", f"{msg.cluster_id!r} does not match the session's {session_cluster!r}"
        )
    if msg.timestamp_unix_nanos < 0:
        raise InvalidRollup("timestamp_unix_nanos", "must not be negative")
    if len(msg.needs) > _MAX_NEEDS:
        raise InvalidRollup("needs", f"{len(msg.needs)} needs exceed the limit of {_MAX_NEEDS}")
    if known is None:
        needs = tuple(_need(n, i) for i, n in enumerate(msg.needs))
    else:
        current: dict[bytes, Need] = {}
        converted = []
        for i, n in enumerate(msg.needs):
            wire = n.SerializeToString(deterministic=True)
            need = known.get(wire)
            if need is None:
                need = _need(n, i)
            current[wire] = need
            converted.append(need)
        needs = tuple(converted)
    release = _release(msg.release.machine_ids) if msg.HasField("release") else None
    if known is not None:
        known.clear()
        known.update(current)
    return Rollup(session_cluster, msg.timestamp_unix_nanos, needs, release=release)


def _release(ids: Sequence[str]) -> frozenset[str]:
    """The extension ``release``: machines the cluster offers for release."""
    if len(ids) > _MAX_RELEASE:
        raise InvalidRollup(
            "release.machine_ids", f"{len(ids)} machine ids exceed the limit of {_MAX_RELEASE}"
        )
    for i, machine_id in enumerate(ids):
        if not machine_id:
            raise InvalidRollup(f"release.machine_ids[{i}]", "must not be empty")
    return frozenset(ids)


def machine_record(provider: str, m: provider_pb2.Machine) -> MachineRecord:
    """Convert a provider's machine into the engine's record, refusing nonsense values."""
    raw = m.allocatable.resources if m.HasField("allocatable") else m.resources.resources
    try:
        allocatable = {name: parse_quantity(text) for name, text in raw.items()}
    except InvalidQuantity as err:
        raise InvalidMachine(m.id, "allocatable", str(err)) from None
    if not math.isfinite(m.price_per_hour) or m.price_per_hour < 0:
        raise InvalidMachine(
            m.id, "price_per_hour", f"{m.price_per_hour} is not a finite price >= 0"
        )
    p = m.interruption_probability
    if not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise InvalidMachine(m.id, "interruption_probability", f"{p} is not in [0, 1]")
    try:
        state = MachineState(m.state)
        capacity = CapacityType(m.capacity_type)
    except ValueError as err:
        raise InvalidMachine(m.id, "state", str(err)) from None
    return MachineRecord(
        id=m.id,
        state=state,
        provider=provider,
        instance_type=m.instance_type,
        zone=m.zone,
        capacity_type=capacity,
        price_per_hour=m.price_per_hour,
        interruption_probability=p,
        allocatable=allocatable,
        labels=dict(m.labels),
        cluster=m.cluster,
        host_ref=m.host.ref,
        last_error=m.last_error,
    )


def requirement_specs(reqs: Sequence[Requirement]) -> list[RequirementSpec]:
    return [RequirementSpec(r.key, int(r.operator), list(r.values)) for r in reqs]


def requirements_to_wire(
    reqs: Sequence[RequirementSpec],
) -> list[capacity_pb2.NodeSelectorRequirement]:
    return [
        capacity_pb2.NodeSelectorRequirement(
            key=r.key,
            operator=r.operator,  # type: ignore[arg-type]
            values=r.values,
        )
        for r in reqs
    ]


def resources_to_wire(resources: Mapping[str, float]) -> provider_pb2.Resources:
    return provider_pb2.Resources(
        resources={name: format_quantity(name, v) for name, v in resources.items()}
    )
