"""The incumbent's record: what the existing autoscaler actually ran, as node joins and leaves.

Format (documented in ``docs/shadow-mode.md``): JSON lines or CSV, one
event per line, with these fields —

``time``
    ISO 8601 with a zone (``2026-12-01T03:12:00Z``) or epoch seconds.
``cluster``
    the cluster's id as its operator names it in its Hello.
``node``
    the node's name (unique within the cluster while it exists).
``event``
    ``join`` or ``leave``.
``instance_type``, ``capacity_type``
    the node's shape (``capacity_type``: ``on-demand``, ``spot``,
    ``reserved``, ``bare-metal``); needed on ``join``, ignored on ``leave``.
``price_per_hour``
    optional; when missing the report prices the shape from what BigFleet
    saw for the same instance and capacity type.

A node that joined before the report's window counts from the window's
start; one still present at its end counts to the end. Lines are sorted by
time on reading, so an export's order does not matter.

:func:`from_kubectl_watch` converts the output of ``kubectl get nodes
--watch --output-watch-events -o json`` (Karpenter and Cluster Autoscaler
clusters alike): ADDED is a join at the node's creation time, DELETED a
leave at its deletion time.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

__all__ = [
    "CAPACITY_TYPES",
    "IncumbentError",
    "NodeEvent",
    "NodeEventKind",
    "from_kubectl_watch",
    "parse_incumbent",
    "to_json_lines",
]

CAPACITY_TYPES = ("on-demand", "spot", "reserved", "bare-metal")


class IncumbentError(ValueError):
    """A line of the incumbent's record that cannot be used: names the line, field and reason."""

    def __init__(self, line: int, field: str, reason: str) -> None:
        super().__init__(f"line {line}: {field}: {reason}")
        self.line, self.field, self.reason = line, field, reason


class NodeEventKind(StrEnum):
    JOIN = "join"
    LEAVE = "leave"


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One join or leave of one node in one cluster."""

    time: float
    cluster: str
    node: str
    event: NodeEventKind
    instance_type: str = ""
    capacity_type: str = ""
    price_per_hour: float | None = None


def _time(value: object, line: int) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        seconds = _parse_time(value.strip(), line)
    else:
        raise IncumbentError(line, "time", "missing")
    if not math.isfinite(seconds):
        raise IncumbentError(line, "time", f"{value!r} is not a finite time")
    return seconds


def _parse_time(text: str, line: int) -> float:
    """Epoch seconds from ``1733022720``, ``2026-12-01T03:12:00Z`` or ``...+01:00``."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise IncumbentError(line, "time", f"{text!r} is not ISO 8601 or epoch seconds") from None
    if moment.tzinfo is None:
        raise IncumbentError(line, "time", f"{text!r} has no time zone (add Z for UTC)")
    return moment.timestamp()


def _event(fields: Mapping[str, Any], line: int) -> NodeEvent:
    def text(name: str, *, required: bool) -> str:
        value = fields.get(name)
        if value is None or value == "":
            if required:
                raise IncumbentError(line, name, "missing")
            return ""
        if not isinstance(value, str):
            raise IncumbentError(line, name, f"must be a string, not {type(value).__name__}")
        return value.strip()

    raw_kind = text("event", required=True).lower()
    try:
        kind = NodeEventKind(raw_kind)
    except ValueError:
        raise IncumbentError(line, "event", f"{raw_kind!r} is not 'join' or 'leave'") from None
    joining = kind is NodeEventKind.JOIN
    capacity_type = text("capacity_type", required=joining).lower()
    if joining and capacity_type not in CAPACITY_TYPES:
        raise IncumbentError(
            line, "capacity_type", f"{capacity_type!r} is not one of {list(CAPACITY_TYPES)}"
        )
    price: float | None = None
    raw_price = fields.get("price_per_hour")
    if raw_price not in (None, ""):
        try:
            price = float(raw_price)
        except (TypeError, ValueError):
            raise IncumbentError(line, "price_per_hour", f"{raw_price!r} is not a number") from None
        if not math.isfinite(price) or price < 0:
            raise IncumbentError(line, "price_per_hour", f"{raw_price!r} is not a price >= 0")
    return NodeEvent(
        time=_time(fields.get("time"), line),
        cluster=text("cluster", required=True),
        node=text("node", required=True),
        event=kind,
        instance_type=text("instance_type", required=joining),
        capacity_type=capacity_type,
        price_per_hour=price,
    )


def parse_incumbent(content: str) -> list[NodeEvent]:
    """Events from JSON lines (a first non-blank character ``{``) or CSV with a header row.

    Raises :class:`IncumbentError` naming the line and field.
    """
    stripped = content.lstrip()
    events: list[NodeEvent] = []
    if stripped.startswith("{"):
        for number, raw in enumerate(content.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                fields = json.loads(raw)
            except json.JSONDecodeError as error:
                raise IncumbentError(number, "json", error.msg) from None
            if not isinstance(fields, dict):
                raise IncumbentError(number, "json", "each line must be an object")
            events.append(_event(fields, number))
    else:
        reader = csv.DictReader(io.StringIO(content))
        missing = {"time", "cluster", "node", "event"} - set(reader.fieldnames or ())
        if missing:
            raise IncumbentError(1, "header", f"missing column(s) {sorted(missing)}")
        for row in reader:
            events.append(_event(row, reader.line_num))
    events.sort(key=lambda e: e.time)
    return events


def to_json_lines(events: list[NodeEvent]) -> str:
    """Events in the documented JSON lines form (what the converter writes)."""
    lines = []
    for e in events:
        item: dict[str, Any] = {
            "time": datetime.fromtimestamp(e.time, UTC).isoformat().replace("+00:00", "Z"),
            "cluster": e.cluster,
            "node": e.node,
            "event": e.event.value,
        }
        if e.instance_type:
            item["instance_type"] = e.instance_type
        if e.capacity_type:
            item["capacity_type"] = e.capacity_type
        if e.price_per_hour is not None:
            item["price_per_hour"] = e.price_per_hour
        lines.append(json.dumps(item))
    return "".join(line + "\n" for line in lines)


_INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
_CAPACITY_LABELS = (
    "karpenter.sh/capacity-type",
    "eks.amazonaws.com/capacityType",
    "cloud.google.com/gke-provisioning",
    "kubernetes.azure.com/scalesetpriority",
)
_CAPACITY_VALUES = {
    "on-demand": "on-demand",
    "ondemand": "on-demand",
    "on_demand": "on-demand",
    "standard": "on-demand",
    "regular": "on-demand",
    "spot": "spot",
    "preemptible": "spot",
    "reserved": "reserved",
}


def _objects(content: str) -> Iterator[tuple[int, Any]]:
    """Concatenated JSON values (kubectl's watch output is pretty-printed, not one per line)."""
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(content) and content[position].isspace():
            position += 1
        if position >= len(content):
            return
        start_line = content.count("\n", 0, position) + 1
        try:
            value, end = decoder.raw_decode(content, position)
        except json.JSONDecodeError as error:
            raise IncumbentError(error.lineno, "json", error.msg) from None
        yield start_line, value
        position = end


def from_kubectl_watch(content: str, *, cluster: str) -> list[NodeEvent]:
    """Convert ``kubectl get nodes --watch --output-watch-events -o json`` output.

    ``ADDED`` (including the initial listing) becomes a join at the node's
    ``creationTimestamp``; ``DELETED`` a leave at its ``deletionTimestamp``
    (a DELETED event without one is refused: the time it left is the whole
    point). ``MODIFIED`` is ignored. The capacity type comes from the
    Karpenter, EKS, GKE or AKS label, ``on-demand`` when none is set.
    """
    if not cluster:
        raise IncumbentError(0, "cluster", "name the cluster the export is from")
    events: list[NodeEvent] = []
    for line, item in _objects(content):
        if not isinstance(item, dict) or "type" not in item or "object" not in item:
            raise IncumbentError(line, "type", "not a watch event (use --output-watch-events)")
        kind = item["type"]
        if kind not in ("ADDED", "DELETED"):
            continue
        node = item["object"]
        meta = node.get("metadata", {}) if isinstance(node, dict) else {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise IncumbentError(line, "object.metadata.name", "missing")
        labels = meta.get("labels") or {}
        stamp_field = "creationTimestamp" if kind == "ADDED" else "deletionTimestamp"
        stamp = meta.get(stamp_field)
        if not stamp:
            raise IncumbentError(line, f"object.metadata.{stamp_field}", "missing")
        instance_type = next((labels[k] for k in _INSTANCE_TYPE_LABELS if k in labels), "")
        raw_capacity = next((str(labels[k]).lower() for k in _CAPACITY_LABELS if k in labels), "")
        capacity_type = _CAPACITY_VALUES.get(raw_capacity, "on-demand")
        if kind == "ADDED" and not instance_type:
            raise IncumbentError(line, "object.metadata.labels", "no instance-type label")
        events.append(
            NodeEvent(
                time=_time(stamp, line),
                cluster=cluster,
                node=name,
                event=NodeEventKind.JOIN if kind == "ADDED" else NodeEventKind.LEAVE,
                instance_type=instance_type if kind == "ADDED" else "",
                capacity_type=capacity_type if kind == "ADDED" else "",
            )
        )
    # The initial listing repeats as ADDED after reconnects: keep the first join per node life.
    events.sort(key=lambda e: e.time)
    seen: set[str] = set()
    unique: list[NodeEvent] = []
    for e in events:
        if e.event is NodeEventKind.JOIN:
            if e.node in seen:
                continue
            seen.add(e.node)
        else:
            seen.discard(e.node)
        unique.append(e)
    return unique
