"""The cluster model: one cluster's nodes and pods, placed by vector bin packing.

It plays the cluster's kube-scheduler and its operator's roll-up, the same
way under both policies:

* **nodes** join when a machine reaches CONFIGURED for the cluster and leave
  when it is drained (reclaim, preemption, consolidation) or interrupted;
  pods on a leaving node go back to pending (evicted);
* **scheduling** places pending pods, highest priority first, oldest first,
  on nodes whose labels satisfy the pod's requirements (and its gang's
  rack), choosing the node with the configured packing heuristic
  (``clusters.packing.choose_node``); guaranteed pods count their placement
  size against ``allocatable − placed``; best-effort pods (gap on) borrow
  ``allocatable − reservations − borrowed`` and are evicted first when a
  guaranteed pod closes the gap (``clusters.gap``);
* a **gang** none of whose pods runs is placed all or nothing, in one
  domain of its key, as a gang scheduler does (ADR 0178); one that does
  not fit yet holds the room its pods were assumed on against younger
  pods; once it runs, a member evicted alone comes back to the domain its
  peers hold;
* a pod that cannot be placed although the matching nodes hold its request
  in total is **fragmented**; the roll-up asks once more for it. Every such
  pod counts, including the ones the pass did not try because a no-larger
  pod of the same kind had already failed: counting only the first left the
  rest waiting behind a roll-up the shard saw as covered;
* the **roll-up** is ``clusters.rollup.build_rollup`` over every pod the
  cluster must run, best-effort pods that fit in the gap left out — unless
  some best-effort pod of the same need does not fit: then that need is
  asked for whole, its borrowers included, since the gap they hold looks
  spare to the shard.

Arrays hold one row per node (swap-remove on leave), so a scheduling pass is
a few numpy operations per pod.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from bigfleet.v1alpha1 import capacity_pb2
from clusters.gap import evict_for_gap, fit_in_gap
from clusters.packing import FloatArray, Heuristic, choose_node
from clusters.pods import DIMENSIONS, PodSpec, Vector
from clusters.rollup import AggregationKey, build_rollup, need_key_of
from shard_engine.coordination import labels_satisfy
from shard_engine.model import AppClass, Operator, Requirement

__all__ = ["ClusterModel", "PodState"]

_D = len(DIMENSIONS)
_EPS = 1e-9


@dataclass(slots=True)
class PodState:
    """A pod's life in the cluster model."""

    spec: PodSpec
    arrived: float
    node: str = ""
    placed_at: float | None = None
    first_placed: float | None = None
    evictions: int = 0
    fragmented: bool = False
    borrowing: bool = False


@dataclass(slots=True)
class Counters:
    """What a cluster counts over a run (read by the metrics)."""

    evicted_preempt: int = 0
    evicted_reclaim: int = 0
    evicted_interrupt: int = 0
    evicted_gap: int = 0
    nodes_joined: int = 0
    nodes_left: int = 0
    flaps: int = 0
    waits: list[tuple[int, float]] = field(default_factory=list)
    # (priority, how long it waited) of each pod gone before it was ever placed
    abandoned: list[tuple[int, float]] = field(default_factory=list)
    # (priority, wait so far) of pods the replay's end found never placed (ADR 0175)
    cut_off: list[tuple[int, float]] = field(default_factory=list)
    # co-location group (a gang) -> [members arrived, members placed at least once]
    gangs: dict[str, list[int]] = field(default_factory=dict)
    # gang -> [its first member's arrival, the latest first placement of a member]
    gang_times: dict[str, list[float]] = field(default_factory=dict)
    # gangs a member of which the replay's end found never placed (ADR 0182)
    gangs_cut: set[str] = field(default_factory=set)


class ClusterModel:
    """One cluster's nodes, pods and scheduler (see the module docstring)."""

    def __init__(
        self,
        cluster_id: str,
        *,
        heuristic: Heuristic,
        gap: bool,
        flap_window_s: float = 600.0,
        release_after_s: float = 600.0,
        notify: set[str] | None = None,
        ends_at: float = math.inf,
    ) -> None:
        self.cluster_id = cluster_id
        # When the replay ends: a pod leaving then was cut off by it, not given up on.
        self.ends_at = ends_at
        # Clusters whose pods or nodes changed add their id here (the driver schedules them).
        self._notify = notify if notify is not None else set()
        self.heuristic = heuristic
        self.gap = gap
        self.flap_window_s = flap_window_s
        # A node is offered for release once it has been empty this long (ADR 0125).
        self.release_after_s = release_after_s
        self._now = 0.0  # the latest instant the model saw (roll-ups carry no clock)
        # When the next empty node becomes nameable (``releasable``), as of the last roll-up.
        self._release_due = math.inf
        self.pods: dict[str, PodState] = {}
        # pod -> (its roll-up aggregation key, the request the roll-up adds for it)
        self._keys: dict[str, tuple[AggregationKey, Vector]] = {}
        # pod -> (placement, reservation, borrows the gap): fixed for a pod's life
        self._vec: dict[str, tuple[FloatArray, FloatArray, bool]] = {}
        self.pending: dict[str, None] = {}
        # pod -> its scheduling rank (priority descending, then arrival): fixed for a pod's life
        self._rank: dict[str, tuple[int, float]] = {}
        self.counters = Counters()
        self.dirty = True  # the roll-up changed since it was last built
        self._ids: list[str] = []
        self._row: dict[str, int] = {}
        self._labels: list[Mapping[str, str]] = []
        self._joined: list[float] = []
        self._on_node: list[set[str]] = []
        self._empty_since: list[float] = []
        self._alloc = np.zeros((0, _D))
        self._placed = np.zeros((0, _D))
        self._reserved = np.zeros((0, _D))
        self._borrowed = np.zeros((0, _D))
        self._left_at: dict[str, float] = {}
        # usage() until a node or a placement changes (the metrics read it every sample)
        self._usage: tuple[FloatArray, FloatArray, FloatArray] | None = None
        self._masks: dict[tuple[Requirement, ...], np.ndarray] = {}  # cleared as nodes change

    # -- nodes ------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        """Nodes in the cluster now."""
        return len(self._ids)

    def node_ids(self) -> list[str]:
        """Machine ids of the cluster's nodes."""
        return list(self._ids)

    def has_node(self, machine_id: str) -> bool:
        """Is this machine one of the cluster's nodes?"""
        return machine_id in self._row

    def add_node(
        self,
        machine_id: str,
        allocatable: Mapping[str, float],
        labels: Mapping[str, str],
        now: float,
    ) -> None:
        """A machine reached CONFIGURED for this cluster: it becomes a node."""
        if machine_id in self._row:
            return
        row = len(self._ids)
        self._ids.append(machine_id)
        self._row[machine_id] = row
        self._labels.append(labels)
        self._joined.append(now)
        self._on_node.append(set())
        self._empty_since.append(now)
        self._now = max(self._now, now)
        vec = np.array([[allocatable.get(d, 0.0) for d in DIMENSIONS]])
        self._alloc = np.vstack([self._alloc, vec])
        zero = np.zeros((1, _D))
        self._placed = np.vstack([self._placed, zero])
        self._reserved = np.vstack([self._reserved, zero])
        self._borrowed = np.vstack([self._borrowed, zero])
        self.counters.nodes_joined += 1
        self._usage = None
        self._masks.clear()
        self.dirty = True
        self._notify.add(self.cluster_id)

    def remove_node(self, machine_id: str, now: float, *, reason: str) -> int:
        """A node leaves (drained or lost); its pods go back to pending. Returns pods evicted.

        ``reason`` is ``preempt``, ``reclaim`` (incl. consolidation) or
        ``interrupt``. A node that leaves within the flap window of joining
        counts as a flap.
        """
        row = self._row.pop(machine_id, None)
        if row is None:
            return 0
        if now - self._joined[row] < self.flap_window_s and reason != "interrupt":
            self.counters.flaps += 1
        evicted = sorted(self._on_node[row])
        for name in evicted:
            self._unplace(self.pods[name], now, evicted=True)
        if reason == "preempt":
            self.counters.evicted_preempt += len(evicted)
        elif reason == "interrupt":
            self.counters.evicted_interrupt += len(evicted)
        else:
            self.counters.evicted_reclaim += len(evicted)
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._ids[row] = moved
            self._row[moved] = row
            self._labels[row] = self._labels[last]
            self._joined[row] = self._joined[last]
            self._on_node[row] = self._on_node[last]
            self._empty_since[row] = self._empty_since[last]
            for arr in (self._alloc, self._placed, self._reserved, self._borrowed):
                arr[row] = arr[last]
            for name in self._on_node[row]:
                self.pods[name].node = moved
        self._ids.pop()
        self._labels.pop()
        self._joined.pop()
        self._on_node.pop()
        self._empty_since.pop()
        self._alloc = self._alloc[:last]
        self._placed = self._placed[:last]
        self._reserved = self._reserved[:last]
        self._borrowed = self._borrowed[:last]
        self.counters.nodes_left += 1
        self._usage = None
        self._masks.clear()
        self.dirty = True
        self._notify.add(self.cluster_id)
        return len(evicted)

    def pods_on(self, machine_id: str) -> int:
        """How many pods run on a node."""
        row = self._row.get(machine_id)
        return 0 if row is None else len(self._on_node[row])

    # -- pods -------------------------------------------------------------------------
    def arrive(self, pod: PodSpec, now: float) -> None:
        """A pod is created: it waits to be scheduled."""
        if pod.name in self.pods:
            return
        self.pods[pod.name] = PodState(spec=pod, arrived=now)
        if pod.colocation:
            self.counters.gangs.setdefault(pod.colocation, [0, 0])[0] += 1
            self.counters.gang_times.setdefault(pod.colocation, [now, math.nan])
        self._rank[pod.name] = (-pod.priority, now)
        request = pod.placement(gap=False) if pod.in_gap else pod.placement(gap=self.gap)
        self._keys[pod.name] = (need_key_of(pod), request)
        self.pending[pod.name] = None
        self.dirty = True
        self._notify.add(self.cluster_id)

    def leave(self, name: str, now: float) -> None:
        """A pod finishes or is deleted."""
        state = self.pods.pop(name, None)
        if state is None:
            return
        if state.first_placed is None:
            prio = state.spec.priority
            if now >= self.ends_at:
                # The trace's pods still running at its end leave then; one still waiting
                # has waited this long so far, which is all the replay can say (ADR 0175).
                self.counters.cut_off.append((prio, now - state.arrived))
                if state.spec.colocation:
                    self.counters.gangs_cut.add(state.spec.colocation)
            else:
                self.counters.abandoned.append((prio, now - state.arrived))
        if state.node:
            self._unplace(state, now, evicted=False)
        self.pending.pop(name, None)
        self._keys.pop(name, None)
        self._vec.pop(name, None)
        self._rank.pop(name, None)
        self.dirty = True
        self._notify.add(self.cluster_id)

    def _vectors(self, pod: PodSpec) -> tuple[FloatArray, FloatArray, bool]:
        """(placement, reservation, borrows-the-gap) as arrays (computed once per pod)."""
        known = self._vec.get(pod.name)
        if known is not None:
            return known
        borrowing = pod.in_gap and self.gap
        placement = np.array(pod.placement(gap=self.gap))
        reservation = np.array(pod.limit if borrowing else pod.reservation)
        if pod.app_class is AppClass.BEST_EFFORT and not self.gap:
            reservation = np.array(pod.limit)
        placement.flags.writeable = False
        reservation.flags.writeable = False
        if pod.name in self.pods:
            self._vec[pod.name] = (placement, reservation, borrowing)
        return placement, reservation, borrowing

    def _unplace(self, state: PodState, now: float, *, evicted: bool) -> None:
        self._usage = None
        row = self._row.get(state.node)
        if row is not None:
            placement, reservation, borrowing = self._vectors(state.spec)
            if borrowing:
                self._borrowed[row] -= reservation
            else:
                self._placed[row] -= placement
                self._reserved[row] -= reservation
            self._on_node[row].discard(state.spec.name)
            if not self._on_node[row]:
                self._empty_since[row] = now
        self._now = max(self._now, now)
        state.node = ""
        state.placed_at = None
        state.borrowing = False
        if evicted:
            state.evictions += 1
            self.pending[state.spec.name] = None
        self.dirty = True

    def _place(self, state: PodState, row: int, now: float) -> None:
        self._usage = None
        placement, reservation, borrowing = self._vectors(state.spec)
        if borrowing:
            self._borrowed[row] += reservation
        else:
            self._placed[row] += placement
            self._reserved[row] += reservation
        state.node = self._ids[row]
        state.placed_at = now
        state.borrowing = borrowing
        state.fragmented = False
        if state.first_placed is None:
            state.first_placed = now
            self.counters.waits.append((state.spec.priority, now - state.arrived))
            if state.spec.colocation:
                self.counters.gangs[state.spec.colocation][1] += 1
                self.counters.gang_times[state.spec.colocation][1] = now
        self._on_node[row].add(state.spec.name)
        self.pending.pop(state.spec.name, None)
        self.dirty = True

    def _mask(self, requirements: tuple[Requirement, ...]) -> np.ndarray:
        """Which nodes satisfy ``requirements`` (kept until a node joins or leaves)."""
        known = self._masks.get(requirements)
        if known is not None:
            return known
        if not requirements:
            mask = np.ones(len(self._ids), dtype=bool)
        else:
            mask = np.fromiter(
                (labels_satisfy(requirements, labels) for labels in self._labels),
                dtype=bool,
                count=len(self._labels),
            )
        mask.flags.writeable = False
        self._masks[requirements] = mask
        return mask

    def _gang_domains(self) -> dict[str, str]:
        """Per co-location group with a pod running, the domain it runs in (its rack)."""
        pinned: dict[str, str] = {}
        for state in self.pods.values():
            spec = state.spec
            if spec.colocation and state.node and spec.colocation not in pinned:
                value = self._labels[self._row[state.node]].get(spec.colocation_key, "")
                if value:
                    pinned[spec.colocation] = value
        return pinned

    def _gang_requirements(self, pod: PodSpec) -> tuple[Requirement, ...]:
        """A gang member must land in the domain its placed peers hold."""
        reqs = pod.requirements
        if not pod.colocation:
            return reqs
        key = pod.colocation_key
        for other in self.pods.values():
            if other.node and other.spec.colocation == pod.colocation:
                value = self._labels[self._row[other.node]].get(key, "")
                return (*reqs, Requirement(key, Operator.IN, (value,)))
        return (*reqs, Requirement(key, Operator.EXISTS))

    def schedule(self, now: float) -> int:
        """Place what can be placed; returns pods placed. Gaps close on best-effort pods."""
        self._now = max(self._now, now)
        if not self.pending or not self._ids:
            return 0
        order = sorted(self.pending, key=self._rank.__getitem__)
        masks: dict[tuple[Requirement, ...], np.ndarray] = {}
        failed: dict[tuple[Requirement, ...], list[FloatArray]] = {}
        # Free room in total over a kind's matching nodes, as of ``placed`` placements.
        totals: dict[tuple[tuple[Requirement, ...], bool], tuple[int, FloatArray]] = {}
        placed = 0
        gangs_tried: set[str] = set()
        # Gangs with a pod running hold their domain; the others are placed whole or not at
        # all. Read at the first gang pod the pass meets (most passes meet none).
        running: set[str] | None = None
        # Room waiting gangs hold this pass (their pods wait on the nodes they were assumed on).
        held = np.zeros_like(self._alloc)
        for name in order:
            if name not in self.pending:
                continue  # placed earlier in this pass, with its gang
            state = self.pods[name]
            pod = state.spec
            if pod.colocation:
                if running is None:
                    running = self._running_gangs()
                if pod.colocation not in running:
                    # A gang none of whose pods runs is placed whole in one domain, or not at all.
                    if pod.colocation not in gangs_tried:
                        gangs_tried.add(pod.colocation)
                        members = [
                            n for n in order if self.pods[n].spec.colocation == pod.colocation
                        ]
                        placed += self._place_gang(members, now, held)
                    continue
            placement, reservation, borrowing = self._vectors(pod)
            need = reservation if borrowing else placement
            reqs = self._gang_requirements(pod)
            mask = masks.get(reqs)
            if mask is None:
                mask = masks[reqs] = self._mask(reqs)
            rows = np.flatnonzero(mask)
            if any(np.all(f <= need + _EPS) for f in failed.get(reqs, ())):
                # A no-larger pod of the same kind found no room this pass; this one has none
                # either, and is fragmented on the same terms as a pod that was tried.
                cached = totals.get((reqs, borrowing))
                if cached is None or cached[0] != placed:
                    cached = (placed, self._free(rows, borrowing).sum(axis=0))
                    totals[(reqs, borrowing)] = cached
                state.fragmented = len(rows) > 0 and bool(np.all(cached[1] + _EPS >= need))
                continue
            if len(rows) == 0:
                failed.setdefault(reqs, []).append(need)
                continue
            if borrowing:
                free = self._alloc[rows] - self._reserved[rows] - self._borrowed[rows]
            else:
                free = self._alloc[rows] - self._placed[rows]
            free = free - held[rows]
            pick = choose_node(need, free, self._alloc[rows], self.heuristic)
            if pick < 0:
                state.fragmented = bool(np.all(np.maximum(free, 0).sum(axis=0) + _EPS >= need))
                failed.setdefault(reqs, []).append(need)
                continue
            row = int(rows[pick])
            self._place(state, row, now)
            placed += 1
            if not borrowing:
                self._close_gap(row, now)
        return placed

    def _running_gangs(self) -> set[str]:
        """The co-location groups with a pod placed (each holds the domain it runs in)."""
        return {p.spec.colocation for p in self.pods.values() if p.node and p.spec.colocation}

    def _place_gang(self, members: list[str], now: float, held: FloatArray) -> int:
        """Place a gang's pending pods together in one domain of its key, or none of them.

        Training gangs run under a gang scheduler (coscheduling's PodGroup):
        none of a gang's pods binds until there is room for all of them
        (ADR 0178). Each domain whose nodes satisfy the gang's requirements
        is tried in turn (by its label's value), its members placed in
        scheduling order with the packing heuristic on a copy of its nodes'
        free room less what older gangs hold; the gang lands in the first
        domain that holds every member.

        A gang that fits nowhere waits whole, and is not fragmented: its
        need already asks for all of its pods in one domain. Its pods wait
        on the nodes they were assumed on, as coscheduling's Permit stage
        holds them: it holds, for the rest of the pass (``held``), the room
        its members take in the domain where most of them fit. So a younger
        gang does not take the nodes of a rack an older one is being
        completed in, the moment enough of them have joined for itself.
        """
        first = self.pods[members[0]].spec
        key = first.colocation_key
        reqs = (*first.requirements, Requirement(key, Operator.EXISTS))
        rows = np.flatnonzero(self._mask(reqs))
        domains: dict[str, list[int]] = {}
        for r in rows.tolist():
            domains.setdefault(self._labels[r].get(key, ""), []).append(r)
        for name in members:
            self.pods[name].fragmented = False
        most: list[tuple[int, FloatArray]] = []
        for value in sorted(domains):
            chosen = self._fit_gang(members, np.array(domains[value]), held)
            if len(chosen) == len(members):
                for name, (row, _) in zip(members, chosen, strict=True):
                    self._place(self.pods[name], row, now)
                    if not self._vectors(self.pods[name].spec)[2]:
                        self._close_gap(row, now)
                return len(members)
            if len(chosen) > len(most):
                most = chosen
        for row, need in most:
            held[row] += need
        return 0

    def _fit_gang(
        self, members: list[str], rows: np.ndarray, held: FloatArray
    ) -> list[tuple[int, FloatArray]]:
        """The node (row) and room each member takes on ``rows``, up to the first without room."""
        free = {b: self._free(rows, b) - held[rows] for b in (False, True)}
        chosen: list[tuple[int, FloatArray]] = []
        for name in members:
            placement, reservation, borrowing = self._vectors(self.pods[name].spec)
            need = reservation if borrowing else placement
            pick = choose_node(need, free[borrowing], self._alloc[rows], self.heuristic)
            if pick < 0:
                break
            free[borrowing][pick] -= need
            chosen.append((int(rows[pick]), need))
        return chosen

    def _free(self, rows: np.ndarray, borrowing: bool) -> FloatArray:
        """Room left on these nodes (never negative): the gap for borrowers, else unplaced."""
        if borrowing:
            room = self._alloc[rows] - self._reserved[rows] - self._borrowed[rows]
        else:
            room = self._alloc[rows] - self._placed[rows]
        free: FloatArray = np.maximum(room, 0.0)
        return free

    def _close_gap(self, row: int, now: float) -> None:
        """Evict best-effort pods from a node whose reservations and borrowings overflow it."""
        borrowers = sorted(n for n in self._on_node[row] if self.pods[n].borrowing)
        if not borrowers:
            return
        limits = np.array([self.pods[n].spec.limit for n in borrowers])
        priorities = np.array([self.pods[n].spec.priority for n in borrowers], dtype=np.int64)
        for i in evict_for_gap(self._alloc[row], self._reserved[row], limits, priorities):
            self._unplace(self.pods[borrowers[i]], now, evicted=True)
            self.counters.evicted_gap += 1

    # -- roll-up ----------------------------------------------------------------------
    def rollup(self, timestamp_ns: int) -> capacity_pb2.ClusterCapacityNeeds:
        """The cluster's full demand now (``clusters.rollup``), gap and fragmentation applied."""
        in_gap: list[str] = []
        if self.gap:
            borrowers = [n for n, s in self.pods.items() if s.borrowing]
            waiting = [n for n in self.pending if self.pods[n].spec.in_gap]
            fitting: list[str] = []
            full: set[AggregationKey] = set()
            if waiting and self._ids:
                room = np.maximum(self._alloc - self._reserved - self._borrowed, 0.0)
                limits = np.array([self.pods[n].spec.limit for n in waiting])
                fits = fit_in_gap(limits, room, self._alloc, self.heuristic)
                for name, node in zip(waiting, fits, strict=True):
                    if node >= 0:
                        fitting.append(name)
                    else:
                        full.add(self._keys[name][0])
            elif waiting:
                full = {self._keys[n][0] for n in waiting}
            # A need whose gap is full is asked for whole: the gap its borrowers hold
            # looks spare to the shard, which would count it against the pods that
            # do not fit and buy nothing for them (issue 18: best-effort pods waited
            # ~1,000 s beside 35 cores the shard saw as excess).
            in_gap = [n for n in (*borrowers, *fitting) if self._keys[n][0] not in full]
        extra = {n: 1 for n in self.pending if self.pods[n].fragmented}
        self.dirty = False
        msg = build_rollup(
            self.cluster_id,
            (s.spec for s in self.pods.values()),
            timestamp_ns=timestamp_ns,
            gap=self.gap,
            in_gap=in_gap,
            extra=extra,
            prepared=self._keys,
            pinned=self._gang_domains(),
        )
        msg.release.SetInParent()  # present, even empty: reclaim only what is named
        msg.release.machine_ids.extend(self.releasable())
        after = self._now - self.release_after_s
        self._release_due = min(
            (
                since + self.release_after_s
                for on, since in zip(self._on_node, self._empty_since, strict=True)
                if not on and since > after
            ),
            default=math.inf,
        )
        return msg

    def advance(self, now: float) -> None:
        """Time passed without an event: an empty node may have become nameable.

        ``releasable`` grows with time alone, but nothing else marks a quiet
        cluster dirty, so a cluster whose pods all left kept its empty nodes
        for the rest of the run: the roll-up sent when they emptied named
        none (not empty long enough) and no later one was built. Once the
        first of them has been empty ``release_after_s``, the roll-up
        changes and is sent again.
        """
        self._now = max(self._now, now)
        if now >= self._release_due:
            self.dirty = True

    def releasable(self) -> list[str]:
        """Nodes the cluster can give up with the least disruption (wire extension 1001).

        Nodes empty for ``release_after_s`` at the latest instant the model
        saw. A named node goes at the shard's next cycle (ADR 0125: an
        explicit release is not excess), so the cluster, like a
        per-cluster autoscaler's consolidation delay, waits before naming a
        node a burst may fill again. Naming them keeps the shard's Phase 3 off nodes
        whose pods would be evicted only because the sum of requests leaves
        packing slack (ADR 0081); a node lent to best-effort pods keeps
        them until it empties (naming it made the gap flap).
        The list is always sent, empty when nothing can go: present and
        empty means "reclaim none of my nodes for excess" (ADR 0070).
        """
        after = self._now - self.release_after_s
        return [
            mid
            for mid, on, since in zip(self._ids, self._on_node, self._empty_since, strict=True)
            if not on and since <= after
        ]

    # -- reading ----------------------------------------------------------------------
    def usage(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(allocatable, placed, expected use) summed over nodes, per dimension.

        Expected use is the guaranteed pods' reservations plus the borrowing
        best-effort pods' limits.
        """
        if self._usage is None:
            alloc: FloatArray = self._alloc.sum(axis=0)
            placed: FloatArray = self._placed.sum(axis=0) + self._borrowed.sum(axis=0)
            used: FloatArray = self._reserved.sum(axis=0) + self._borrowed.sum(axis=0)
            for total in (alloc, placed, used):
                total.flags.writeable = False
            self._usage = (alloc, placed, used)
        return self._usage

    def pending_counts(self) -> tuple[int, int]:
        """(pending pods, of which fragmented)."""
        fragmented = sum(1 for n in self.pending if self.pods[n].fragmented)
        return len(self.pending), fragmented

    def pending_pods(self) -> Iterable[PodState]:
        """Pods waiting to be placed."""
        return (self.pods[n] for n in self.pending)
