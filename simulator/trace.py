"""The trace format: JSON lines of pod arrivals and departures.

One JSON object per line, in non-decreasing time order. Blank lines and
lines starting with ``#`` are ignored. An optional first line is a header::

    {"format": "bigfleet-trace/v1", "duration": 86400, "description": "..."}

``duration`` (seconds) is how long the replay runs; without it the replay
ends an hour after the last event. Every other line is an event:

    {"t": 12.5, "event": "arrive", "cluster": "web-003", "pod": "api-17",
     "cpu": "500m", "memory": "1Gi", "gpu": 0,
     "app_class": "latency-sensitive", "reservation": {"cpu": "250m"},
     "priority": 500000, "interruption_penalty": 8, "reclamation_penalty": 2,
     "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
     "spread": [{"topology_key": "topology.kubernetes.io/zone", "max_skew": 1,
                 "when_unsatisfiable": "DoNotSchedule"}],
     "colocation": "train-4", "colocation_key": "topology.kubernetes.io/rack"}
    {"t": 3600, "event": "leave", "cluster": "web-003", "pod": "api-17"}

* `t`: seconds from the start of the replay (number ≥ 0);
* `event`: `arrive` or `leave`;
* `cluster`, `pod`: ids; a pod name is unique in its cluster while it lives;
* `cpu`, `memory`, `gpu`: the pod's **limit**, a number in canonical units
  (cores, bytes, devices) or a Kubernetes quantity string;
* `app_class`: `latency-sensitive`, `batch` (default) or `best-effort`;
* `reservation`: the expected use, same units; defaults to the limit (0 for
  best-effort);
* `priority`: integer, default 0;
* `interruption_penalty`, `reclamation_penalty`: dollars, default 0;
* `requirements`: node-selector requirements — `key`, `operator` (`In`,
  `NotIn`, `Exists`, `DoesNotExist`, `Same`), `values`;
* `spread`: topology spreads — `topology_key`, `max_skew` ≥ 1,
  `when_unsatisfiable` (`DoNotSchedule`, the default, or `ScheduleAnyway`);
* `colocation`, `colocation_key`: a gang, whose pods share one value of the key.

A bad line raises :class:`TraceError` naming the line number, the field and
the reason; nothing of a bad trace is replayed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusters.pods import PodSpec
from shard_engine.model import AppClass, Operator, Requirement, TopologySpread, WhenUnsatisfiable
from shard_engine.quantity import InvalidQuantity, parse_quantity

__all__ = [
    "FORMAT",
    "Arrive",
    "Event",
    "Leave",
    "Trace",
    "TraceError",
    "dump_trace",
    "event_to_json",
    "load_trace",
    "parse_trace",
]

FORMAT = "bigfleet-trace/v1"

_OPERATORS = {
    "In": Operator.IN,
    "NotIn": Operator.NOT_IN,
    "Exists": Operator.EXISTS,
    "DoesNotExist": Operator.DOES_NOT_EXIST,
    "Same": Operator.SAME,
}
_OPERATOR_NAMES = {v: k for k, v in _OPERATORS.items()}
_WHEN = {
    "DoNotSchedule": WhenUnsatisfiable.DO_NOT_SCHEDULE,
    "ScheduleAnyway": WhenUnsatisfiable.SCHEDULE_ANYWAY,
}
_WHEN_NAMES = {v: k for k, v in _WHEN.items()}
_CLASSES = {c.value: c for c in AppClass}
_RESOURCES = {"cpu": "cpu", "memory": "memory", "gpu": "nvidia.com/gpu"}
_ARRIVE_FIELDS = frozenset(
    {
        "t",
        "event",
        "cluster",
        "pod",
        *_RESOURCES,
        "app_class",
        "reservation",
        "priority",
        "interruption_penalty",
        "reclamation_penalty",
        "requirements",
        "spread",
        "colocation",
        "colocation_key",
    }
)


class TraceError(ValueError):
    """A trace line that cannot be replayed: names the line, the field and the reason."""

    def __init__(self, line: int, field: str, reason: str) -> None:
        self.line, self.field, self.reason = line, field, reason
        super().__init__(f"trace line {line}: {field}: {reason}")


@dataclass(frozen=True, slots=True)
class Arrive:
    """A pod is created in ``cluster`` at ``t``."""

    t: float
    cluster: str
    pod: PodSpec


@dataclass(frozen=True, slots=True)
class Leave:
    """A pod of ``cluster`` finishes (or is deleted) at ``t``."""

    t: float
    cluster: str
    pod: str


Event = Arrive | Leave


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace: events in time order and how long to replay."""

    events: tuple[Event, ...]
    duration: float
    description: str = ""

    @property
    def clusters(self) -> tuple[str, ...]:
        """Every cluster the trace names, sorted."""
        return tuple(sorted({e.cluster for e in self.events}))


def _number(raw: Any, line: int, field: str, *, minimum: float | None = 0.0) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise TraceError(line, field, f"expected a finite number, got {raw!r}")
    if minimum is not None and raw < minimum:
        raise TraceError(line, field, f"must be >= {minimum:g}, got {raw!r}")
    return float(raw)


def _string(raw: Any, line: int, field: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise TraceError(line, field, f"expected a non-empty string, got {raw!r}")
    return raw


def _quantity(raw: Any, line: int, field: str, name: str) -> float:
    if isinstance(raw, str):
        try:
            return parse_quantity(raw)
        except InvalidQuantity as err:
            raise TraceError(line, field, f"invalid quantity {raw!r}: {err.reason}") from None
    return _number(raw, line, field)


def _resources(obj: Mapping[str, Any], line: int, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for short, name in _RESOURCES.items():
        if short in obj:
            out[name] = _quantity(obj[short], line, f"{prefix}{short}", name)
    return out


def _requirement(raw: Any, line: int, field: str) -> Requirement:
    if not isinstance(raw, dict):
        raise TraceError(line, field, "expected an object with key, operator, values")
    key = _string(raw.get("key"), line, f"{field}.key")
    op_name = raw.get("operator")
    if op_name not in _OPERATORS:
        choices = ", ".join(_OPERATORS)
        raise TraceError(line, f"{field}.operator", f"unknown {op_name!r}; choose from {choices}")
    values = raw.get("values", [])
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TraceError(line, f"{field}.values", "expected a list of strings")
    op = _OPERATORS[op_name]
    if op in (Operator.IN, Operator.NOT_IN) and not values:
        raise TraceError(line, f"{field}.values", f"{op_name} needs at least one value")
    if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
        raise TraceError(line, f"{field}.values", f"{op_name} takes no values")
    return Requirement(key, op, tuple(values))


def _spread(raw: Any, line: int, field: str) -> TopologySpread:
    if not isinstance(raw, dict):
        raise TraceError(line, field, "expected an object with topology_key, max_skew")
    key = _string(raw.get("topology_key"), line, f"{field}.topology_key")
    skew = raw.get("max_skew")
    if isinstance(skew, bool) or not isinstance(skew, int) or skew < 1:
        raise TraceError(line, f"{field}.max_skew", f"expected an integer >= 1, got {skew!r}")
    when_name = raw.get("when_unsatisfiable", "DoNotSchedule")
    if when_name not in _WHEN:
        raise TraceError(
            line,
            f"{field}.when_unsatisfiable",
            f"unknown {when_name!r}; DoNotSchedule or ScheduleAnyway",
        )
    return TopologySpread(key, skew, _WHEN[when_name])


def _list(raw: Any, line: int, field: str) -> list[Any]:
    if not isinstance(raw, list):
        raise TraceError(line, field, "expected a list")
    return raw


def _arrive(obj: Mapping[str, Any], line: int, t: float, cluster: str) -> Arrive:
    unknown = sorted(set(obj) - _ARRIVE_FIELDS)
    if unknown:
        raise TraceError(line, unknown[0], "unknown field")
    name = _string(obj.get("pod"), line, "pod")
    limit = _resources(obj, line)
    if not any(v > 0 for v in limit.values()):
        raise TraceError(line, "cpu", "an arriving pod must request cpu, memory or gpu")
    class_name = obj.get("app_class", AppClass.BATCH.value)
    if class_name not in _CLASSES:
        raise TraceError(
            line, "app_class", f"unknown {class_name!r}; choose from {', '.join(_CLASSES)}"
        )
    reservation: dict[str, float] | None = None
    if "reservation" in obj:
        raw_res = obj["reservation"]
        if not isinstance(raw_res, dict):
            raise TraceError(line, "reservation", "expected an object of cpu, memory, gpu")
        bad = sorted(set(raw_res) - set(_RESOURCES))
        if bad:
            raise TraceError(line, f"reservation.{bad[0]}", "unknown resource")
        reservation = {**limit, **_resources(raw_res, line, "reservation.")}
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(line, "priority", f"expected an integer, got {priority!r}")
    colocation = obj.get("colocation", "")
    colocation_key = obj.get("colocation_key", "")
    if colocation and not colocation_key:
        raise TraceError(line, "colocation_key", "a co-location group needs a topology key")
    try:
        pod = PodSpec.build(
            name,
            limit,
            reservation=reservation,
            app_class=_CLASSES[class_name],
            priority=priority,
            requirements=tuple(
                _requirement(r, line, f"requirements[{i}]")
                for i, r in enumerate(_list(obj.get("requirements", []), line, "requirements"))
            ),
            spread=tuple(
                _spread(s, line, f"spread[{i}]")
                for i, s in enumerate(_list(obj.get("spread", []), line, "spread"))
            ),
            interruption_penalty=_number(
                obj.get("interruption_penalty", 0), line, "interruption_penalty"
            ),
            reclamation_penalty=_number(
                obj.get("reclamation_penalty", 0), line, "reclamation_penalty"
            ),
            colocation=str(colocation),
            colocation_key=str(colocation_key),
        )
    except ValueError as err:
        if isinstance(err, TraceError):
            raise
        field, _, reason = str(err).partition(": ")
        raise TraceError(line, field, reason or str(err)) from None
    return Arrive(t, cluster, pod)


def parse_trace(lines: Iterable[str]) -> Trace:
    """Parse trace lines (see the module docstring); raises :class:`TraceError`."""
    events: list[Event] = []
    duration: float | None = None
    description = ""
    last_t = 0.0
    for number, text in enumerate(lines, start=1):
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise TraceError(number, "(line)", f"not JSON: {err.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(number, "(line)", "expected a JSON object")
        if "format" in obj:
            if events:
                raise TraceError(number, "format", "the header must be the first line")
            if obj["format"] != FORMAT:
                raise TraceError(number, "format", f"expected {FORMAT!r}, got {obj['format']!r}")
            if "duration" in obj:
                duration = _number(obj["duration"], number, "duration")
            description = str(obj.get("description", ""))
            continue
        t = _number(obj.get("t"), number, "t")
        if t < last_t:
            raise TraceError(number, "t", f"{t:g} is earlier than the previous event ({last_t:g})")
        last_t = t
        cluster = _string(obj.get("cluster"), number, "cluster")
        kind = obj.get("event")
        if kind == "arrive":
            events.append(_arrive(obj, number, t, cluster))
        elif kind == "leave":
            unknown = sorted(set(obj) - {"t", "event", "cluster", "pod"})
            if unknown:
                raise TraceError(number, unknown[0], "unknown field for a leave event")
            events.append(Leave(t, cluster, _string(obj.get("pod"), number, "pod")))
        else:
            raise TraceError(number, "event", f"expected 'arrive' or 'leave', got {kind!r}")
    if duration is None:
        duration = last_t + 3600.0
    return Trace(events=tuple(events), duration=duration, description=description)


def load_trace(path: Path) -> Trace:
    """Read and parse a trace file."""
    with Path(path).open(encoding="utf-8") as handle:
        return parse_trace(handle)


def _resource_json(values: tuple[float, float, float]) -> dict[str, float]:
    return {short: v for short, v in zip(_RESOURCES, values, strict=True) if v}


def event_to_json(event: Event) -> dict[str, Any]:
    """One event as its trace line's object (inverse of parsing)."""
    if isinstance(event, Leave):
        return {"t": event.t, "event": "leave", "cluster": event.cluster, "pod": event.pod}
    pod = event.pod
    out: dict[str, Any] = {
        "t": event.t,
        "event": "arrive",
        "cluster": event.cluster,
        "pod": pod.name,
        **_resource_json(pod.limit),
    }
    if pod.app_class is not AppClass.BATCH:
        out["app_class"] = pod.app_class.value
    if pod.reservation != pod.limit and pod.app_class is not AppClass.BEST_EFFORT:
        out["reservation"] = {
            short: v for short, v in zip(_RESOURCES, pod.reservation, strict=True)
        }
    if pod.priority:
        out["priority"] = pod.priority
    if pod.interruption_penalty:
        out["interruption_penalty"] = pod.interruption_penalty
    if pod.reclamation_penalty:
        out["reclamation_penalty"] = pod.reclamation_penalty
    if pod.requirements:
        out["requirements"] = [
            {"key": r.key, "operator": _OPERATOR_NAMES[r.operator], "values": list(r.values)}
            for r in pod.requirements
        ]
    if pod.spread:
        out["spread"] = [
            {
                "topology_key": s.topology_key,
                "max_skew": s.max_skew,
                "when_unsatisfiable": _WHEN_NAMES[s.when_unsatisfiable],
            }
            for s in pod.spread
        ]
    if pod.colocation:
        out["colocation"] = pod.colocation
        out["colocation_key"] = pod.colocation_key
    return out


def dump_trace(trace: Trace, path: Path) -> None:
    """Write ``trace`` as JSON lines with a header."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for line in iter_lines(trace):
            handle.write(line + "\n")


def iter_lines(trace: Trace) -> Iterator[str]:
    """The trace's lines: header first, then one event per line."""
    header = {"format": FORMAT, "duration": trace.duration}
    if trace.description:
        header["description"] = trace.description
    yield json.dumps(header)
    for event in trace.events:
        yield json.dumps(event_to_json(event), separators=(",", ":"))
