"""The worker pool's state and decisions, pure: no I/O, no clock, no asyncio.

The adapter feeds it what the scheduler asks (:meth:`WorkerPool.scale_to`)
and what the shard says (node states, reclaim instructions, capacity hints)
and reads back the scaling state for the scheduler (:meth:`scale_config`)
and the demand for the shard (:meth:`demand`): how many workers to ask for
and which machines the pool offers for release.

Vocabulary:

- **worker**: a BigFleet machine bound to this cluster; its ``instance_id``
  is the machine id. One machine runs one worker.
- **live**: a worker on its way or up (CREATING, CONFIGURING, CONFIGURED) and
  not being taken away (no reclaim instruction for it).
- **available**: live and CONFIGURED.
- **keep** / **delete**: the scheduler's ``workers_to_keep`` and
  ``workers_to_delete`` of its last accepted ScaleTo.
- **release**: the machines named in the roll-up's ``release`` extension:
  the only ones the shard may reclaim for excess (ADR 0070).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bigfleet.v1alpha1 import provider_pb2
from nanook.config import PoolConfig

__all__ = [
    "Demand",
    "ScaleConfig",
    "ScaleRefused",
    "SupplyHint",
    "Worker",
    "WorkerPool",
]

_CREATING = provider_pb2.MACHINE_STATE_CREATING
_CONFIGURING = provider_pb2.MACHINE_STATE_CONFIGURING
_CONFIGURED = provider_pb2.MACHINE_STATE_CONFIGURED
_LIVE_STATES = frozenset({_CREATING, _CONFIGURING, _CONFIGURED})


class ScaleRefused(Exception):
    """A ScaleTo the adapter does not accept.

    ``kind`` says how the transports answer it: ``invalid`` (the request is
    wrong: 400 / INVALID_ARGUMENT), ``conflict`` (cannot be honoured now,
    ask again later: 409 / FAILED_PRECONDITION) or ``unavailable`` (no shard
    session: 503 / UNAVAILABLE, retried by the scheduler).
    """

    def __init__(self, kind: str, field: str, reason: str) -> None:
        self.kind, self.field, self.reason = kind, field, reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class ScaleConfig:
    """What ``/scale_config`` and ``ScaleConfig`` report."""

    desired: int
    available: int
    min: int
    max: int | None


@dataclass(frozen=True)
class Demand:
    """What the adapter asks of its shard: workers wanted, and machines offered for release."""

    workers: int
    release: frozenset[str]


@dataclass
class Worker:
    """The adapter's view of one machine of its cluster."""

    machine_id: str
    state: int
    leaving: bool = False  # a reclaim instruction named it
    labels: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state in _LIVE_STATES and not self.leaving

    @property
    def available(self) -> bool:
        return self.state == _CONFIGURED and not self.leaving


@dataclass(frozen=True)
class SupplyHint:
    """One AvailableCapacityUpdate: ``count`` free machines with these labels and resources."""

    labels: Mapping[str, str]
    resources: Mapping[str, float]
    count: int


class WorkerPool:
    """State of one Nanook worker pool (see module docstring)."""

    def __init__(self, config: PoolConfig, *, shard_honours_release: bool = False) -> None:
        self.config = config
        self.desired = config.min
        self.keep: frozenset[str] = frozenset()
        self.delete: tuple[str, ...] = ()
        self.workers: dict[str, Worker] = {}
        self.hints: dict[str, SupplyHint] = {}
        # Whether the shard said (Hello ack) it honours the release extension.
        self.shard_honours_release = shard_honours_release
        self.connected = False
        # Until the scheduler's first ScaleTo the pool adopts the workers it finds
        # (an adapter restarted under a running cluster must not shed them).
        self.adopting = True
        self.reclaimed_total = 0  # workers named by reclaim instructions (preemption)

    # -- what the scheduler sees -----------------------------------------------------------
    def live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.live]

    def available(self) -> int:
        return sum(1 for w in self.workers.values() if w.available)

    def supply(self) -> int | None:
        """Workers the shard reports it could add soon, or None before any report."""
        if not self.hints:
            return None
        return sum(h.count for h in self.hints.values() if self._fits(h))

    def max(self) -> int | None:
        """The pool's max, bounded by live workers plus the supply the shard reports."""
        bound = self.config.max
        supply = self.supply()
        if supply is not None:
            reachable = len(self.live()) + supply
            bound = reachable if bound is None else min(bound, reachable)
            bound = max(bound, self.config.min)
        return bound

    def target(self) -> int:
        """The workers the pool holds on to: ``desired``, or while adopting, every live one."""
        if self.adopting:
            return max(self.desired, len(self.live()))
        return self.desired

    def scale_config(self) -> ScaleConfig:
        return ScaleConfig(
            desired=self.target(), available=self.available(), min=self.config.min, max=self.max()
        )

    # -- the scheduler's requests ------------------------------------------------------------
    def scale_to(
        self,
        amount: int,
        *,
        keep: Iterable[str] | None = None,
        delete: Iterable[str] | None = None,
    ) -> None:
        """Accept a new target or raise :class:`ScaleRefused`; nothing changes when refused."""
        if not self.connected:
            raise ScaleRefused(
                "unavailable", "session", "the adapter has no session with its shard; retry"
            )
        if amount < self.config.min:
            raise ScaleRefused("invalid", "amount", f"{amount} is below min {self.config.min}")
        ceiling = self.max()
        if ceiling is not None and amount > ceiling:
            raise ScaleRefused("invalid", "amount", f"{amount} is above max {ceiling}")
        keep_set = frozenset(keep or ())
        live = self.live()
        if amount < len(live) and keep_set:
            if not self.shard_honours_release:
                raise ScaleRefused(
                    "conflict",
                    "workers_to_keep",
                    "the shard does not honour named release, so the workers to keep cannot "
                    "be guaranteed; scale down while no query runs",
                )
            kept = sum(1 for w in live if w.machine_id in keep_set)
            if kept > amount:
                raise ScaleRefused(
                    "conflict",
                    "workers_to_keep",
                    f"{kept} live workers must be kept, more than the target {amount}; "
                    "ask again when fewer queries run",
                )
        self.desired = amount
        self.adopting = False
        self.keep = keep_set
        self.delete = tuple(dict.fromkeys(delete or ()))

    # -- what the shard says -------------------------------------------------------------
    def node_state(
        self,
        machine_id: str,
        state: int,
        *,
        labels: Mapping[str, str] | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        """A NodeStateUpdate: a machine coming to, up in, or leaving the cluster."""
        if state not in _LIVE_STATES:
            self.workers.pop(machine_id, None)
            return
        worker = self.workers.get(machine_id)
        if worker is None:
            worker = self.workers[machine_id] = Worker(machine_id, state)
        worker.state = state
        if labels is not None:
            worker.labels = dict(labels)
        if resources is not None:
            worker.resources = dict(resources)

    def reclaim(self, nodes: Sequence[str]) -> int:
        """A ReclaimInstruction: these workers are being taken; returns how many were ours."""
        ours = 0
        for node in nodes:
            worker = self.workers.get(node)
            if worker is not None and not worker.leaving:
                worker.leaving = True
                ours += 1
        self.reclaimed_total += ours
        return ours

    def supply_hint(self, key: str, hint: SupplyHint) -> None:
        """An AvailableCapacityUpdate (coalesced by its ``supersedes_key``).

        A count of zero is kept: "none free" bounds ``max``, where no hint
        at all leaves it to the pool's own limit.
        """
        self.hints[key] = hint

    # -- what the shard is asked -----------------------------------------------------------
    def demand(self) -> Demand:
        """Workers to ask for and machines offered for release.

        Workers in ``delete`` go first and are replaced: while the others are
        fewer than the target, the pool asks for the target plus the workers
        to delete (so replacements start) and offers none; once enough others
        are live, it asks for the target and offers the workers to delete and,
        if the pool is still over target, unkept others — configured ones
        first, as only those can be reclaimed right away. Kept workers are
        never offered.
        """
        live = self.live()
        target = self.target()
        doomed = [w for w in live if w.machine_id in set(self.delete) - self.keep]
        doomed_ids = {w.machine_id for w in doomed}
        others = [w for w in live if w.machine_id not in doomed_ids]
        if len(others) < target:
            return Demand(target + len(doomed), frozenset())
        surplus = len(others) - target
        spare = sorted(
            (w for w in others if w.machine_id not in self.keep),
            key=lambda w: (w.state != _CONFIGURED, w.machine_id),
        )
        release = doomed_ids | {w.machine_id for w in spare[:surplus]}
        return Demand(target, frozenset(release))

    def _fits(self, hint: SupplyHint) -> bool:
        """True when a machine of ``hint`` can run a worker of this pool."""
        if not all(req.admits(hint.labels) for req in self.config.requirements):
            return False
        return all(
            hint.resources.get(name, 0.0) + 1e-9 >= amount
            for name, amount in self.config.worker_amounts.items()
        )

    def oversized(self) -> list[str]:
        """Workers whose machine could hold two workers (the pool's worker is sized too small)."""
        out = []
        for w in self.workers.values():
            if w.resources and all(
                w.resources.get(name, 0.0) >= 2 * amount
                for name, amount in self.config.worker_amounts.items()
            ):
                out.append(w.machine_id)
        return out
