"""The inventory: every machine the shard owns, as numpy columns.

One row per machine, a handful of small columns (state, flags with the
missed-report count in their high bits, profile, bound cluster,
state-since) plus compact ID and host-reference columns; the in-flight
target lives in a small dict because few machines are in motion at once. Everything a
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
from typing import Any

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.clusters import NO_CLUSTER, ClusterIndex
from shard_engine.identifiers import CompactStrings, IdTable
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
SmallArray = npt.NDArray[np.integer[Any]]


def _widened(column: SmallArray, value: int) -> SmallArray:
    """The column, widened to ``int32`` if ``value`` does not fit its current type.

    Profile and cluster ids start as ``int16``: a shard rarely sees more
    than a few thousand shapes or a few hundred clusters, and two bytes a
    machine per column is a fifth of the inventory.
    """
    if value > np.iinfo(column.dtype).max:
        return column.astype(np.int32)
    return column


FLAG_IN_FLIGHT = 1
"""An action naming this machine was issued and has not settled."""
FLAG_PROMISED = 2
"""A preemption freed this machine for the cluster in ``target``."""
FLAG_CREATING_FOR = 4
"""A creating machine the provider reports as meant for the cluster in ``target``."""
_FLAG_BITS = 0x0F
"""Low bits hold flags; the high four bits count missed node reports."""

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
        self.state: npt.NDArray[np.int8] = np.zeros(0, dtype=np.int8)
        self.flags: npt.NDArray[np.uint8] = np.zeros(0, dtype=np.uint8)
        self.profile: SmallArray = np.zeros(0, dtype=np.int16)
        self.cluster: SmallArray = np.zeros(0, dtype=np.int16)
        self.since: IntArray = np.zeros(0, dtype=np.int32)
        self._host_ref = CompactStrings()
        self._targets: dict[int, int] = {}
        self._last_error: dict[int, str] = {}
        self._supply: IntArray = np.zeros((0, 0), dtype=np.int32)
        self._free: npt.NDArray[np.int64] = np.zeros((2, 0), dtype=np.int64)
        self._members: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._arrivals: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._versions: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.state_counts: npt.NDArray[np.int64] = np.zeros(len(MachineState), dtype=np.int64)
        self._epoch: float | None = None

    # -- time -----------------------------------------------------------------
    def seconds(self, now: float) -> int:
        """``now`` as whole seconds since the first instant this inventory saw."""
        if self._epoch is None:
            self._epoch = math.floor(now)
        return max(-_INT32_MAX, min(_INT32_MAX, int(now - self._epoch)))

    # -- sizing -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _ensure_rows(self, rows: int) -> None:
        if rows <= len(self.state):
            return
        capacity = max(rows, 2 * len(self.state), 1024) if len(self.state) else max(rows, 1024)
        self.state = np.resize(self.state, capacity)
        self.flags = np.resize(self.flags, capacity)
        self.profile = np.resize(self.profile, capacity)
        self.cluster = np.resize(self.cluster, capacity)
        self.since = np.resize(self.since, capacity)
        self.pools.ensure_rows(capacity)
        self._host_ref.ensure_rows(capacity)

    def reserve(self, machines: int) -> None:
        """Size every per-machine column (and the ID table) for ``machines`` up front."""
        if machines > len(self.state):
            self._ensure_rows(machines)
        self.ids.reserve(machines)

    def ensure_tables(self) -> None:
        """Size the per-(cluster, profile) tables for every known cluster and profile."""
        profiles = len(self.catalog)
        clusters = len(self.clusters)
        rows, cols = self._supply.shape
        if profiles > cols or clusters > rows:
            new_cols = max(profiles, 2 * cols, 64) if profiles > cols else cols
            new_rows = max(clusters, 2 * rows, 16) if clusters > rows else rows
            if new_rows > rows:
                versions = np.zeros(new_rows, dtype=np.int64)
                versions[:rows] = self._versions
                self._versions = versions
            supply = np.zeros((new_rows, new_cols), dtype=np.int32)
            supply[:rows, :cols] = self._supply
            self._supply = supply
            free = np.zeros((2, new_cols), dtype=np.int64)
            free[:, :cols] = self._free
            self._free = free
            members = np.zeros(new_cols, dtype=np.int64)
            members[:cols] = self._members
            self._members = members
            arrivals = np.zeros(new_cols, dtype=np.int64)
            arrivals[:cols] = self._arrivals
            self._arrivals = arrivals

    # -- derived views ------------------------------------------------------------
    def supply_row(self, cluster: int) -> IntArray:
        """Machines counting toward ``cluster`` per profile (a view over current profiles).

        Like every reader below it assumes :meth:`ensure_tables` ran since the
        last new cluster or profile (upserts and the cycle see to that).
        """
        return self._supply[cluster, : len(self.catalog)]

    @property
    def free_idle(self) -> npt.NDArray[np.int64]:
        """Free idle machines per profile."""
        return self._free[TIER_IDLE, : len(self.catalog)]

    @property
    def free_speculative(self) -> npt.NDArray[np.int64]:
        """Free speculative slots per profile."""
        return self._free[TIER_SPECULATIVE, : len(self.catalog)]

    def version(self, cluster: int) -> int:
        """Changes whenever a machine starts or stops counting for ``cluster`` or being bound to it.

        Anything computed from a cluster's supply and settled machines may be
        reused while this (and the cluster's needs) stay the same.
        """
        return int(self._versions[cluster])

    @property
    def members(self) -> npt.NDArray[np.int64]:
        """Machines per profile, any state: which shapes the shard has at all."""
        return self._members[: len(self.catalog)]

    @property
    def free_arrivals(self) -> npt.NDArray[np.int64]:
        """Per profile, how many times a machine has entered a free pool (only ever grows).

        If this sum over a need's profiles is unchanged, no machine the need
        could use has become free since: a need that got nothing then gets
        nothing now.
        """
        return self._arrivals[: len(self.catalog)]

    def target(self, row: int) -> int:
        """The cluster an in-flight, promised or creating machine is headed for."""
        return self._targets.get(row, NO_CLUSTER)

    def missed(self, row: int) -> int:
        """Consecutive node reports of its cluster this configured machine was missing from."""
        return int(self.flags[row]) >> 4

    def set_missed(self, row: int, count: int) -> None:
        """Record the missed-report count (saturates at 15)."""
        self.flags[row] = (int(self.flags[row]) & _FLAG_BITS) | (min(count, 15) << 4)

    def owner(self, row: int) -> int:
        """The cluster whose "have" this machine counts toward, or ``NO_CLUSTER``.

        In flight or promised: the action's target (``NO_CLUSTER`` for a drain
        to idle or a release). Otherwise configured or configuring machines
        count for their cluster, and a creating machine for the cluster the
        provider says it is meant for. Nothing else is supply.
        """
        return self._place(row)[1]

    def pool_key(self, row: int) -> PoolKey | None:
        """The pool a machine belongs in, or None when no phase may take it.

        Machines in flight or promised are in no pool: nothing may pick them
        again until they settle. Transitional and failed machines are in no
        pool either.
        """
        return self._place(row)[0]

    def bound_pools_of(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Those of ``rows`` that sit in a bound pool, and that pool's id (one each)."""
        rows = rows[rows < len(self.state)]
        # The bound branch of ``_place``: settled, configured, in a cluster. Rows
        # a commit binds are in flight: they leave at the first, cheapest test.
        rows = rows[(self.flags[rows] & np.uint8(FLAG_IN_FLIGHT | FLAG_PROMISED)) == 0]
        if len(rows):
            rows = rows[(self.state[rows] == _CONFIGURED) & (self.cluster[rows] >= 0)]
        if len(rows) == 0:
            return rows, rows
        pools = self.pools
        found: dict[tuple[int, int], int] = {}
        ids = np.empty(len(rows), dtype=np.int64)
        for k, pair in enumerate(
            zip(self.cluster[rows].tolist(), self.profile[rows].tolist(), strict=True)
        ):
            pool = found.get(pair)
            if pool is None:
                pool = pools.find(PoolKey(TIER_BOUND, *pair))
                assert pool is not None, "a settled configured machine is in its bound pool"
                found[pair] = pool
            ids[k] = pool
        return rows, ids

    def touch_bound(self, rows: npt.NDArray[np.int64]) -> None:
        """Mark the bound pools holding any of ``rows`` as changed (``Pools.generation``).

        Called when what the rows are bound to changes (``Bindings``): a
        count of a pool's members per need remembered under its generation
        must not outlive that.
        """
        _, pools = self.bound_pools_of(rows)
        for pool in set(pools.tolist()):
            self.pools.touch(pool)

    def _place(self, row: int) -> tuple[PoolKey | None, int]:
        """(pool key, supply owner) of a row: the one definition of where a machine counts."""
        flags = int(self.flags[row])
        state = int(self.state[row])
        if flags & (FLAG_IN_FLIGHT | FLAG_PROMISED):
            return None, self._targets.get(row, NO_CLUSTER)
        profile = int(self.profile[row])
        if state == _CONFIGURED:
            cluster = int(self.cluster[row])
            if cluster >= 0:
                return PoolKey(TIER_BOUND, cluster, profile), cluster
            return None, NO_CLUSTER
        if state == _IDLE:
            return PoolKey(TIER_IDLE, NO_CLUSTER, profile), NO_CLUSTER
        if state == _SPECULATIVE:
            return PoolKey(TIER_SPECULATIVE, NO_CLUSTER, profile), NO_CLUSTER
        if state == _CONFIGURING:
            return None, int(self.cluster[row])
        if state == _CREATING and flags & FLAG_CREATING_FOR:
            return None, self._targets.get(row, NO_CLUSTER)
        return None, NO_CLUSTER

    def _detach(self, row: int) -> None:
        key, owner = self._place(row)
        profile = int(self.profile[row])
        if key is not None:
            pool = self.pools.find(key)
            assert pool is not None
            self.pools.remove(row, pool)
            if key.tier != TIER_BOUND:
                self._free[key.tier, profile] -= 1
        if owner >= 0:
            self._supply[owner, profile] -= 1
            self._versions[owner] += 1
        bound = int(self.cluster[row])
        if bound >= 0:
            self._versions[bound] += 1
        self.state_counts[int(self.state[row])] -= 1
        self._members[profile] -= 1

    def _attach(self, row: int) -> None:
        key, owner = self._place(row)
        profile = int(self.profile[row])
        if key is not None:
            self.pools.add(row, self.pools.pool(key))
            if key.tier != TIER_BOUND:
                self._free[key.tier, profile] += 1
                self._arrivals[profile] += 1
        if owner >= 0:
            self._supply[owner, profile] += 1
            self._versions[owner] += 1
        bound = int(self.cluster[row])
        if bound >= 0:
            self._versions[bound] += 1
        self.state_counts[int(self.state[row])] += 1
        self._members[profile] += 1

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
        cluster = self.clusters.index_of(record.cluster) if record.cluster else NO_CLUSTER
        self.ensure_tables()
        row, fresh = self.ids.ensure(record.id)
        if fresh:
            self._ensure_rows(row + 1)
            self.flags[row] = 0
            self._targets.pop(row, None)
        else:
            self._detach(row)
        state = MachineState(record.state)
        if fresh or int(self.state[row]) != int(state):
            self.since[row] = self.seconds(now)
        self.state[row] = int(state)
        self.profile = _widened(self.profile, profile)
        self.cluster = _widened(self.cluster, cluster)
        self.profile[row] = profile
        flags = int(self.flags[row]) & ~FLAG_CREATING_FOR
        if state.has_host:
            self.cluster[row] = cluster
            self._host_ref.set(row, record.host_ref)
            if flags & (FLAG_IN_FLIGHT | FLAG_PROMISED) == 0:
                self._targets.pop(row, None)
        else:
            self.cluster[row] = NO_CLUSTER
            self._host_ref.store(row, 0, 0)
            if flags & (FLAG_IN_FLIGHT | FLAG_PROMISED) == 0:
                self._targets.pop(row, None)
                if state is MachineState.CREATING and cluster >= 0:
                    flags |= FLAG_CREATING_FOR
                    self._targets[row] = cluster
        if state is not MachineState.CONFIGURED:
            flags &= _FLAG_BITS
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
        self.cluster[row] = NO_CLUSTER
        self._targets.pop(row, None)
        self._host_ref.store(row, 0, 0)
        self._last_error.pop(row, None)
        self.ids.discard(row)

    def set_flags(self, row: int, *, flags: int, target: int) -> None:
        """Change a machine's in-flight/promised flags and target, keeping all counts exact."""
        if target >= self._supply.shape[0]:
            self.ensure_tables()
        old_key, old_owner = self._place(row)
        keep = int(self.flags[row]) & ~(FLAG_IN_FLIGHT | FLAG_PROMISED | FLAG_CREATING_FOR)
        self.flags[row] = keep | flags
        if flags:
            self._targets[row] = target
        else:
            self._targets.pop(row, None)
        new_key, new_owner = self._place(row)
        # State and profile are unchanged: only pool membership and supply can move.
        profile = int(self.profile[row])
        if old_key != new_key:
            if old_key is not None:
                pool = self.pools.find(old_key)
                assert pool is not None
                self.pools.remove(row, pool)
                if old_key.tier != TIER_BOUND:
                    self._free[old_key.tier, profile] -= 1
            if new_key is not None:
                self.pools.add(row, self.pools.pool(new_key))
                if new_key.tier != TIER_BOUND:
                    self._free[new_key.tier, profile] += 1
                    self._arrivals[profile] += 1
        if old_owner != new_owner:
            if old_owner >= 0:
                self._supply[old_owner, profile] -= 1
                self._versions[old_owner] += 1
            if new_owner >= 0:
                self._supply[new_owner, profile] += 1
                self._versions[new_owner] += 1
        bound = int(self.cluster[row])
        if bound >= 0 and old_key != new_key:
            self._versions[bound] += 1

    def mark_in_flight(self, rows: list[int], target: int) -> None:
        """:meth:`set_flags` (in flight, toward ``target``) for many settled machines at once.

        The commit of a plan does this for every machine it names. Columns
        are read for the whole batch at once, count updates are summed, and
        machines that form the tail of their pool — which is where a cycle
        takes them from — leave it by shortening the pool. Rows already in
        flight or promised take the per-row path.
        """
        if target >= self._supply.shape[0]:
            self.ensure_tables()
        if not rows:
            return
        index = np.asarray(rows, dtype=np.int64)
        flags = self.flags
        pools = self.pools
        moved: dict[tuple[int, int], int] = {}
        freed: dict[tuple[int, int], int] = {}
        bumped: dict[int, int] = {}
        leaving: dict[PoolKey, list[int]] = {}
        plain: list[int] = []
        targets = self._targets
        for row, flag, state, profile, cluster in zip(
            rows,
            flags[index].tolist(),
            self.state[index].tolist(),
            self.profile[index].tolist(),
            self.cluster[index].tolist(),
            strict=True,
        ):
            if flag & (FLAG_IN_FLIGHT | FLAG_PROMISED):
                self.set_flags(row, flags=FLAG_IN_FLIGHT, target=target)
                continue
            # The settled branch of ``_place``, on plain integers.
            key: PoolKey | None = None
            owner = NO_CLUSTER
            if state == _CONFIGURED:
                if cluster >= 0:
                    key = PoolKey(TIER_BOUND, cluster, profile)
                    owner = cluster
            elif state == _IDLE:
                key = PoolKey(TIER_IDLE, NO_CLUSTER, profile)
            elif state == _SPECULATIVE:
                key = PoolKey(TIER_SPECULATIVE, NO_CLUSTER, profile)
            elif state == _CONFIGURING:
                owner = cluster
            elif state == _CREATING and flag & FLAG_CREATING_FOR:
                owner = targets.get(row, NO_CLUSTER)
            if key is not None:
                leaving.setdefault(key, []).append(row)
                if key.tier != TIER_BOUND:
                    freed[(key.tier, profile)] = freed.get((key.tier, profile), 0) + 1
                if cluster >= 0:
                    bumped[cluster] = bumped.get(cluster, 0) + 1
            if owner != target:
                if owner >= 0:
                    moved[(owner, profile)] = moved.get((owner, profile), 0) - 1
                if target >= 0:
                    moved[(target, profile)] = moved.get((target, profile), 0) + 1
            plain.append(row)
        for key, members in leaving.items():
            pool = pools.find(key)
            assert pool is not None
            if not pools.remove_tail(pool, members):
                for row in members:
                    pools.remove(row, pool)
        if not plain:
            return
        flags[plain] = (flags[plain] & ~np.uint8(FLAG_CREATING_FOR)) | np.uint8(FLAG_IN_FLIGHT)
        targets.update(dict.fromkeys(plain, target))
        for (tier, profile), count in freed.items():
            self._free[tier, profile] -= count
        for (cluster, profile), delta in moved.items():
            if delta:
                self._supply[cluster, profile] += delta
                bumped[cluster] = bumped.get(cluster, 0) + 1
        for cluster, count in bumped.items():
            self._versions[cluster] += count

    def mark_taken_in_flight(
        self,
        *,
        rows: npt.NDArray[np.int64],
        pools: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
        targets: npt.NDArray[np.int64],
    ) -> None:
        """:meth:`mark_in_flight` for machines a cycle took from the tails of their pools.

        ``rows`` is a run of segments: ``counts[i]`` rows taken from pool
        ``pools[i]`` and headed for ``targets[i]``. Every pool's rows named
        here must be exactly its tail, as ``Worksheet.take`` handed them
        out, with nothing added to the pool since; then the pool simply
        shortens. Such rows are settled and in no flight, so their pool,
        supply owner and free tier follow from the pool alone, and every
        count moves in a handful of vectorised steps however many machines
        there are. The clusters whose version changes are the ones
        :meth:`mark_in_flight` would change: the clusters the machines are
        bound to, and the ones they are headed for.
        """
        if len(rows) == 0:
            return
        if int(targets.max()) >= self._supply.shape[0]:
            self.ensure_tables()
        all_pools = self.pools
        tier = all_pools.tier[pools].astype(np.int64)
        cluster = all_pools.cluster[pools].astype(np.int64)
        profile = all_pools.profile[pools].astype(np.int64)
        all_pools.shorten(pools, counts)
        free = tier != TIER_BOUND
        bound = ~free
        heading = targets >= 0
        supply = self._supply
        np.subtract.at(supply, (cluster[bound], profile[bound]), counts[bound].astype(supply.dtype))
        np.add.at(
            supply, (targets[heading], profile[heading]), counts[heading].astype(supply.dtype)
        )
        touched = [cluster[bound], targets[heading]]
        if free.any():
            np.subtract.at(self._free, (tier[free], profile[free]), counts[free])
            # Idle machines may still name the cluster they last served.
            named = self.cluster[rows[np.repeat(free, counts)]]
            touched.append(named[named >= 0].astype(np.int64))
        # Buffered fancy addition: a cluster named twice still moves by one, as with unique.
        self._versions[np.concatenate(touched)] += 1
        flags = self.flags
        flags[rows] = (flags[rows] & ~np.uint8(FLAG_CREATING_FOR)) | np.uint8(FLAG_IN_FLIGHT)
        self._targets.update(zip(rows.tolist(), np.repeat(targets, counts).tolist(), strict=True))

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
            host_ref=self._host_ref.get(row),
            last_error=self._last_error.get(row, ""),
        )

    def records(self) -> Iterator[MachineRecord]:
        """Every machine's record, in row order."""
        for row in self.ids.live_rows():
            yield self.record(row)
