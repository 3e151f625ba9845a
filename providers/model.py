"""Value types shared by every provider: states, capacity types, the fencing
token and immutable machine snapshots.

The numeric values of `State` and `CapacityType` equal the wire enums of
`bigfleet.v1alpha1`, so conversion is a cast; `providers.wire` does it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class State(enum.IntEnum):
    """The eight machine states (wire: MachineState)."""

    SPECULATIVE = 1
    CREATING = 2
    IDLE = 3
    CONFIGURING = 4
    CONFIGURED = 5
    DRAINING = 6
    DELETING = 7
    FAILED = 8


STABLE_STATES = frozenset({State.SPECULATIVE, State.IDLE, State.CONFIGURED})
TRANSITIONAL_STATES = frozenset({State.CREATING, State.CONFIGURING, State.DRAINING, State.DELETING})
#: States in which the machine has no real host.
HOSTLESS_STATES = frozenset({State.SPECULATIVE, State.CREATING})
#: States in which the machine is bound to a cluster.
BOUND_STATES = frozenset({State.CONFIGURING, State.CONFIGURED, State.DRAINING})


class CapacityType(enum.IntEnum):
    """What holding the machine costs (wire: CapacityType)."""

    BARE_METAL = 1
    RESERVED = 2
    ON_DEMAND = 3
    SPOT = 4

    @property
    def label(self) -> str:
        """The value of the ``bigfleet.io/capacity-type`` label."""
        return _CAPACITY_LABELS[self]

    @classmethod
    def from_label(cls, label: str) -> CapacityType:
        """Parse ``spot`` / ``on-demand`` / ``reserved`` / ``bare-metal``."""
        for member, text in _CAPACITY_LABELS.items():
            if text == label:
                return member
        raise ValueError(f"unknown capacity type {label!r}")


_CAPACITY_LABELS = {
    CapacityType.BARE_METAL: "bare-metal",
    CapacityType.RESERVED: "reserved",
    CapacityType.ON_DEMAND: "on-demand",
    CapacityType.SPOT: "spot",
}


class Operation(enum.Enum):
    """The four lifecycle operations, each one legal edge pair of the machine."""

    CREATE = "create"
    CONFIGURE = "configure"
    DRAIN = "drain"
    DELETE = "delete"

    @property
    def source(self) -> State:
        """The stable state the operation starts from."""
        return _EDGES[self][0]

    @property
    def transitional(self) -> State:
        """The state the machine holds while the operation runs."""
        return _EDGES[self][1]

    @property
    def target(self) -> State:
        """The stable state the operation ends in when it succeeds."""
        return _EDGES[self][2]


_EDGES: dict[Operation, tuple[State, State, State]] = {
    Operation.CREATE: (State.SPECULATIVE, State.CREATING, State.IDLE),
    Operation.CONFIGURE: (State.IDLE, State.CONFIGURING, State.CONFIGURED),
    Operation.DRAIN: (State.CONFIGURED, State.DRAINING, State.IDLE),
    Operation.DELETE: (State.IDLE, State.DELETING, State.SPECULATIVE),
}


@dataclass(frozen=True, slots=True)
class FencingToken:
    """The caller's fencing token: ``(shard_id, epoch, sequence)``.

    Tokens for one (shard_id, machine_id) are ordered lexicographically on
    ``(epoch, sequence)``. A token with an empty ``shard_id`` is "no token" and
    bypasses fencing (the wire's zero value).
    """

    shard_id: str
    epoch: int
    sequence: int

    @property
    def is_empty(self) -> bool:
        """True for the zero token, which fencing ignores."""
        return self.shard_id == ""

    def key(self) -> tuple[int, int]:
        """The lexicographic sort key."""
        return (self.epoch, self.sequence)


NO_TOKEN = FencingToken("", 0, 0)


@dataclass(frozen=True, slots=True)
class HostRef:
    """The provider's own name for a real host."""

    provider: str
    ref: str


def frozen_map(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only copy of ``mapping``."""
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class Machine:
    """An immutable snapshot of one machine as a caller may see it.

    Field-shape guarantees: ``host`` is None iff ``state`` is SPECULATIVE or
    CREATING; ``cluster`` is non-empty iff ``state`` is CONFIGURING,
    CONFIGURED or DRAINING, and ``shard_metadata`` is empty whenever
    ``cluster`` is; ``last_error`` is non-empty iff ``state`` is FAILED.
    """

    id: str
    state: State
    host: HostRef | None
    instance_type: str
    zone: str
    capacity_type: CapacityType
    price_per_hour: float
    interruption_probability: float
    resources: Mapping[str, str] = field(default_factory=frozen_map)
    allocatable: Mapping[str, str] = field(default_factory=frozen_map)
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    last_error: str = ""
    cluster: str = ""
    shard_metadata: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True, slots=True)
class Ack:
    """A transition acknowledgement: the operation id (stable across retries
    toward the same target state) and the machine as it stood at acceptance."""

    operation_id: str
    machine: Machine


@dataclass(frozen=True, slots=True)
class MachineList:
    """A List answer: the machines and an opaque cursor for the next delta."""

    machines: tuple[Machine, ...]
    revision: bytes


__all__ = [
    "BOUND_STATES",
    "HOSTLESS_STATES",
    "NO_TOKEN",
    "STABLE_STATES",
    "TRANSITIONAL_STATES",
    "Ack",
    "CapacityType",
    "FencingToken",
    "HostRef",
    "Machine",
    "MachineList",
    "Operation",
    "State",
    "frozen_map",
]
