"""The provider core: one honest implementation of the CapacityProvider
contract that every simulated provider shares.

Flow of a mutating request (Create, Configure, Drain, Delete)::

    validate (InvalidArgument)          -- malformed requests move nothing
    Unimplemented?                      -- Delete on a provider without Delete
    fence per (shard_id, machine_id)    -- Fenced; an accepted token moves the mark
    look the machine up                 -- NotFound
    idempotent retry?                   -- same target, already on the way or there:
                                           answer with the existing operation id
                                           (a Drain with a shorter grace first
                                           shortens the drain in flight)
    legal edge?                         -- InvalidTransition (FAILED accepts nothing)
    accept: fresh operation id, transitional state, completion + deadline timers
    journal the change, then answer

Vocabulary:

* **operation** - one accepted transition, named by its operation id. A
  machine remembers its latest operation; a request toward the same target
  state while the machine is moving there or already there returns it.
* **fencing mark** - the newest (epoch, sequence) accepted for a
  (shard_id, machine_id); a token must be strictly newer to pass.
* **revision** - a counter bumped once per machine change; List cursors name
  a revision and return the machines changed after it.
* **plan** - what the substrate (sim cloud, bare metal) says a transition
  will do: finish after some simulated latency, fail with an error, or never
  finish. The core turns it into timers; the deadline timer turns a
  transition that did not finish in time into FAILED, and a completion that
  arrives after that is discarded.
* **grace in flight** - the grace period a DRAINING machine's drain is
  honouring. A repeated Drain with a smaller grace keeps the operation id but
  lowers it, and moves the drain's completion to no later than now plus the
  new grace (workloads still there are forced then); a larger or equal grace
  changes nothing. The drain's deadline, a stuck drain and an injected
  failure's outcome are left as they were; only the moment moves.

Substrates subclass `ProviderCore` and fill in the hooks at the bottom.
Everything runs on one event loop (or one `ManualScheduler`) and no method
awaits, so each request is atomic with respect to every other.
"""

from __future__ import annotations

import builtins
import collections
import logging
import math
import random
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from providers import validation
from providers.clock import AsyncioScheduler, Scheduler, Timer
from providers.config import ProviderConfig
from providers.errors import (
    Fenced,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    ProviderError,
    ProviderUnavailable,
    Unimplemented,
)
from providers.model import (
    HOSTLESS_STATES,
    TRANSITIONAL_STATES,
    Ack,
    CapacityType,
    FencingToken,
    HostRef,
    Machine,
    MachineList,
    Operation,
    State,
    frozen_map,
)
from providers.store import Document, StateStore

log = logging.getLogger(__name__)

_CURSOR_PREFIX = b"bfrev1:"


@dataclass(slots=True)
class MachineRecord:
    """The provider's mutable record of one machine.

    ``host`` is the substrate's host for the machine (an instance reserved at
    Create, a server's serial); callers see it only outside SPECULATIVE and
    CREATING. ``attrs`` holds substrate facts (account, region, rack) that
    must survive a restart but are not on the wire.
    """

    id: str
    state: State
    instance_type: str
    zone: str
    capacity_type: CapacityType
    price_per_hour: float
    interruption_probability: float
    resources: dict[str, str]
    allocatable: dict[str, str]
    labels: dict[str, str]
    attrs: dict[str, str] = field(default_factory=dict)
    host: HostRef | None = None
    cluster: str = ""
    shard_metadata: dict[str, str] = field(default_factory=dict)
    last_error: str = ""
    operation: Operation | None = None
    operation_id: str = ""
    revision: int = 0
    #: The grace period (simulated seconds) the drain in flight honours; None
    #: outside a drain. Lowered, never raised, by a repeated Drain.
    drain_grace: int | None = None

    def snapshot(self) -> Machine:
        """The caller-visible, immutable view."""
        return Machine(
            id=self.id,
            state=self.state,
            host=None if self.state in HOSTLESS_STATES else self.host,
            instance_type=self.instance_type,
            zone=self.zone,
            capacity_type=self.capacity_type,
            price_per_hour=self.price_per_hour,
            interruption_probability=self.interruption_probability,
            resources=frozen_map(self.resources),
            allocatable=frozen_map(self.allocatable),
            labels=frozen_map(self.labels),
            last_error=self.last_error,
            cluster=self.cluster,
            shard_metadata=frozen_map(self.shard_metadata),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for the state store."""
        return {
            "id": self.id,
            "state": self.state.name,
            "instance_type": self.instance_type,
            "zone": self.zone,
            "capacity_type": self.capacity_type.label,
            "price_per_hour": self.price_per_hour,
            "interruption_probability": self.interruption_probability,
            "resources": self.resources,
            "allocatable": self.allocatable,
            "labels": self.labels,
            "attrs": self.attrs,
            "host": None if self.host is None else [self.host.provider, self.host.ref],
            "cluster": self.cluster,
            "shard_metadata": self.shard_metadata,
            "last_error": self.last_error,
            "operation": None if self.operation is None else self.operation.value,
            "operation_id": self.operation_id,
            "revision": self.revision,
            "drain_grace": self.drain_grace,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> MachineRecord:
        """Inverse of `to_json`."""
        host = raw.get("host")
        operation = raw.get("operation")
        return cls(
            id=raw["id"],
            state=State[raw["state"]],
            instance_type=raw["instance_type"],
            zone=raw["zone"],
            capacity_type=CapacityType.from_label(raw["capacity_type"]),
            price_per_hour=float(raw["price_per_hour"]),
            interruption_probability=float(raw["interruption_probability"]),
            resources=dict(raw["resources"]),
            allocatable=dict(raw["allocatable"]),
            labels=dict(raw["labels"]),
            attrs=dict(raw.get("attrs", {})),
            host=None if host is None else HostRef(host[0], host[1]),
            cluster=raw.get("cluster", ""),
            shard_metadata=dict(raw.get("shard_metadata", {})),
            last_error=raw.get("last_error", ""),
            operation=None if operation is None else Operation(operation),
            operation_id=raw.get("operation_id", ""),
            revision=int(raw.get("revision", 0)),
            drain_grace=None if raw.get("drain_grace") is None else int(raw["drain_grace"]),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """What a transition will do, in simulated seconds from acceptance.

    ``delay`` None means it never finishes by itself (it will hit its
    deadline). ``error`` set means it finishes by failing with that reason.
    """

    delay: float | None
    error: str | None = None
    #: The substrate finishes the transition itself (a real cloud reporting
    #: back): no completion timer is armed; the substrate's
    #: ``_start_external`` runs instead and later calls ``_complete``. Fault
    #: injection replaces such a plan like any other, and then nothing external
    #: starts.
    external: bool = False


@dataclass(frozen=True, slots=True)
class _PendingCompletion:
    """A completion timer that is armed: which operation, when it fires (on
    the scheduler's clock) and with what outcome. Kept so a shorter grace can
    move it earlier; never persisted, since a restart fails the transition."""

    operation_id: str
    due: float
    error: str | None


class ProviderCore:
    """The shared state machine, fencing, idempotency, metadata and List
    logic of a simulated capacity provider. See the module docstring.

    Construct a substrate subclass, call `start` on the loop that will serve
    it, and `close` when done. Public methods are the provider contract in
    domain types; each raises only the `providers.errors` vocabulary.

    ``stats`` counts what happened, for tests and inspection: ``fenced``,
    ``idempotent_retries``, ``deadlines_missed``,
    ``late_completions_discarded``, ``interrupted_by_restart``,
    ``failed_cleaned_up``, ``injected_{error,stuck,late}:<op>``, and the
    substrates' own (``spot_interruptions``, ``launches_queued_by_rate_limit``,
    ``racks_commissioned``).
    """

    kind: ClassVar[str] = ""
    #: Whether Delete is offered at all (bare metal: no).
    supports_delete: ClassVar[bool] = True

    def __init__(self, config: ProviderConfig, *, scheduler: Scheduler | None = None) -> None:
        if config.kind != self.kind:
            raise ValueError(f"{type(self).__name__} needs kind {self.kind!r}, got {config.kind!r}")
        self.config = config
        self.name = config.name
        self.stats: collections.Counter[str] = collections.Counter()
        self._scheduler: Scheduler = scheduler or AsyncioScheduler()
        self._rng = random.Random(config.seed)
        self._machines: dict[str, MachineRecord] = {}
        self._fences: dict[tuple[str, str], tuple[int, int]] = {}
        self._revision = 0
        self._operations = 0
        self._lineage = ""
        self._timers: dict[tuple[str, str], Timer] = {}
        self._completions: dict[str, _PendingCompletion] = {}
        self._deferred: list[tuple[tuple[str, str], float, Callable[[], None]]] = []
        self._started = False
        self._closed = False
        self._dirty_machines: set[str] = set()
        self._dirty_fences: set[tuple[str, str]] = set()
        self._meta_dirty = False
        self._store: StateStore | None = None
        if config.state_path is not None:
            self._store = StateStore(config.state_path, fsync=config.fsync)
        doc = self._store.load() if self._store is not None else None
        if doc is None:
            self._lineage = random_lineage()
            for record in self._build_inventory():
                if record.id in self._machines:
                    raise ValueError(f"duplicate machine id {record.id!r} in inventory")
                self._machines[record.id] = record
                self._touch(record)
        else:
            self._restore(doc)
        if self._store is not None:
            self._store.save(self._document())
        self._dirty_machines.clear()
        self._dirty_fences.clear()
        self._meta_dirty = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Arm the background timers (spot interruptions, rack commissioning,
        FAILED clean-ups, and any timer requested before the start). Call
        once, on the loop that will run the provider; later calls do nothing."""
        if self._started:
            return
        self._started = True
        self._on_start()
        deferred, self._deferred = self._deferred, []
        for key, delay, callback in deferred:
            self._arm_key(key, delay, callback)

    def close(self) -> None:
        """Cancel every timer and write a final snapshot. The provider answers
        no further calls."""
        if self._closed:
            return
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._store is not None:
            self._store.save(self._document())
            self._store.close()

    @property
    def scheduler(self) -> Scheduler:
        """The clock and timer source this provider runs on."""
        return self._scheduler

    @property
    def now(self) -> float:
        """The scheduler's current time (real seconds, not simulated)."""
        return self._scheduler.now()

    # ------------------------------------------------------------------ contract

    def create(self, machine_id: str, token: FencingToken | None = None) -> Ack:
        """SPECULATIVE -> CREATING -> IDLE: obtain a real host for a slot.

        Raises InvalidArgument, Fenced, NotFound, InvalidTransition. A retry
        while CREATING or once IDLE returns the same operation id.
        """
        return self._mutate(Operation.CREATE, machine_id, token)

    def configure(
        self,
        machine_id: str,
        cluster_id: str,
        bootstrap_blob: bytes = b"",
        token: FencingToken | None = None,
        shard_metadata: Mapping[str, str] | None = None,
    ) -> Ack:
        """IDLE -> CONFIGURING -> CONFIGURED: join ``cluster_id``.

        ``cluster`` and ``shard_metadata`` are recorded at acceptance and
        echoed verbatim until a drain completes. A retry for the same cluster
        returns the same operation id (the first metadata stays); a Configure
        for a different cluster while configuring or configured is an
        InvalidTransition. Raises InvalidArgument, Fenced, NotFound,
        InvalidTransition.
        """
        validation.cluster_id(cluster_id)
        validation.bootstrap_blob(bootstrap_blob)
        metadata = validation.shard_metadata(shard_metadata or {})
        return self._mutate(
            Operation.CONFIGURE, machine_id, token, cluster=cluster_id, metadata=metadata
        )

    def drain(
        self, machine_id: str, grace_seconds: int = 0, token: FencingToken | None = None
    ) -> Ack:
        """CONFIGURED -> DRAINING -> IDLE: workloads leave within the grace
        period (then are forced); cluster and metadata clear on completion.

        A Drain for a machine already DRAINING returns the drain in flight's
        operation id; if its grace is smaller than the one in flight, the
        drain is shortened to finish no later than ``grace_seconds`` from now
        (a larger or equal grace changes nothing).

        Raises InvalidArgument (negative grace), Fenced, NotFound,
        InvalidTransition.
        """
        validation.grace_seconds(grace_seconds)
        return self._mutate(Operation.DRAIN, machine_id, token, grace=grace_seconds)

    def delete(self, machine_id: str, token: FencingToken | None = None) -> Ack:
        """IDLE -> DELETING -> SPECULATIVE: release the host, keep the slot.

        Raises Unimplemented where the provider has no Delete, whatever the
        arguments (nothing is checked or recorded, not even the fencing
        token); otherwise InvalidArgument, Fenced, NotFound, InvalidTransition.
        """
        return self._mutate(Operation.DELETE, machine_id, token)

    def get(self, machine_id: str) -> Machine:
        """The machine now. Raises InvalidArgument (empty id), NotFound."""
        validation.machine_id(machine_id)
        self._check_open()
        record = self._machines.get(machine_id)
        if record is None:
            raise NotFound(f"no machine {machine_id!r} at provider {self.name!r}")
        return record.snapshot()

    def list(
        self,
        states: Iterable[State | int] = (),
        max_results: int = 0,
        since_revision: bytes = b"",
    ) -> MachineList:
        """Machines in ``states`` (all if empty), oldest change first.

        With a ``since_revision`` cursor from an earlier answer, only machines
        changed after it; a cursor this provider did not issue (garbage, or
        from before its state was lost) gives the full list. When
        ``max_results`` cuts the answer short, the returned cursor points just
        after the last machine returned, so passing it back continues the
        listing. Raises InvalidArgument (unknown state, negative max_results).
        """
        wanted = validation.states(int(s) for s in states)
        validation.max_results(max_results)
        self._check_open()
        since = self._parse_cursor(since_revision)
        records = [
            r
            for r in self._machines.values()
            if (since is None or r.revision > since) and (not wanted or r.state in wanted)
        ]
        records.sort(key=lambda r: r.revision)
        cursor = self._revision
        if max_results and len(records) > max_results:
            records = records[:max_results]
            cursor = records[-1].revision
        return MachineList(tuple(r.snapshot() for r in records), self._cursor(cursor))

    # ------------------------------------------------------------------ operator

    def clear_failed(self, machine_id: str) -> Machine:
        """Operator clean-up: return a FAILED machine to SPECULATIVE, releasing
        its host. Raises NotFound, InvalidTransition (not FAILED)."""
        record = self._machines.get(machine_id)
        if record is None:
            raise NotFound(f"no machine {machine_id!r}")
        if record.state is not State.FAILED:
            raise InvalidTransition(f"machine {machine_id!r} is {record.state.name}, not FAILED")
        try:
            self._release(record)
            return record.snapshot()
        finally:
            self._commit()

    def machine_ids(self) -> builtins.list[str]:
        """Every machine id, for inspection."""
        return list(self._machines)

    # ------------------------------------------------------------------ request path

    def _mutate(
        self,
        op: Operation,
        machine_id: str,
        token: FencingToken | None,
        *,
        cluster: str = "",
        metadata: dict[str, str] | None = None,
        grace: int = 0,
    ) -> Ack:
        if op is Operation.DELETE and not self.supports_delete:
            raise Unimplemented(f"provider {self.name!r} ({self.kind}) has no Delete")
        validation.machine_id(machine_id)
        validation.token(token)
        self._check_open()
        try:
            self._check_fence(machine_id, token)
            record = self._machines.get(machine_id)
            if record is None:
                raise NotFound(f"no machine {machine_id!r} at provider {self.name!r}")
            existing = self._idempotent(record, op, cluster)
            if existing is not None:
                self.stats["idempotent_retries"] += 1
                if op is Operation.DRAIN and record.state is State.DRAINING:
                    self._shorten_drain(record, grace)
                return existing
            if record.state is State.FAILED:
                raise InvalidTransition(
                    f"machine {machine_id!r} is FAILED ({record.last_error}); it accepts no "
                    "transition until cleaned up"
                )
            if record.state is not op.source:
                raise InvalidTransition(
                    f"cannot {op.value} machine {machine_id!r} in {record.state.name}: "
                    f"{op.value} starts from {op.source.name}"
                )
            self._operations += 1
            self._meta_dirty = True
            record.operation = op
            record.operation_id = f"{self.name}-op-{self._lineage[:8]}-{self._operations:08d}"
            record.state = op.transitional
            record.last_error = ""
            if op is Operation.CREATE:
                record.host = self._mint_host(record)
            elif op is Operation.CONFIGURE:
                record.cluster = cluster
                record.shard_metadata = dict(metadata or {})
            record.drain_grace = grace if op is Operation.DRAIN else None
            self._touch(record)
            self._begin(record, op, grace)
            self._on_transition(record)
            return Ack(record.operation_id, record.snapshot())
        finally:
            self._commit()

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderUnavailable(f"provider {self.name!r} is shut down")

    def _check_fence(self, machine_id: str, token: FencingToken | None) -> None:
        """Strictly-newer check per (shard_id, machine_id); moves the mark."""
        if token is None or token.is_empty:
            return
        key = (token.shard_id, machine_id)
        mark = self._fences.get(key)
        if mark is not None and token.key() <= mark:
            self.stats["fenced"] += 1
            raise Fenced(
                f"token (epoch {token.epoch}, sequence {token.sequence}) of shard "
                f"{token.shard_id!r} is not newer than ({mark[0]}, {mark[1]}) on machine "
                f"{machine_id!r}"
            )
        self._fences[key] = token.key()
        self._dirty_fences.add(key)

    def _idempotent(self, record: MachineRecord, op: Operation, cluster: str) -> Ack | None:
        """The existing operation if one toward the same target state is under
        way or done. Keyed on the target state, not the kind of call: Create
        and Drain both target IDLE, so a Create while DRAINING answers with
        the drain's operation (the ack shows DRAINING)."""
        current = record.operation
        if current is None or current.target is not op.target:
            return None
        if record.state not in (current.transitional, current.target):
            return None
        if op is Operation.CONFIGURE and record.cluster != cluster:
            raise InvalidTransition(
                f"machine {record.id!r} is {record.state.name} for cluster {record.cluster!r}, "
                f"not {cluster!r}; drain it first"
            )
        return Ack(record.operation_id, record.snapshot())

    # ------------------------------------------------------------------ transitions

    def _begin(self, record: MachineRecord, op: Operation, grace: int) -> None:
        deadline = self._deadline(record, op, grace)
        plan = self._inject_faults(op, self._plan(record, op, grace), deadline)
        if plan.external:
            self._start_external(record, op)
        elif plan.delay is not None:
            self._arm_completion(record, plan.delay, plan.error)
        operation_id = record.operation_id
        self._arm(record.id, "deadline", deadline, lambda: self._expire(record.id, operation_id))

    def _arm_completion(self, record: MachineRecord, sim_seconds: float, error: str | None) -> None:
        """Arm (or re-arm) the completion of the record's current operation,
        remembering when it is due."""
        machine_id = record.id
        operation_id = record.operation_id
        due = self.now + sim_seconds * self.config.time_factor
        self._completions[machine_id] = _PendingCompletion(operation_id, due, error)
        self._arm(
            machine_id,
            f"complete:{operation_id}",
            sim_seconds,
            lambda: self._complete(machine_id, operation_id, error),
        )

    def _shorten_drain(self, record: MachineRecord, grace: int) -> None:
        """A repeated Drain with a smaller grace: lower the grace in flight and
        bring the completion forward to no later than ``grace`` simulated
        seconds from now. The outcome (success, or an injected failure) and
        the deadline stay; a stuck drain, which has no completion, stays
        stuck. A larger or equal grace changes nothing."""
        if record.drain_grace is not None and grace >= record.drain_grace:
            return
        record.drain_grace = grace
        self._dirty_machines.add(record.id)
        self.stats["drains_shortened"] += 1
        pending = self._completions.get(record.id)
        if pending is None or pending.operation_id != record.operation_id:
            return
        if self.now + grace * self.config.time_factor < pending.due:
            self._arm_completion(record, float(grace), pending.error)

    def _inject_faults(self, op: Operation, plan: Plan, deadline: float) -> Plan:
        """Apply the configured error, stuck and late-completion rates."""
        name = op.value
        draw = self._rng.random()
        error_p = self.config.error_rate.get(name, 0.0)
        stuck_p = self.config.stuck_rate.get(name, 0.0)
        late_p = self.config.late_rate.get(name, 0.0)
        if draw < error_p:
            self.stats[f"injected_error:{name}"] += 1
            delay = (plan.delay if plan.delay is not None else deadline) * self._rng.uniform(0.1, 1)
            return Plan(min(delay, deadline * 0.9), self._failure_reason(op))
        if draw < error_p + stuck_p:
            self.stats[f"injected_stuck:{name}"] += 1
            return Plan(None)
        if draw < error_p + stuck_p + late_p:
            self.stats[f"injected_late:{name}"] += 1
            return Plan(deadline * self._rng.uniform(1.05, 1.5))
        return plan

    def _complete(self, machine_id: str, operation_id: str, error: str | None) -> None:
        pending = self._completions.get(machine_id)
        if pending is not None and pending.operation_id == operation_id:
            del self._completions[machine_id]
        record = self._machines.get(machine_id)
        if (
            record is None
            or record.operation_id != operation_id
            or record.operation is None
            or record.state is not record.operation.transitional
        ):
            self.stats["late_completions_discarded"] += 1
            log.info("discarding late completion of %s on %s", operation_id, machine_id)
            return
        try:
            self._disarm(machine_id, "deadline")
            op = record.operation
            if error is not None:
                self._fail(record, f"{op.value} failed: {error}")
                return
            record.state = op.target
            if op is Operation.DRAIN:
                record.cluster = ""
                record.shard_metadata = {}
                record.drain_grace = None
            elif op is Operation.DELETE:
                self._on_host_released(record)
            self._touch(record)
            self._on_transition(record)
        finally:
            self._commit()

    def _expire(self, machine_id: str, operation_id: str) -> None:
        record = self._machines.get(machine_id)
        if record is None or record.operation_id != operation_id or record.operation is None:
            return
        if record.state is not record.operation.transitional:
            return
        try:
            self.stats["deadlines_missed"] += 1
            op = record.operation
            what = f" for cluster {record.cluster!r}" if op is Operation.CONFIGURE else ""
            self._fail(record, f"{op.value}{what} did not complete before its deadline")
        finally:
            self._commit()

    def _fail(self, record: MachineRecord, reason: str) -> None:
        """Move to FAILED: terminal until cleaned up, binding cleared, reason kept."""
        record.state = State.FAILED
        record.last_error = reason
        record.cluster = ""
        record.shard_metadata = {}
        record.drain_grace = None
        self._completions.pop(record.id, None)
        self._disarm(record.id, "deadline")
        self._touch(record)
        self._on_transition(record)
        self._arm_cleanup(record)

    def _arm_cleanup(self, record: MachineRecord) -> None:
        if self.config.failed_cleanup_s is None:
            return
        failed_revision = record.revision

        def cleanup() -> None:
            current = self._machines.get(record.id)
            if current is None or current.state is not State.FAILED:
                return
            if current.revision != failed_revision:
                return
            try:
                self.stats["failed_cleaned_up"] += 1
                self._release(current)
            finally:
                self._commit()

        self._arm(record.id, "cleanup", self.config.failed_cleanup_s, cleanup)

    def _release(self, record: MachineRecord) -> None:
        """FAILED -> SPECULATIVE, host given back."""
        record.state = State.SPECULATIVE
        record.last_error = ""
        record.cluster = ""
        record.shard_metadata = {}
        record.operation = None
        record.operation_id = ""
        self._disarm(record.id, "cleanup")
        self._on_host_released(record)
        self._touch(record)
        self._on_transition(record)

    # ------------------------------------------------------------------ timers

    def _arm(
        self, machine_id: str, purpose: str, sim_seconds: float, fn: Callable[[], None]
    ) -> None:
        """Run ``fn`` after ``sim_seconds`` of simulated time (scaled by
        time_factor), replacing any timer with the same purpose."""
        self._arm_key((machine_id, purpose), sim_seconds * self.config.time_factor, fn)

    def _arm_key(self, key: tuple[str, str], delay: float, fn: Callable[[], None]) -> None:
        if self._closed:
            return
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        if not self._started:
            self._deferred = [d for d in self._deferred if d[0] != key]
            self._deferred.append((key, delay, fn))
            return

        def fire() -> None:
            if self._timers.get(key) is timer:
                del self._timers[key]
            if self._closed:
                return
            fn()

        timer = self._scheduler.call_later(delay, fire)
        self._timers[key] = timer

    def _disarm(self, machine_id: str, purpose: str) -> None:
        key = (machine_id, purpose)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._deferred = [d for d in self._deferred if d[0] != key]

    def _armed(self, machine_id: str, purpose: str) -> bool:
        key = (machine_id, purpose)
        return key in self._timers or any(d[0] == key for d in self._deferred)

    # ------------------------------------------------------------------ revisions & cursors

    def _touch(self, record: MachineRecord) -> None:
        self._revision += 1
        record.revision = self._revision
        self._dirty_machines.add(record.id)
        self._meta_dirty = True

    def _cursor(self, revision: int) -> bytes:
        return _CURSOR_PREFIX + f"{self._lineage}:{revision}".encode()

    def _parse_cursor(self, raw: bytes) -> int | None:
        """The revision a cursor names, or None when it is not one of ours."""
        if not raw.startswith(_CURSOR_PREFIX):
            return None
        try:
            lineage, revision_text = raw[len(_CURSOR_PREFIX) :].decode().split(":")
            revision = int(revision_text)
        except (UnicodeDecodeError, ValueError):
            return None
        if lineage != self._lineage or not 0 <= revision <= self._revision:
            return None
        return revision

    # ------------------------------------------------------------------ persistence

    def _commit(self) -> None:
        """Journal whatever this request or event changed."""
        if self._store is None or not (
            self._dirty_machines or self._dirty_fences or self._meta_dirty
        ):
            self._dirty_machines.clear()
            self._dirty_fences.clear()
            self._meta_dirty = False
            return
        delta: Document = {"meta": self._meta()}
        if self._dirty_machines:
            delta["machines"] = [self._machines[m].to_json() for m in sorted(self._dirty_machines)]
        if self._dirty_fences:
            delta["fences"] = [[s, m, *self._fences[(s, m)]] for s, m in self._dirty_fences]
        self._dirty_machines.clear()
        self._dirty_fences.clear()
        self._meta_dirty = False
        self._store.append(delta)
        if self._store.needs_compaction:
            self._store.save(self._document())

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "lineage": self._lineage,
            "revision": self._revision,
            "operations": self._operations,
            "substrate": self._substrate_state(),
        }

    def _document(self) -> Document:
        return {
            "meta": self._meta(),
            "machines": {m.id: m.to_json() for m in self._machines.values()},
            "fences": [[s, m, e, q] for (s, m), (e, q) in self._fences.items()],
        }

    def _restore(self, doc: Document) -> None:
        meta = doc["meta"]
        if meta.get("kind") != self.kind or meta.get("name") != self.name:
            raise ValueError(
                f"state at {self.config.state_path} belongs to {meta.get('kind')} provider "
                f"{meta.get('name')!r}, not {self.kind} provider {self.name!r}"
            )
        self._lineage = str(meta["lineage"])
        self._revision = int(meta["revision"])
        self._operations = int(meta["operations"])
        for raw in doc["machines"].values():
            record = MachineRecord.from_json(raw)
            self._machines[record.id] = record
        for shard_id, machine_id, epoch, sequence in doc["fences"]:
            self._fences[(shard_id, machine_id)] = (int(epoch), int(sequence))
        self._restore_substrate(meta.get("substrate", {}))
        for record in self._machines.values():
            if record.state in TRANSITIONAL_STATES:
                op = record.operation.value if record.operation else "transition"
                self.stats["interrupted_by_restart"] += 1
                self._fail(
                    record,
                    f"{op} interrupted by a provider restart while {record.state.name}; "
                    "its outcome is unknown",
                )
            elif record.state is State.FAILED:
                self._arm_cleanup(record)
            else:
                self._on_transition(record)

    # ------------------------------------------------------------------ substrate hooks

    def _build_inventory(self) -> builtins.list[MachineRecord]:
        """The initial machines of a fresh provider."""
        raise NotImplementedError

    def _plan(self, record: MachineRecord, op: Operation, grace: int) -> Plan:
        """How ``op`` on ``record`` will go, before fault injection."""
        raise NotImplementedError

    def _deadline(self, record: MachineRecord, op: Operation, grace: int) -> float:
        """Simulated seconds ``op`` may take before the machine goes FAILED."""
        base = self.config.deadline(op.value, record.capacity_type.label)
        return base + grace if op is Operation.DRAIN else base

    def _mint_host(self, record: MachineRecord) -> HostRef:
        """The host a Create obtains."""
        raise NotImplementedError

    def _start_external(self, record: MachineRecord, op: Operation) -> None:
        """Begin a transition whose plan is ``external``: the substrate calls
        ``_complete(machine_id, operation_id, error)`` when it is done (a late
        call is discarded like any late completion)."""
        raise NotImplementedError

    def _failure_reason(self, op: Operation) -> str:
        """The provider error an injected failure of ``op`` reports."""
        return f"injected {op.value} failure"

    def _on_host_released(self, record: MachineRecord) -> None:
        """The machine went back to SPECULATIVE (delete or clean-up)."""

    def _on_transition(self, record: MachineRecord) -> None:
        """Called after every state change and for every machine at restart."""

    def _on_start(self) -> None:
        """Called once by `start`, before deferred timers are armed."""

    def _substrate_state(self) -> dict[str, Any]:
        """Extra substrate state to persist in the document's meta."""
        return {}

    def _restore_substrate(self, state: Mapping[str, Any]) -> None:
        """Inverse of `_substrate_state`."""

    # ------------------------------------------------------------------ helpers for substrates

    def _uniform(self, low: float, high: float) -> float:
        return low if high <= low else self._rng.uniform(low, high)

    def _exponential(self, rate_per_second: float) -> float:
        """A sample of an exponential waiting time (inf for a zero rate)."""
        if rate_per_second <= 0:
            return math.inf
        return self._rng.expovariate(rate_per_second)

    def _new_hex(self, digits: int) -> str:
        return f"{self._rng.getrandbits(digits * 4):0{digits}x}"


def hourly_to_rate(probability_per_hour: float) -> float:
    """The Poisson rate (per second) that loses a machine with the given
    probability within one hour."""
    if probability_per_hour <= 0:
        return 0.0
    if probability_per_hour >= 1:
        return math.inf
    return -math.log1p(-probability_per_hour) / 3600.0


def random_lineage() -> str:
    """A fresh lineage id. Deliberately not drawn from the seed: a provider
    whose state was lost must never honour cursors issued before the loss."""
    return secrets.token_hex(8)


__all__ = [
    "Fenced",
    "FencingToken",
    "InvalidArgument",
    "InvalidTransition",
    "MachineRecord",
    "NotFound",
    "Plan",
    "ProviderCore",
    "ProviderError",
    "ProviderUnavailable",
    "Unimplemented",
    "hourly_to_rate",
]
