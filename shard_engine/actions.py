"""A cycle's actions as columns: recorded as segments, read as a table, built as values on demand.

A cycle names hundreds to thousands of machines. Building one frozen action
value per machine — and decoding its ID from the compact columns — inside
the cycle cost 25–40 µs per action, most of a burst cycle (ADR 0060). So the
phases record **segments** instead: a run of machines taken from one pool
for one purpose (its rows as one array, plus the kind, cluster, need,
priority and grace they share) into an :class:`ActionLog`. At the end of
the cycle the log becomes an :class:`ActionTable`, one entry per machine
named, in plan order, with every attribute as a numpy column and the
machine IDs as a snapshot of their encoded form. Committing the plan works
on the segments (``engine``), and ``Plan.actions`` — the tuple of
dataclasses the executor and tests read — is built from the table the
first time someone asks, outside the cycle.

The table is self-contained: it copies what it needs at the end of the
cycle (encoded IDs, cluster names by reference to an append-only list), so
it decodes to the same actions however the engine changes afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shard_engine.clusters import NO_CLUSTER
from shard_engine.identifiers import StringsSnapshot
from shard_engine.model import (
    REASON_INTERRUPTION,
    REASON_RECLAIM,
    Action,
    AssignIdle,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Requirement,
    Verify,
)

__all__ = ["ActionKind", "ActionLog", "ActionTable", "NeedRef"]

IntArray = npt.NDArray[np.int64]

NeedRef = tuple[str, tuple[Requirement, ...]]
"""A need as an action names it: its key and its requirements."""


class Snapshots(Protocol):
    """What :meth:`ActionTable.build` needs of the ID column (a ``CompactStrings``)."""

    def snapshot(self, rows: IntArray) -> StringsSnapshot:
        """The strings on ``rows``, copied out."""
        ...


class ActionKind(IntEnum):
    """What an entry of the table asks for (one value per action type)."""

    ASSIGN_IDLE = 1
    PROVISION = 2
    PREEMPT = 3
    RECLAIM = 4
    RELEASE = 5
    VERIFY = 6
    INTERRUPT = 7  # drain ahead of an interruption the provider announced


_PER_MACHINE = np.array([False, True, False, True, True, True, True, True])
"""Indexed by kind: every kind but PROVISION is one action per machine."""


class ActionLog:
    """Segments recorded by the phases of one cycle, in plan order.

    Each ``add`` is one segment: ``rows`` (engine rows, int64) share every
    other attribute. ``pool`` is the pool the rows are in, -1 when unknown
    or none (promised, verified machines); ``tail`` says they were taken
    from that pool's tail (:meth:`Worksheet.take`) rather than picked from
    anywhere in it (released machines, machines a cluster named).
    Committing relies on both.
    A PROVISION segment either opens a new Provision action or, with
    ``opens=False``, adds its machines to the one the previous segment
    opened (one batched Create per need across several shapes).
    """

    __slots__ = (
        "cluster",
        "grace",
        "kind",
        "need",
        "needs",
        "opens",
        "pool",
        "priority",
        "rows",
        "source",
        "tail",
        "victim_priority",
    )

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.rows: list[IntArray] = []
        self.pool: list[int] = []
        self.tail: list[bool] = []
        self.cluster: list[int] = []
        self.source: list[int] = []
        self.need: list[int] = []
        self.priority: list[int] = []
        self.victim_priority: list[int] = []
        self.grace: list[int] = []
        self.opens: list[bool] = []
        self.needs: list[NeedRef] = []

    def __len__(self) -> int:
        return len(self.kind)

    def add(
        self,
        kind: ActionKind,
        rows: IntArray,
        *,
        cluster: int,
        pool: int = -1,
        tail: bool = True,
        source: int = NO_CLUSTER,
        need: NeedRef | None = None,
        priority: int = 0,
        victim_priority: int = 0,
        grace: int = 0,
        opens: bool = True,
    ) -> None:
        """Record one segment (nothing is recorded for no rows)."""
        if len(rows) == 0:
            return
        self.kind.append(int(kind))
        self.rows.append(rows)
        self.pool.append(pool)
        self.tail.append(tail and pool >= 0)
        self.cluster.append(cluster)
        self.source.append(source)
        if need is None:
            self.need.append(-1)
        else:
            self.need.append(len(self.needs))
            self.needs.append(need)
        self.priority.append(priority)
        self.victim_priority.append(victim_priority)
        self.grace.append(grace)
        self.opens.append(opens)

    def need_key(self, segment: int) -> str:
        """Key of the need segment ``segment`` serves ("" for none)."""
        n = self.need[segment]
        return "" if n < 0 else self.needs[n][0]


class ActionTable:
    """Every machine a plan names, one entry each, in plan order (see module docstring).

    Columns (numpy, one value per entry):

    ``kind``
        :class:`ActionKind` value.
    ``action``
        position of the entry's action in ``Plan.actions`` (entries of one
        Provision share it; every other kind has one entry per action).
    ``cluster``
        index of the cluster the action is for — the one a machine is
        assigned, provisioned or preempted for, the one a reclaimed or
        verified machine belongs to; ``NO_CLUSTER`` (-1) for a release.
        :meth:`cluster_id` names it.
    ``source``
        the cluster a preempted machine leaves; ``NO_CLUSTER`` otherwise.
    ``need``
        index into :attr:`needs` (key and requirements), -1 for none.
    ``priority``
        the need's priority (the preemptor's for a preemption).
    ``victim_priority``, ``grace``
        a preemption's victim priority; a drain's grace in seconds.

    :meth:`machine_ids` decodes the IDs (cached); :meth:`actions` builds the
    action values. ``rows`` are the engine's row numbers, meaningful only to
    the engine that made the plan.
    """

    __slots__ = (
        "_actions",
        "_ids",
        "_machine_ids",
        "_names",
        "_opens",
        "_starts",
        "action",
        "cluster",
        "grace",
        "kind",
        "need",
        "needs",
        "priority",
        "rows",
        "source",
        "victim_priority",
    )

    def __init__(
        self,
        *,
        rows: IntArray,
        kind: npt.NDArray[np.int8],
        action: IntArray,
        cluster: npt.NDArray[np.int32],
        source: npt.NDArray[np.int32],
        need: npt.NDArray[np.int32],
        priority: IntArray,
        victim_priority: IntArray,
        grace: IntArray,
        needs: Sequence[NeedRef],
        ids: StringsSnapshot,
        names: Sequence[str],
        starts: IntArray,
        opens: npt.NDArray[np.bool_],
    ) -> None:
        self.rows = rows
        self.kind = kind
        self.action = action
        self.cluster = cluster
        self.source = source
        self.need = need
        self.priority = priority
        self.victim_priority = victim_priority
        self.grace = grace
        self.needs = tuple(needs)
        self._ids = ids
        self._names = names
        self._starts = starts
        self._opens = opens
        self._machine_ids: list[str] | None = None
        self._actions: tuple[Action, ...] | None = None

    @classmethod
    def empty(cls) -> ActionTable:
        """A table naming no machine."""
        none = np.zeros(0, dtype=np.int64)
        return cls.build(
            ActionLog(),
            ids=None,
            names=(),
            snapshot=StringsSnapshot([], none, none.astype(np.uint64), None),
        )

    @classmethod
    def build(
        cls,
        log: ActionLog,
        *,
        ids: Snapshots | None,
        names: Sequence[str],
        snapshot: StringsSnapshot | None = None,
    ) -> ActionTable:
        """Turn a cycle's segments into columns (a few numpy calls, whatever the size).

        ``ids`` snapshots the machine IDs of the rows; ``names`` is the
        engine's append-only list of cluster names.
        """
        count = len(log)
        lengths = np.array([len(r) for r in log.rows], dtype=np.int64)
        rows = np.concatenate(log.rows) if count else np.zeros(0, dtype=np.int64)
        kinds = np.array(log.kind, dtype=np.int8)
        opens = np.array(log.opens, dtype=np.bool_)
        starts = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        kind = np.repeat(kinds, lengths)
        # An entry opens an action when its kind is one per machine, or it is the
        # first machine of a segment that opens a Provision.
        new = _PER_MACHINE[kind]
        first = starts[:-1][~_PER_MACHINE[kinds] & opens]
        new[first] = True
        action = np.cumsum(new, dtype=np.int64) - 1
        if snapshot is None:
            assert ids is not None, "a table naming machines needs their IDs"
            snapshot = ids.snapshot(rows)
        return cls(
            rows=rows,
            kind=kind,
            action=action,
            cluster=np.repeat(np.array(log.cluster, dtype=np.int32), lengths),
            source=np.repeat(np.array(log.source, dtype=np.int32), lengths),
            need=np.repeat(np.array(log.need, dtype=np.int32), lengths),
            priority=np.repeat(np.array(log.priority, dtype=np.int64), lengths),
            victim_priority=np.repeat(np.array(log.victim_priority, dtype=np.int64), lengths),
            grace=np.repeat(np.array(log.grace, dtype=np.int64), lengths),
            needs=log.needs,
            ids=snapshot,
            names=names,
            starts=starts,
            opens=opens,
        )

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def actions_count(self) -> int:
        """How many action values the table stands for (``len(Plan.actions)``)."""
        return int(self.action[-1]) + 1 if len(self.action) else 0

    def cluster_id(self, index: int) -> str:
        """The cluster ID of a value of the ``cluster`` or ``source`` column."""
        return "" if index < 0 else self._names[index]

    def machine_ids(self) -> list[str]:
        """Every entry's machine ID, in order (decoded once, then cached)."""
        if self._machine_ids is None:
            self._machine_ids = self._ids.decode()
        return self._machine_ids

    def actions(self) -> tuple[Action, ...]:
        """The action values, in plan order (built once, then cached)."""
        if self._actions is None:
            self._actions = tuple(self._build_actions())
        return self._actions

    def _build_actions(self) -> list[Action]:
        ids = self.machine_ids()
        name = self.cluster_id
        starts = self._starts.tolist()
        segments = len(starts) - 1
        first = starts[:-1]
        kinds = self.kind[first].tolist() if segments else []
        clusters = self.cluster[first].tolist() if segments else []
        sources = self.source[first].tolist() if segments else []
        needs = self.need[first].tolist() if segments else []
        priorities = self.priority[first].tolist() if segments else []
        victims = self.victim_priority[first].tolist() if segments else []
        graces = self.grace[first].tolist() if segments else []
        opens = self._opens.tolist()
        out: list[Action] = []
        batch: list[str] = []
        for s in range(segments):
            kind = kinds[s]
            machines = ids[starts[s] : starts[s + 1]]
            key, requirements = self.needs[needs[s]] if needs[s] >= 0 else ("", ())
            if kind == ActionKind.PROVISION:
                batch.extend(machines)
                if s + 1 < segments and kinds[s + 1] == ActionKind.PROVISION and not opens[s + 1]:
                    continue
                out.append(
                    Provision(
                        machine_ids=tuple(batch),
                        cluster_id=name(clusters[s]),
                        need_key=key,
                        priority=priorities[s],
                        requirements=requirements,
                    )
                )
                batch = []
            elif kind == ActionKind.ASSIGN_IDLE:
                cluster_id, priority = name(clusters[s]), priorities[s]
                out.extend(
                    AssignIdle(
                        machine_id=m,
                        cluster_id=cluster_id,
                        need_key=key,
                        priority=priority,
                        requirements=requirements,
                    )
                    for m in machines
                )
            elif kind == ActionKind.PREEMPT:
                victim_id, cluster_id = name(sources[s]), name(clusters[s])
                out.extend(
                    Preempt(
                        machine_id=m,
                        victim_cluster_id=victim_id,
                        victim_priority=victims[s],
                        preemptor_cluster_id=cluster_id,
                        preemptor_need_key=key,
                        preemptor_priority=priorities[s],
                        grace_seconds=graces[s],
                    )
                    for m in machines
                )
            elif kind == ActionKind.RECLAIM or kind == ActionKind.INTERRUPT:
                cluster_id, grace = name(clusters[s]), graces[s]
                why = REASON_INTERRUPTION if kind == ActionKind.INTERRUPT else REASON_RECLAIM
                out.extend(
                    Reclaim(machine_id=m, cluster_id=cluster_id, grace_seconds=grace, reason=why)
                    for m in machines
                )
            elif kind == ActionKind.RELEASE:
                out.extend(Release(machine_id=m) for m in machines)
            else:
                cluster_id = name(clusters[s])
                out.extend(Verify(machine_id=m, cluster_id=cluster_id) for m in machines)
        return out
