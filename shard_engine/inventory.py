"""The inventory: every machine the shard owns, as numpy columns.

One row per machine, a handful of small columns (state, flags, profile,
bound cluster, in-flight target, state-since, missed roll-ups). Everything a
machine shares with machines of the same shape lives once in the
:class:`~shard_engine.catalog.ProfileCatalog`. Three derived structures are
kept exact on every change so a cycle never scans the rows:

* ``pools`` — free idle, free speculative, and settled configured machines
  per (cluster, profile), for taking machines in O(taken);
* ``supply`` — per (cluster, profile), how many machines count toward that
  cluster's "have": configured or configuring for it, creating for it, or
  in flight / promised toward it;
* ``free_idle`` / ``free_speculative`` — per profile, how many can be taken.

Each mutation detaches the row from all three, changes the columns, and
attaches it again; the two functions below are the single definition of
which machine counts where.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.clusters import NO_CLUSTER, ClusterIndex
from shard_engine.identifiers import IdTable
from shard_engine.model import MachineRecord, MachineState
from shard_engine.pools import TIER_BOUND, TIER_IDLE, TIER_SPECULATIVE, PoolKey, Pools

__all__ = [
    "FLAG_CREATING_FOR",
    "FLAG_IN_FLIGHT",
    "FLAG_PROMISED",
    "InvalidMachine",
    "Inventory",
    "validate_record",
]

IntArray = npt.NDArray[np.int32]

FLAG_IN_FLIGHT = 1
"""An action naming this machine was issued and has not settled."""
FLAG_PROMISED = 2
"""A preemption freed this machine for the cluster in ``target``."""
FLAG_CREATING_FOR = 4
"""A creating machine the provider reports as meant for the cluster in ``target``."""

_CONFIGURED = int(MachineState.CONFIGURED)
_CONFIGURING = int(MachineState.CONFIGURING)
_CREATING = int(MachineState.CREATING)
_IDLE = int(MachineState.IDLE)
_SPECULATIVE = int(MachineState.SPECULATIVE)
_INT32_MAX = 2**31 - 1


class InvalidMachine(ValueError):
    """A machine observation the engine refuses; ``field`` names what is wrong."""

    def __init__(self, machine_id: str, field: str, reason: str) -> None:
        self.machine_id = machine_id
        self.field = field
        self.reason = reason
        super().__init__(f"machine {machine_id!r}: {field}: {reason}")


def validate_record(record: MachineRecord) -> MachineRecord:
    """Check one provider observation before it can touch any total.

    A NaN or negative price, a NaN probability or a NaN/negative allocatable
    would poison every sum and comparison it enters, so they are refused with
    the field named. A probability above 1 is clamped to 1: it is a
    probability per hour, and rounding noise from a provider should not cost
    us the machine. Returns the (possibly clamped) record.
    """
    mid = record.id
    if not isinstance(mid, str) or not mid:
        raise InvalidMachine(str(mid), "id", "empty machine id")
    try:
        state = MachineState(record.state)
    except ValueError:
        raise InvalidMachine(mid, "state", f"unknown state {record.state!r}") from None
    if state is MachineState.UNSPECIFIED:
        raise InvalidMachine(mid, "state", "unspecified")
    price = record.price_per_hour
    if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price):
        raise InvalidMachine(mid, "price_per_hour", f"not a finite number: {price!r}")
    if price < 0:
        raise InvalidMachine(mid, "price_per_hour", f"negative: {price!r}")
    prob = record.interruption_probability
    if isinstance(prob, bool) or not isinstance(prob, int | float) or not math.isfinite(prob):
        raise InvalidMachine(mid, "interruption_probability", f"not a finite number: {prob!r}")
    if prob < 0:
        raise InvalidMachine(mid, "interruption_probability", f"negative: {prob!r}")
    for name, value in record.allocatable.items():
        if not isinstance(name, str) or not name:
            raise InvalidMachine(mid, "allocatable", "empty resource name")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InvalidMachine(
                mid, f"allocatable[{name}]", f"not a non-negative number: {value!r}"
            )
    for key, label in record.labels.items():
        if not isinstance(key, str) or not key or not isinstance(label, str):
            raise InvalidMachine(mid, "labels", f"label {key!r}={label!r} is not a string pair")
    if prob > 1:
        record = replace(record, interruption_probability=1.0)
    return record


class Inventory:
    """Columnar machine table with exact pools and supply counts."""

    def __init__(self, catalog: ProfileCatalog, clusters: ClusterIndex) -> None:
        self.catalog = catalog
        self.clusters = clusters
        self.ids = IdTable()
        self.pools = Pools()
        self._rows = 0
        self.state: npt.NDArray[np.int8] = np.zeros(0, dtype=np.int8)
        self.flags: npt.NDArray[np.uint8] = np.zeros(0, dtype=np.uint8)
        self.missed: npt.NDArray[np.uint8] = np.zeros(0, dtype=np.uint8)
        self.profile: IntArray = np.zeros(0, dtype=np.int32)
        self.cluster: IntArray = np.zeros(0, dtype=np.int32)
        self.target: IntArray = np.zeros(0, dtype=np.int32)
        self.since: IntArray = np.zeros(0, dtype=np.int32)
        self._host_ref: dict[int, str] = {}
        self._last_error: dict[int, str] = {}
        self._supply: IntArray = np.zeros((0, 0), dtype=np.int32)
        self._free: npt.NDArray[np.int64] = np.zeros((2, 0), dtype=np.int64)
        self.state_counts: npt.NDArray[np.int64] = np.zeros(len(MachineState), dtype=np.int64)
        self._members: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._epoch: float | None = None

    # -- time -----------------------------------------------------------------
    def seconds(self, now: float) -> int:
        """``now`` as whole seconds since the first instant this inventory saw."""
        if self._epoch is None:
            self._epoch = math.floor(now)
        return max(-_INT32_MAX, min(_INT32_MAX, int(now - self._epoch)))

    def elapsed(self, row: int, now: float) -> float:
        """Seconds the machine on ``row`` has been in its current state."""
        return float(self.seconds(now) - int(self.since[row]))

    # -- sizing -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _ensure_rows(self, rows: int) -> None:
        if rows <= len(self.state):
            return
        capacity = max(rows, 2 * len(self.state), 1024)
        self.state = np.resize(self.state, capacity)
        self.flags = np.resize(self.flags, capacity)
        self.missed = np.resize(self.missed, capacity)
        self.profile = np.resize(self.profile, capacity)
        self.cluster = np.resize(self.cluster, capacity)
        self.target = np.resize(self.target, capacity)
        self.since = np.resize(self.since, capacity)
        self.pools.ensure_rows(capacity)

    def _ensure_tables(self) -> None:
        profiles = len(self.catalog)
        clusters = len(self.clusters)
        rows, cols = self._supply.shape
        if profiles > cols or clusters > rows:
            new_cols = max(profiles, 2 * cols, 64) if profiles > cols else cols
            new_rows = max(clusters, 2 * rows, 16) if clusters > rows else rows
            supply = np.zeros((new_rows, new_cols), dtype=np.int32)
            supply[:rows, :cols] = self._supply
            self._supply = supply
            free = np.zeros((2, new_cols), dtype=np.int64)
            free[:, :cols] = self._free
            self._free = free
            members = np.zeros(new_cols, dtype=np.int64)
            members[:cols] = self._members
            self._members = members

    # -- derived views ------------------------------------------------------------
    def supply_row(self, cluster: int) -> IntArray:
        """Machines counting toward ``cluster`` per profile (a view over current profiles)."""
        self._ensure_tables()
        return self._supply[cluster, : len(self.catalog)]

    @property
    def free_idle(self) -> npt.NDArray[np.int64]:
        """Free idle machines per profile."""
        self._ensure_tables()
        return self._free[TIER_IDLE, : len(self.catalog)]

    @property
    def free_speculative(self) -> npt.NDArray[np.int64]:
        """Free speculative slots per profile."""
        self._ensure_tables()
        return self._free[TIER_SPECULATIVE, : len(self.catalog)]

    @property
    def members(self) -> npt.NDArray[np.int64]:
        """Machines per profile, any state: which shapes the shard has at all."""
        self._ensure_tables()
        return self._members[: len(self.catalog)]

    def owner(self, row: int) -> int:
        """The cluster whose "have" this machine counts toward, or ``NO_CLUSTER``.

        In flight or promised: the action's target (``NO_CLUSTER`` for a drain
        to idle or a release). Otherwise configured or configuring machines
        count for their cluster, and a creating machine for the cluster the
        provider says it is meant for. Nothing else is supply.
        """
        flags = int(self.flags[row])
        if flags & (FLAG_IN_FLIGHT | FLAG_PROMISED):
            return int(self.target[row])
        state = int(self.state[row])
        if state in (_CONFIGURED, _CONFIGURING):
            return int(self.cluster[row])
        if state == _CREATING and flags & FLAG_CREATING_FOR:
            return int(self.target[row])
        return NO_CLUSTER

    def pool_key(self, row: int) -> PoolKey | None:
        """The pool a machine belongs in, or None when no phase may take it.

        Machines in flight or promised are in no pool: nothing may pick them
        again until they settle. Transitional and failed machines are in no
        pool either.
        """
        if int(self.flags[row]) & (FLAG_IN_FLIGHT | FLAG_PROMISED):
            return None
        state = int(self.state[row])
        profile = int(self.profile[row])
        if state == _IDLE:
            return PoolKey(TIER_IDLE, NO_CLUSTER, profile)
        if state == _SPECULATIVE:
            return PoolKey(TIER_SPECULATIVE, NO_CLUSTER, profile)
        if state == _CONFIGURED and int(self.cluster[row]) >= 0:
            return PoolKey(TIER_BOUND, int(self.cluster[row]), profile)
        return None

    def _detach(self, row: int) -> None:
        pool = int(self.pools.pool_of[row])
        if pool >= 0:
            key = self.pools.key(pool)
            if key.tier != TIER_BOUND:
                self._free[key.tier, key.profile] -= 1
            self.pools.remove(row)
        owner = self.owner(row)
        if owner >= 0:
            self._supply[owner, int(self.profile[row])] -= 1
        self.state_counts[int(self.state[row])] -= 1
        self._members[int(self.profile[row])] -= 1

    def _attach(self, row: int) -> None:
        self._ensure_tables()
        key = self.pool_key(row)
        if key is not None:
            self.pools.add(row, self.pools.pool(key))
            if key.tier != TIER_BOUND:
                self._free[key.tier, key.profile] += 1
        owner = self.owner(row)
        if owner >= 0:
            self._supply[owner, int(self.profile[row])] += 1
        self.state_counts[int(self.state[row])] += 1
        self._members[int(self.profile[row])] += 1

    # -- mutation -------------------------------------------------------------------
    def upsert(self, record: MachineRecord, *, now: float) -> int:
        """Record a (validated) observation; returns the machine's row.

        Flags survive: a machine in flight stays in flight until settled, and
        a promised machine stays promised. A machine without a host is never
        bound: the cluster a creating machine reports is kept only as the
        cluster it is meant for.
        """
        record = validate_record(record)
        profile = self.catalog.intern(self.catalog.key_of(record))
        row = self.ids.get(record.id)
        fresh = row is None
        if row is None:
            row = self.ids.add(record.id)
            self._ensure_rows(row + 1)
            self.flags[row] = 0
            self.missed[row] = 0
            self.target[row] = NO_CLUSTER
            self.pools.pool_of[row] = -1
        else:
            self._detach(row)
        state = MachineState(record.state)
        if fresh or int(self.state[row]) != int(state):
            self.since[row] = self.seconds(now)
        self.state[row] = int(state)
        self.profile[row] = profile
        flags = int(self.flags[row]) & ~FLAG_CREATING_FOR
        if state.has_host:
            self.cluster[row] = self.clusters.index_of(record.cluster)
            if record.host_ref:
                self._host_ref[row] = record.host_ref
            else:
                self._host_ref.pop(row, None)
        else:
            self.cluster[row] = NO_CLUSTER
            self._host_ref.pop(row, None)
            if (
                state is MachineState.CREATING
                and record.cluster
                and not flags & (FLAG_IN_FLIGHT | FLAG_PROMISED)
            ):
                flags |= FLAG_CREATING_FOR
                self.target[row] = self.clusters.index_of(record.cluster)
        if state is not MachineState.CONFIGURED:
            self.missed[row] = 0
        self.flags[row] = flags
        if record.last_error:
            self._last_error[row] = record.last_error
        else:
            self._last_error.pop(row, None)
        self._attach(row)
        return row

    def remove(self, row: int) -> None:
        """Forget the machine on ``row`` entirely."""
        self._detach(row)
        self.flags[row] = 0
        self.target[row] = NO_CLUSTER
        self._host_ref.pop(row, None)
        self._last_error.pop(row, None)
        self.ids.discard(row)

    def set_flags(self, row: int, *, flags: int, target: int) -> None:
        """Change a machine's in-flight/promised flags and target, keeping all counts exact."""
        self._detach(row)
        keep = int(self.flags[row]) & ~(FLAG_IN_FLIGHT | FLAG_PROMISED | FLAG_CREATING_FOR)
        self.flags[row] = keep | flags
        self.target[row] = target
        self._attach(row)

    # -- reading ----------------------------------------------------------------------
    def row(self, machine_id: str) -> int | None:
        """Row of ``machine_id`` or None."""
        return self.ids.get(machine_id)

    def record(self, row: int) -> MachineRecord:
        """Rebuild the machine's record from the columns and its profile."""
        profile = self.catalog.profile(int(self.profile[row]))
        return MachineRecord(
            id=self.ids.id_of(row),
            state=MachineState(int(self.state[row])),
            provider=profile.provider,
            instance_type=profile.instance_type,
            zone=profile.zone,
            capacity_type=profile.capacity_type,
            price_per_hour=profile.price_per_hour,
            interruption_probability=profile.interruption_probability,
            allocatable=dict(profile.allocatable),
            labels=dict(profile.labels),
            cluster=self.clusters.name(int(self.cluster[row])),
            host_ref=self._host_ref.get(row, ""),
            last_error=self._last_error.get(row, ""),
        )

    def records(self) -> Iterator[MachineRecord]:
        """Every machine's record, in row order."""
        for row in self.ids.live_rows():
            yield self.record(row)
