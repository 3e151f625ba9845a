"""Translation between the wire (``bigfleet.v1alpha1``) and the engine's values.

Roll-ups are validated once, by the engine (``shard_engine.needs``: names,
ranges, requirements, spreads, priorities, counts, the clock-skew bound).
This edge only translates: a quantity string that does not parse, an enum
value the engine has no name for, or a penalty bucket that does not exist
cannot become an engine value and is refused here as :class:`InvalidRollup`,
as are the two rules of the wire's own meaning of ``min_unit`` (a need names
at least one resource, and no unit exceeds its aggregate) that the engine
does not need. :func:`wire_field` maps the engine's field paths
(``needs[2].aggregate[cpu]``) onto the wire's (``needs[2].aggregate_resources[cpu]``)
so an operator always reads the name it sent.
"""

from __future__ import annotations

import functools
import math
import re
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
from shard_engine.names import label_key_problem, label_value_problem, machine_id_problem, shown
from shard_engine.needs import MAX_NEEDS
from shard_engine.quantity import InvalidQuantity, format_quantity, parse_quantity
from workflows.contracts import RequirementSpec

__all__ = [
    "InvalidMachine",
    "InvalidRollup",
    "error_text",
    "machine_record",
    "metadata_priority",
    "need_to_wire",
    "penalty_bucket_of",
    "requirement_specs",
    "requirements_to_wire",
    "resources_to_wire",
    "rollup_from_wire",
    "wire_field",
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


_MAX_RELEASE = 100_000
# The extension do_not_disrupt_seconds: at most 30 days (a longer hold is a pin, not a need).
MAX_DO_NOT_DISRUPT_SECONDS = 30 * 86400


#: Quantity strings repeat across roll-ups ("4", "16Gi"): parse each once. Bounded;
#: an invalid string raises every time (exceptions are not cached).
_quantity = functools.lru_cache(maxsize=16384)(parse_quantity)


def _resources(raw: Mapping[str, str], field: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, text in raw.items():
        try:
            out[name] = _quantity(text)
        except InvalidQuantity as err:
            # The key goes into the field's path only when it is a valid resource
            # name: a hostile key ("]", a NUL, 10,000 characters) is quoted in the
            # reason instead, so the path stays parseable.
            problem = label_key_problem(name)
            if problem is not None:
                raise InvalidRollup(field, f"resource name {shown(name)} {problem}") from None
            raise InvalidRollup(
                f"{field}[{name}]", f"invalid quantity {shown(text)}: {err.reason}"
            ) from None
    return out


def _requirement(req: capacity_pb2.NodeSelectorRequirement, field: str) -> Requirement:
    try:
        op = Operator(req.operator)
    except ValueError:
        raise InvalidRollup(
            f"{field}.operator", f"unknown or unspecified operator {req.operator}"
        ) from None
    return Requirement(req.key, op, tuple(req.values))


def _spread(spread: capacity_pb2.TopologySpread, field: str) -> TopologySpread:
    try:
        when = WhenUnsatisfiable(spread.when_unsatisfiable)
    except ValueError:
        raise InvalidRollup(
            f"{field}.when_unsatisfiable", f"unknown value {spread.when_unsatisfiable}"
        ) from None
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
                f"{shown(need.min_unit[name])} exceeds the aggregate "
                f"{shown(need.aggregate_resources.get(name, '0'))}",
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
        do_not_disrupt_seconds=_do_not_disrupt(need.do_not_disrupt_seconds, field),
        gang_name=need.gang_name,
    )


def _do_not_disrupt(seconds: int, field: str) -> float:
    """The extension ``do_not_disrupt_seconds`` (shard_engine.budgets), within its bounds."""
    if 0 <= seconds <= MAX_DO_NOT_DISRUPT_SECONDS:
        return float(seconds)
    raise InvalidRollup(
        f"{field}.do_not_disrupt_seconds",
        f"{seconds} is outside 0 to {MAX_DO_NOT_DISRUPT_SECONDS} (30 days)",
    )


_SERIALIZE = capacity_pb2.CapacityNeed.SerializeToString


def rollup_from_wire(
    msg: capacity_pb2.ClusterCapacityNeeds,
    *,
    session_cluster: str,
    known: dict[bytes, Need] | None = None,
) -> Rollup:
    """Translate one roll-up received on ``session_cluster``'s session into engine values.

    The engine's rules (``shard_engine.needs.validate_rollup``) judge the
    result; see the module docstring. ``known`` maps the wire bytes of the
    needs of the session's previous roll-up to their converted values. A
    need sent again unchanged (most of them, every ten seconds) is then
    reused instead of converted again, and validation recognises the very
    object at once (``ValidatedRollup.check``, ADR 0145). The map is replaced, in
    place, by this roll-up's needs — so it never holds more than one roll-up.
    """
    if msg.cluster_id and msg.cluster_id != session_cluster:
        raise InvalidRollup(
            "cluster_id",
            f"{shown(msg.cluster_id)} does not match the session's {session_cluster!r}",
        )
    if len(msg.needs) > MAX_NEEDS:  # the engine's rule, checked before translating them all
        raise InvalidRollup("needs", f"{len(msg.needs)} needs; at most {MAX_NEEDS}")
    if known is None:
        needs = tuple(_need(n, i) for i, n in enumerate(msg.needs))
    else:
        # The key only has to be sound (equal bytes, equal need), and a need
        # parsed from the same bytes serializes to the same bytes again; the
        # deterministic form (sorted map keys) costs two and a half times more.
        # Serializing and looking up run as C-level maps: a roll-up is mostly
        # needs re-sent unchanged, and this loop is most of its translation.
        wires = list(map(_SERIALIZE, msg.needs))
        found: list[Need | None] = list(map(known.get, wires))
        for i, need in enumerate(found):
            if need is None:
                found[i] = _need(msg.needs[i], i)
        needs = tuple(found)  # type: ignore[arg-type]  # every None was converted
    release = _release(msg.release.machine_ids) if msg.HasField("release") else None
    if known is not None:
        known.clear()
        known.update(zip(wires, needs, strict=True))
    return Rollup(session_cluster, msg.timestamp_unix_nanos, needs, release=release)


def _release(ids: Sequence[str]) -> frozenset[str]:
    """The extension ``release``: machines the cluster offers for release."""
    if len(ids) > _MAX_RELEASE:
        raise InvalidRollup(
            "release.machine_ids", f"{len(ids)} machine ids exceed the limit of {_MAX_RELEASE}"
        )
    for i, machine_id in enumerate(ids):
        problem = machine_id_problem(machine_id)
        if problem is not None:
            raise InvalidRollup(f"release.machine_ids[{i}]", problem)
    return frozenset(ids)


_ENGINE_TO_WIRE = (
    (re.compile(r"^timestamp_ns\b"), "timestamp_unix_nanos"),
    (re.compile(r"^(needs\[\d+\])\.aggregate\b"), r"\1.aggregate_resources"),
    (
        re.compile(r"^(needs\[\d+\])\.(interruption|reclamation)_penalty\b"),
        r"\1.\2_penalty_bucket",
    ),
)


def wire_field(field: str) -> str:
    """The wire's name for a field path the engine reports (identity where they agree)."""
    for pattern, replacement in _ENGINE_TO_WIRE:
        field = pattern.sub(replacement, field, count=1)
    return field


MAX_ERROR_TEXT = 1024
"""Longest ``last_error`` kept from a provider (the rest is cut, marked with "…")."""


def _names(m: provider_pb2.Machine) -> None:
    """Refuse a machine whose id, labels or placement names break the naming rules."""
    problem = machine_id_problem(m.id)
    if problem is not None:
        raise InvalidMachine(shown(m.id), "id", problem)
    for key, value in m.labels.items():
        problem = label_key_problem(key)
        if problem is not None:
            raise InvalidMachine(m.id, "labels", f"key {problem}")
        problem = label_value_problem(value)
        if problem is not None:
            raise InvalidMachine(m.id, f"labels[{key}]", problem)
    for name, value in (("zone", m.zone), ("instance_type", m.instance_type)):
        problem = label_value_problem(value)
        if problem is not None:
            raise InvalidMachine(m.id, name, problem)
    for name, value in (("cluster", m.cluster), ("host.ref", m.host.ref)):
        problem = machine_id_problem(value) if value else None
        if problem is not None:
            raise InvalidMachine(m.id, name, problem)


def error_text(text: str) -> str:
    """A provider's free-text error made safe to store: no NUL, at most ``MAX_ERROR_TEXT``."""
    text = text.replace("\x00", "\\0")
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


def metadata_priority(m: provider_pb2.Machine, key: str) -> int | None:
    """The int32 priority a shard stamped into ``shard_metadata[key]``, or None if unusable."""
    raw = m.shard_metadata.get(key, "")
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits or len(digits) > 10 or not digits.isascii() or not digits.isdigit():
        return None
    value = int(raw)
    return value if -(2**31) <= value < 2**31 else None


def machine_record(provider: str, m: provider_pb2.Machine) -> MachineRecord:
    """Convert a provider's machine into the engine's record, refusing nonsense values.

    Names follow ``shard_engine.names`` (a provider that lists a machine id
    with a NUL byte, or a label no Kubernetes node could carry, gets that
    machine ignored with a log line, not a crashed observer).
    """
    _names(m)
    raw = m.allocatable.resources if m.HasField("allocatable") else m.resources.resources
    try:
        allocatable = {}
        for name, text in raw.items():
            problem = label_key_problem(name)
            if problem is not None:
                raise InvalidMachine(m.id, "allocatable", f"resource name {problem}")
            allocatable[name] = parse_quantity(text, field=name)
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
        last_error=error_text(m.last_error),
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


def penalty_bucket_of(dollars: float) -> int:
    """The wire ``PenaltyBucket`` whose upper bound is ``dollars`` (inverse of the roll-up's map).

    Dollars come from a bucket, so they are 0, 0.5, a power of two up to
    $8,388,608, or the pinned value; anything else rounds up to the next
    bucket.
    """
    if dollars <= 0:
        return int(capacity_pb2.PENALTY_BUCKET_ZERO)
    if dollars <= 0.5:
        return int(capacity_pb2.PENALTY_BUCKET_HALF_DOLLAR)
    exponent = max(0, math.ceil(math.log2(dollars) - 1e-12))
    return min(3 + exponent, int(capacity_pb2.PENALTY_BUCKET_PINNED))


def need_to_wire(need: Need) -> capacity_pb2.CapacityNeed:
    """A need as the cluster would have sent it (quantities canonical, penalties as buckets)."""
    return capacity_pb2.CapacityNeed(
        requirements=requirements_to_wire(requirement_specs(need.requirements)),
        aggregate_resources=resources_to_wire(need.aggregate).resources,
        priority=need.priority,
        spread=[
            capacity_pb2.TopologySpread(
                topology_key=s.topology_key,
                max_skew=s.max_skew,
                when_unsatisfiable=int(s.when_unsatisfiable),  # type: ignore[arg-type]
            )
            for s in need.spread
        ],
        interruption_penalty_bucket=penalty_bucket_of(need.interruption_penalty),  # type: ignore[arg-type]
        reclamation_penalty_bucket=penalty_bucket_of(need.reclamation_penalty),  # type: ignore[arg-type]
        min_unit=resources_to_wire(need.min_unit).resources,
    )
