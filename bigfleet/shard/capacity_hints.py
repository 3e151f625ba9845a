"""AvailableCapacityUpdate: tell each connected cluster what the shard could supply soon.

Per machine shape (provider, instance type, zone, capacity type, labels,
allocatable) the hint counts the free machines — idle and unbound, or
speculative — that no action holds (not in flight, not promised). It is
advisory: a higher priority may take them first. A cluster-side operator
uses it to bound what it asks for (the Nanook adapter reports it as the
pool's ``max``).

Frames carry ``supersedes_key = "available:<shape hash>"`` so an outbox
coalesces them, and only changed counts are sent to a session; a new session
(every Hello) gets the full set.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bigfleet.shard.convert import resources_to_wire
from bigfleet.shard.sessions import OperatorSession, SessionHub
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord, MachineState

__all__ = ["CapacityHints", "Hint", "free_by_shape"]

_IN = capacity_pb2.NodeSelectorRequirement.OPERATOR_IN


@dataclass(frozen=True)
class Hint:
    """Free machines of one shape."""

    key: str
    labels: tuple[tuple[str, str], ...]
    allocatable: tuple[tuple[str, float], ...]
    price: float
    idle: int = 0
    speculative: int = 0

    @property
    def count(self) -> int:
        return self.idle + self.speculative

    def frame(self) -> shard_pb2.ShardMessage:
        confidence = (
            shard_pb2.AvailableCapacityUpdate.CONFIDENCE_HIGH
            if self.speculative == 0
            else shard_pb2.AvailableCapacityUpdate.CONFIDENCE_MEDIUM
        )
        if self.count == 0:
            confidence = shard_pb2.AvailableCapacityUpdate.CONFIDENCE_NONE
        return shard_pb2.ShardMessage(
            available_capacity=shard_pb2.AvailableCapacityUpdate(
                supersedes_key=self.key,
                requirements=[
                    capacity_pb2.NodeSelectorRequirement(key=k, operator=_IN, values=[v])
                    for k, v in self.labels
                ],
                resources=resources_to_wire(dict(self.allocatable)),
                available_count=self.count,
                confidence=confidence,
                cost_per_hour=self.price,
            )
        )


def _shape_key(record: MachineRecord) -> tuple[object, ...]:
    return (
        record.provider,
        record.instance_type,
        record.zone,
        int(record.capacity_type),
        tuple(sorted(record.labels.items())),
        tuple(sorted(record.allocatable.items())),
    )


def free_by_shape(machines: Iterable[MachineRecord], busy: Mapping[str, object]) -> dict[str, Hint]:
    """Free machines per shape, keyed by the frame's ``supersedes_key``."""
    counts: dict[tuple[object, ...], list[int]] = {}
    first: dict[tuple[object, ...], MachineRecord] = {}
    for record in machines:
        key = _shape_key(record)
        if key not in counts:
            counts[key] = [0, 0]
            first[key] = record
        if record.id in busy:
            continue
        if record.state == MachineState.IDLE and not record.cluster:
            counts[key][0] += 1
        elif record.state == MachineState.SPECULATIVE:
            counts[key][1] += 1
    out: dict[str, Hint] = {}
    for key, (idle, speculative) in counts.items():
        record = first[key]
        digest = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
        name = f"available:{digest}"
        out[name] = Hint(
            key=name,
            labels=tuple(sorted(record.labels.items())),
            allocatable=tuple(sorted(record.allocatable.items())),
            price=record.price_per_hour,
            idle=idle,
            speculative=speculative,
        )
    return out


class CapacityHints:
    """Sends changed hints to every open session (see module docstring)."""

    def __init__(self, hub: SessionHub, engine: ShardEngine) -> None:
        self.hub = hub
        self.engine = engine
        self._sent: weakref.WeakKeyDictionary[OperatorSession, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )

    def publish(self) -> int:
        """Queue changed hints on every session; returns the number of frames queued.

        Runs on the shard's loop; the outboxes belong to the sessions' loop
        (another thread), so frames go through the hub, which hands them over.
        """
        sessions = self.hub.sessions()
        if not sessions:
            return 0
        busy = {**self.engine.in_flight(), **self.engine.promised()}
        hints = free_by_shape(self.engine.machines(), busy)
        queued = 0
        for session in sessions:
            sent = self._sent.setdefault(session, {})
            for key, hint in hints.items():
                if sent.get(key) == hint.count:
                    continue
                if hint.count == 0 and key not in sent:
                    continue  # nothing to say about a shape that never had supply
                self.hub.push(session, hint.frame(), key)
                sent[key] = hint.count
                queued += 1
        return queued
