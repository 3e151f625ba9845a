"""The BigFleet policy: production's shard core and the coordinator's planner, in virtual time.

Every shard runs production's own parts, around the **real** ``ShardEngine``:

    cluster roll-up (wire) ──rollup_from_wire──▶ engine.validate ──▶ engine.apply_rollup
        (each interval, if changed)
    engine.cycle(now) ──Plan──▶ ShardCore.execute ──Operation──▶ _VirtualActuator
        ProvisionOp → Create, then Configure once IDLE          (the provider cores,
        DrainOp     → the node leaves its cluster, Drain        fenced per shard)
        DeleteOp    → Delete
        VerifyOp    → the provider's record, at once
    provider state change ──▶ ShardState.observe, or ShardState.settle once the operation ended

and for the fleet the coordinator's planner (``shard_engine.coordination.plan_transfers``)
every report interval, under the coordinator's rule that a shortfall is answered once
(``answer_key``: not while an instruction for it is in flight, nor for
``COOLDOWN_REPORT_INTERVALS`` after). Each instruction is carried out by production's
``bigfleet.shard.transfers.CrossShardTransfers`` on both shards, as the coordinator's
``TransferWorkflow`` sequences it: the donor releases (or prepares a preemption, whose
drains the virtual actuator runs, and releases the victims idle once every drain
ended), the receiver adopts. Its ports here: the ownership ledger is the policy's
owner map, a machine read is the provider core's record, the donor's choices run
where the engines live. The fleet is dealt to the shards by production's dealing
(``shard_engine.dealing``: whole racks, quota evenly).

What is the simulator's own is only the glue to virtual time: the actuator
follows each transition on the provider core (what production's workflows do
over Temporal), the engines may live in worker processes (``engines.EngineHandle``),
and the coordinator's report is read from the engines (idle and speculative from
their per-profile counters by ``supply.free_counts``, sent as what changed since
the last round and rebuilt here by ``engines.SupplyMirror``; machine by machine,
with the configured column, only in a round where some shortfall is escalated). Differences from
production, on purpose: no Temporal, no PostgreSQL (ownership lives in the
states), a roll-up equal to the one the engine last applied is not re-sent
(the engine would only move its timestamp; one that was quarantined is
re-sent, since re-sends confirm it), and nodes are not reported for health
checks.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol, assert_never

from bigfleet.attribution import META_NEED, META_PRIORITY
from bigfleet.shard.choices import CrossShardVictim, TransferProfile, VictimTerms
from bigfleet.shard.core import (
    DeleteOp,
    DrainOp,
    Operation,
    ProvisionOp,
    ShardCore,
    Started,
    VerifyOp,
    run_now,
)
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.state import ShardState, Sighting, Workload
from bigfleet.shard.supply import Held, ProfileKey, profile_key, profile_supply
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.shard.transfers import CrossShardTransfers
from providers.errors import ProviderError
from providers.model import FencingToken
from shard_engine.catalog import LABEL_RACK
from shard_engine.coordination import (
    COOLDOWN_REPORT_INTERVALS,
    Instruction,
    ProfileSupply,
    ShardShortfall,
    ShardView,
    TransferKind,
    answer_key,
    fleet_wants,
    idle_offers,
    plan_transfers,
)
from shard_engine.dealing import Dealable, deal, rack_of
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import Action, MachineRecord, MachineState, Need, Shortfall
from shard_engine.shortfalls import awaits_idle, reported_requirements
from simulator import engines as ops
from simulator.cluster import ClusterModel
from simulator.engines import (
    Applied,
    EngineHandle,
    Engines,
    LocalEngines,
    Result,
    WorkerEngines,
)
from simulator.fleet import Fleet
from workflows.contracts import MachineTarget
from workflows.coordinator_contracts import AdoptInput, ReleaseInput

__all__ = ["BigFleetOptions", "BigFleetPolicy", "CoreTap"]

log = logging.getLogger(__name__)

#: The simulated coordinator's term: one coordinator, never replaced.
_TERM = 1

_NO_WORKLOAD = Workload()


@dataclass(frozen=True, slots=True)
class BigFleetOptions:
    """Cadences of the shard process and coordinator (virtual seconds)."""

    shards: int = 2
    cycle_interval_s: float = 10.0
    rollup_interval_s: float = 10.0
    report_interval_s: float = 30.0
    #: A shard with news reports this soon after its last report (production's
    #: ``ShardOptions.early_report_gap_s``; ADR 0184); at or above the interval, never early.
    early_report_gap_s: float = 10.0
    #: The share of a shard's machines one coordinator instruction may move (both sides).
    max_instruction_share: float = 0.05
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: Worker processes holding the engines (1: in this process). Decisions do not depend on it.
    workers: int = 1


class CoreTap(Protocol):
    """Sees what each shard's core is given and what it issues (the recorded-ops golden)."""

    def plan(self, shard_id: str, now: float, actions: Sequence[Action]) -> None: ...

    def operation(self, shard_id: str, op: Operation) -> None: ...


@dataclass(slots=True)
class _Op:
    """An operation the virtual actuator is following for one machine."""

    kind: str  # provision | assign | drain | delete | handover
    cluster: str = ""
    need_key: str = ""
    priority: int = 0
    #: For a handover: the coordinator instruction (its seq) it drains for.
    instruction: int = 0


class _Shard:
    """One simulated shard: production's state and core, the virtual actuator."""

    def __init__(self, shard_id: str, policy: BigFleetPolicy) -> None:
        self.shard_id = shard_id
        self.policy = policy
        self.clusters: set[str] = set()
        self.ops: dict[str, _Op] = {}
        self.seq = 0
        self.state: ShardState[EngineHandle] = ShardState(
            EngineHandle(lambda: policy.engines, shard_id, policy.fleet.machine, self.provider_of),
            clock=lambda: policy.now,
        )
        self.core = ShardCore(self.state, _VirtualActuator(self), shard_id=shard_id)
        # Production's half of the coordinator's instructions, over the simulated ledger.
        self.transfers = CrossShardTransfers(
            _Ledger(policy),
            shard_id=shard_id,
            state=self.state,
            engine_config=policy.options.engine,
            sequences=OperationSequences(),
            reads=_Reads(self),
            choices=_Choices(self),
            core=self.core,
            terms=CoordinatorTerms(),
            max_share=policy.options.max_instruction_share,
        )

    def provider_of(self, machine_id: str) -> str | None:
        return self.state.provider_of(machine_id)

    def token(self) -> FencingToken:
        self.seq += 1
        return FencingToken(self.shard_id, 1, self.seq)


@dataclass(frozen=True, slots=True)
class _Row:
    """The simulated ledger's record of one machine (``transfers.OwnedRow``)."""

    machine_id: str
    shard_id: str
    operation_seq: int = 0


class _Ledger:
    """Ownership in virtual time (``transfers.OwnershipLedger``): the policy's owner map."""

    def __init__(self, policy: BigFleetPolicy) -> None:
        self._owner = policy.owner

    async def transfer(
        self, *, donor: str, receiver: str, machine_ids: Sequence[str], term: int, seq: int
    ) -> list[str]:
        moved = [mid for mid in machine_ids if self._owner.get(mid) == donor]
        for mid in moved:
            self._owner[mid] = receiver
        return moved

    async def machines_by_id(self, machine_ids: Sequence[str]) -> list[_Row]:
        return [_Row(mid, self._owner[mid]) for mid in machine_ids if mid in self._owner]

    async def quarantine(self, machine_id: str, shard_id: str, reason: str) -> bool:
        return self._owner.get(machine_id) == shard_id


class _Reads:
    """A machine read from its provider core (``transfers.MachineReads``)."""

    def __init__(self, shard: _Shard) -> None:
        self._policy = shard.policy

    async def read_many(self, machines: Sequence[MachineTarget]) -> list[Sighting | None]:
        return [self._read(m.provider, m.machine_id) for m in machines]

    def _read(self, provider: str, machine_id: str) -> Sighting | None:
        try:
            record = self._policy.fleet.machine(provider, machine_id)
        except KeyError:
            return None
        return Sighting(record, self._policy.echo(record))


class _Choices:
    """The donor's choices where the engines live (``choices.DonorChoices``).

    The machines the virtual actuator is following count as busy, as the
    production executor's in-flight machines do.
    """

    def __init__(self, shard: _Shard) -> None:
        self._shard = shard

    def donations(
        self, *, profile: TransferProfile, state: MachineState, count: int
    ) -> tuple[MachineRecord, ...]:
        shard = self._shard
        chosen: tuple[MachineRecord, ...] = shard.policy.engines.call(
            shard.shard_id, ops.donations, profile, state, count, frozenset(shard.ops)
        )
        return chosen

    def victims(
        self,
        *,
        profile: TransferProfile,
        below_priority: int,
        count: int,
        priorities: Mapping[str, int],
        terms: Mapping[str, VictimTerms],
        config: EngineConfig,
    ) -> list[CrossShardVictim]:
        shard = self._shard
        chosen: list[CrossShardVictim] = shard.policy.engines.call(
            shard.shard_id,
            ops.victims,
            profile,
            below_priority,
            count,
            frozenset(shard.ops),
            dict(priorities),
            dict(terms),
            config,
        )
        return chosen


class _VirtualActuator:
    """The simulator's :class:`~bigfleet.shard.core.Actuator`: the provider cores, at once."""

    acting = True

    def __init__(self, shard: _Shard) -> None:
        self._shard = shard

    async def start(self, op: Operation) -> Started:
        shard, policy = self._shard, self._shard.policy
        if policy.tap is not None:
            policy.tap.operation(shard.shard_id, op)
        match op:
            case ProvisionOp():
                kind = "provision" if op.create else "assign"
                refused = [
                    r.id
                    for r in op.machines
                    if not policy.call(
                        shard, r.id, _Op(kind, op.cluster_id, op.need_key, op.priority)
                    )
                ]
                return Started(len(op.machines) - len(refused), tuple(refused))
            case DrainOp():
                # The cluster model's eviction reasons: a preemptor waits, or nobody does.
                reason = "preempt" if op.preemptor is not None else "reclaim"
                policy.stats["preemptions" if reason == "preempt" else "reclaims"] += 1
                policy.evict(op.machine.id, op.cluster_id, reason)
                done = policy.call(shard, op.machine.id, _Op("drain"), grace=op.grace_seconds)
                return Started(1) if done else Started(refused=(op.machine.id,))
            case DeleteOp():
                policy.stats["releases"] += 1
                done = policy.call(shard, op.machine.id, _Op("delete"))
                return Started(1) if done else Started(refused=(op.machine.id,))
            case VerifyOp():
                shard.state.settle(op.machine.id, shard.state.machine(op.machine.id))
                return Started(1)
            case _:
                assert_never(op)


class BigFleetPolicy:
    """Shard cores + coordinator planner driving the fleet (see the module docstring)."""

    name = "bigfleet"

    def __init__(
        self,
        fleet: Fleet,
        clusters: Mapping[str, ClusterModel],
        options: BigFleetOptions,
        *,
        tap: CoreTap | None = None,
    ) -> None:
        self.fleet = fleet
        self.tap = tap
        self.clusters = clusters
        self.options = options
        self.shards: dict[str, _Shard] = {}
        self.engines: Engines = LocalEngines({})
        self.now = 0.0
        self.owner: dict[str, str] = {}  # machine -> shard (routes provider changes)
        self.cluster_shard: dict[str, str] = {}
        self.state_of: dict[str, MachineState] = {}
        self.profile_of: dict[str, ProfileKey] = {}
        self.profiles: dict[ProfileKey, MachineRecord] = {}
        self.stats: Counter[str] = Counter()
        self._applied: dict[str, bytes] = {}  # cluster -> its last applied roll-up, timestamp 0
        self._instructions = 0  # the coordinator's instruction sequence
        # A cross-shard preemption's instruction -> the victims whose drain has not ended.
        self._preempting: dict[int, tuple[ReleaseInput, set[str]]] = {}
        # The coordinator's rule (its workflow's pending instructions and cooldown): a
        # shortfall with an instruction in flight, or whose instruction ended less than
        # COOLDOWN_REPORT_INTERVALS report intervals ago, is not answered again.
        self._answering: Counter[str] = Counter()
        self._cooldown: dict[str, float] = {}
        #: Per shard, its free supply as the last round's changes left it.
        self._free: dict[str, ops.SupplyMirror] = defaultdict(ops.SupplyMirror)
        self._next_cycle = 0.0
        self._next_rollup = 0.0
        self._next_report = options.report_interval_s
        self._reports_early = options.early_report_gap_s < options.report_interval_s

    # -- set-up -----------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Create the shards and deal the fleet to them (production's dealing)."""
        self.now = now
        ids = [f"shard-{i:02d}" for i in range(self.options.shards)]
        records = list(self.fleet.records())
        per_shard = len(records) // max(1, len(ids)) + 1
        for sid in ids:
            self.shards[sid] = _Shard(sid, self)
        by_id = {r.id: r for r in records}
        dealt = deal([_dealable(r) for r in records], ids)
        loads: dict[str, list[MachineRecord]] = {}
        for sid in ids:
            shard = self.shards[sid]
            loads[sid] = [by_id[mid] for mid in dealt.machines_of(sid)]
            for record in loads[sid]:
                shard.state.hold(record.id, record.provider)
                self.owner[record.id] = sid
                self._track(record)
        load = partial(_load_engines, self.options.engine, per_shard, loads, now)
        if self.options.workers > 1:
            self.engines = WorkerEngines(ids, load, workers=self.options.workers)
        else:
            self.engines = LocalEngines(load(ids))

    def close(self) -> None:
        """Stop the engines' workers (if any); again is a no-op."""
        self.engines.close()

    def worker_cpu_seconds(self) -> float:
        """CPU time the engines' worker processes used so far (0 without workers)."""
        return self.engines.cpu_seconds()

    def _track(self, record: MachineRecord) -> None:
        self.state_of[record.id] = record.state
        key = profile_key(record)
        self.profile_of[record.id] = key
        self.profiles.setdefault(key, record)

    def _shard_for(self, cluster_id: str) -> _Shard:
        sid = self.cluster_shard.get(cluster_id)
        if sid is None:  # least-loaded on first contact, permanently
            sid = min(self.shards, key=lambda s: (len(self.shards[s].clusters), s))
            self.cluster_shard[cluster_id] = sid
            self.shards[sid].clusters.add(cluster_id)
        return self.shards[sid]

    # -- the periodic work --------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Roll-ups, cycles and the coordinator, each on its own cadence."""
        self.now = now
        if now >= self._next_rollup:
            self._next_rollup = now + self.options.rollup_interval_s
            self._send_rollups(now)
        news = False
        if now >= self._next_cycle:
            self._next_cycle = now + self.options.cycle_interval_s
            plans = self.engines.call_each(self.shards, ops.cycle, now)
            for shard, actions in zip(self.shards.values(), plans, strict=True):
                if self.tap is not None:
                    self.tap.plan(shard.shard_id, now, actions)
                run_now(shard.core.execute(actions))
            # A shard whose cycle found news for the coordinator reports now, and the
            # coordinator plans a round on it (ADR 0184).
            news = self._reports_early and any(
                list(  # every shard answers (a worker's answers are read in order)
                    self.engines.call_each(
                        self.shards, ops.report_due, now, self.options.early_report_gap_s
                    )
                )
            )
        if news or now >= self._next_report:
            self._next_report = now + self.options.report_interval_s
            self._coordinate(now)

    def _send_rollups(self, now: float) -> None:
        for cluster_id, cluster in self.clusters.items():
            cluster.advance(now)
            if not cluster.dirty:
                continue
            msg = cluster.rollup(0)
            body = msg.SerializeToString(deterministic=True)
            if self._applied.get(cluster_id) == body:
                # The same needs and named release as the roll-up the engine last applied:
                # applying it again would only move its timestamp (``NeedsTable.apply``'s
                # unchanged path), so it is not converted and not sent.
                self.stats["rollups_unchanged"] += 1
                continue
            shard = self._shard_for(cluster_id)
            self.engines.post(
                shard.shard_id,
                ops.apply_wire,
                body,
                cluster_id,
                int(now * 1e9) + 1,
                now,
                then=partial(self._rollup_applied, cluster_id, body),
            )

    def _rollup_applied(self, cluster_id: str, body: bytes, result: Result) -> None:
        """The engine's answer to a roll-up (before the next engine call returns)."""
        applied: Applied = result.value
        if applied.status == "rejected":
            self.stats["rollups_rejected"] += 1
            log.warning("cluster %s: roll-up refused: %s", cluster_id, applied.reason)
            self._applied.pop(cluster_id, None)
            return
        self.stats["rollups"] += 1
        # A quarantined roll-up waits for confirmations: re-sends of it must reach the engine.
        if applied.status == "applied":
            self._applied[cluster_id] = body
        else:
            self._applied.pop(cluster_id, None)

    # -- the virtual actuator's provider calls ---------------------------------------------
    def evict(self, mid: str, cluster_id: str, reason: str) -> None:
        """The operator cordons the node and evicts its pods when told to drain it."""
        cluster = self.clusters.get(cluster_id)
        if cluster is not None:
            cluster.remove_node(mid, self.now, reason=reason)

    def call(self, shard: _Shard, mid: str, op: _Op, *, grace: int = 0) -> bool:
        """Start ``op`` on the machine's provider core; False if the core refused it."""
        provider = shard.provider_of(mid)
        if provider is None:
            return False
        core = self.fleet.providers[provider]
        shard.ops[mid] = op
        try:
            if op.kind == "provision":
                core.create(mid, shard.token())
            elif op.kind == "assign":
                self._configure(shard, mid, op)
            elif op.kind in ("drain", "handover"):
                core.drain(mid, grace, shard.token())
            elif op.kind == "delete":
                core.delete(mid, shard.token())
        except ProviderError as err:
            # The executor's rule: an action that cannot start gives its machine back.
            self.stats[f"refused:{type(err).__name__}"] += 1
            shard.ops.pop(mid, None)
            return False
        return True

    def _configure(self, shard: _Shard, mid: str, op: _Op) -> None:
        provider = shard.provider_of(mid)
        assert provider is not None
        metadata = {META_NEED: op.need_key, META_PRIORITY: str(op.priority)}
        self.fleet.providers[provider].configure(mid, op.cluster, b"", shard.token(), metadata)

    def echo(self, record: MachineRecord) -> Workload:
        """What the provider echoes of the machine's workload (production's read-back)."""
        echo = self.fleet.echo(record.provider, record.id)
        if not echo:
            return _NO_WORKLOAD  # idle, speculative, failed: most changes echo nothing
        raw = echo.get(META_PRIORITY, "")
        return Workload(
            priority=int(raw) if raw.lstrip("-").isdigit() else None,
            need_key=echo.get(META_NEED, ""),
        )

    # -- observing the providers ------------------------------------------------------------
    def on_changes(self, changes: list[tuple[str, str]], now: float) -> None:
        """Fold provider state changes into the shards (the observe + record steps)."""
        self.now = now
        seen: set[str] = set()
        for provider, mid in changes:
            if mid in seen:
                continue
            seen.add(mid)
            sid = self.owner.get(mid)
            if sid is None:
                continue
            shard = self.shards[sid]
            record = self.fleet.machine(provider, mid)
            self.state_of[mid] = record.state
            if record.state.transitional:
                continue
            op = shard.ops.get(mid)
            if op is None:
                self._observed(shard, record, now)
            else:
                self._progress(shard, record, op, now)

    def _observed(self, shard: _Shard, record: MachineRecord, now: float) -> None:
        """A change nobody asked for: a spot interruption, a clean-up back to SPECULATIVE."""
        if record.state is MachineState.FAILED:
            self.stats["interruptions"] += 1
            for cluster in self.clusters.values():
                if cluster.has_node(record.id):
                    cluster.remove_node(record.id, now, reason="interrupt")
        shard.state.observe(record, self.echo(record))

    def _progress(self, shard: _Shard, record: MachineRecord, op: _Op, now: float) -> None:
        """The machine's operation moved on: follow it as production's workflows do."""
        mid = record.id
        state = record.state
        if op.kind == "provision" and state is MachineState.IDLE:
            shard.state.observe(record, self.echo(record))
            op.kind = "assign"
            try:
                self._configure(shard, mid, op)
            except ProviderError:
                shard.ops.pop(mid, None)
                shard.state.settle(mid, shard.state.machine(mid))
            return
        if op.kind == "handover":
            shard.ops.pop(mid, None)
            self._drained(op.instruction, mid)
            return
        shard.ops.pop(mid, None)
        shard.state.settle(mid, record, workload=self.echo(record))
        if state is MachineState.CONFIGURED and op.kind in ("assign", "provision"):
            cluster = self.clusters.get(record.cluster)
            if cluster is not None:
                cluster.add_node(mid, record.allocatable, record.labels, now)

    # -- the coordinator ----------------------------------------------------------------------
    def _coordinate(self, now: float) -> None:
        """One coordinator round: plan transfers for the shortfalls, then hand out idle offers.

        Every round, whether or not anything is lacking, each shard is told
        the idle machines the other shards hold (``idle_offers``, less what
        this round's transfers take), as production's coordinator round does.
        The configured column (what a preemption could take) is counted machine
        by machine, so only in a round where some shortfall is escalated;
        otherwise the supply comes from the engines' per-profile counters.
        """
        self._cooldown = {k: until for k, until in self._cooldown.items() if until > now}
        if self._reports_early:
            for sid in self.shards:
                self.engines.post(sid, ops.report_sent, now, self.options.early_report_gap_s)
        # Every shortfall as the shards report it, and those not being answered.
        reported = {
            sid: self._shortfalls(shortfalls)
            for sid, shortfalls in zip(
                self.shards, self.engines.call_each(self.shards, ops.lacking), strict=True
            )
        }
        lacking = {
            sid: tuple(
                sf
                for sf in shortfalls
                if not self._answered(answer_key(sid, sf.cluster_id, sf.need_key))
            )
            for sid, shortfalls in reported.items()
        }
        if any(sf.escalated for shortfalls in lacking.values() for sf in shortfalls):
            busy = self.engines.call_each(self.shards, ops.busy)
            supplies = [
                self._supply(shard, taken)
                for shard, taken in zip(self.shards.values(), busy, strict=True)
            ]
        else:
            supplies = [
                self._free[sid].apply(changes)
                for sid, changes in zip(
                    self.shards,
                    self.engines.call_each(self.shards, ops.free_supply_changes),
                    strict=True,
                )
            ]
        views = {
            sid: self._view(shard, supply, lacking[sid])
            for (sid, shard), supply in zip(self.shards.items(), supplies, strict=True)
        }
        planned = (
            plan_transfers(views, max_share=self.options.max_instruction_share)
            if any(lacking.values())
            else []
        )
        for instruction in planned:
            self.stats[f"transfer:{instruction.kind}"] += 1
            self._transfer(instruction, now)
        # Every shortfall the shards reported is a want, answered or not: production's
        # coordinator answers its ``fleet_idle`` query from the reports themselves.
        wants = fleet_wants({sid: replace(views[sid], shortfalls=reported[sid]) for sid in views})
        for sid, offers in idle_offers(views, planned=planned).items():
            self.engines.post(sid, ops.fleet_idle, offers, wants.get(sid, ()))

    def _supply(self, shard: _Shard, busy: frozenset[str]) -> tuple[ProfileSupply, ...]:
        """Supply per profile with the configured column, machine by machine (production's rule)."""
        state = shard.state
        serving = state.priorities()  # what each serves now (ADR 0177), as production reports
        return profile_supply(
            Held(
                sample=self.profiles[self.profile_of[mid]],
                state=self.state_of[mid],
                # The mirror keeps states only: a settled machine is bound iff configured.
                bound=self.state_of[mid] is MachineState.CONFIGURED,
                priority=serving.get(mid, 0),
                busy=mid in busy or mid in shard.ops or state.is_leaving(mid),
            )
            for mid in state.owned
        )

    def _view(
        self,
        shard: _Shard,
        supply: tuple[ProfileSupply, ...],
        lacking: tuple[ShardShortfall, ...],
    ) -> ShardView:
        """What the shard reports: its supply and its shortfalls."""
        return ShardView(
            shard_id=shard.shard_id,
            total_machines=len(shard.state.owned),
            supply=supply,
            shortfalls=lacking,
        )

    @staticmethod
    def _shortfalls(
        lacking: tuple[tuple[Shortfall, Need | None], ...],
    ) -> tuple[ShardShortfall, ...]:
        """The shortfalls as the report carries them."""
        return tuple(
            ShardShortfall(
                cluster_id=sf.cluster_id,
                need_key=sf.need_key,
                priority=sf.priority,
                deficit=sf.deficit,
                requirements=reported_requirements(need.requirements, sf.domain) if need else (),
                min_unit=need.min_unit if need else {},
                age_cycles=sf.age_cycles,
                escalated=sf.escalated,
                awaiting_idle=awaits_idle(sf.reason),
            )
            for sf, need in lacking
        )

    def _transfer(self, instruction: Instruction, now: float) -> None:
        """Carry out one instruction as the coordinator's ``TransferWorkflow`` does.

        Both halves are production's ``CrossShardTransfers``: the donor releases
        (or first prepares a preemption, whose drains the virtual actuator runs),
        the receiver adopts what the ledger moved.
        """
        self._instructions += 1
        release = ReleaseInput(_TERM, self._instructions, instruction)
        self._answering[_answer_key(instruction)] += 1
        if instruction.kind is TransferKind.PREEMPT:
            self._preempt(release)
        else:
            self._release(release)

    def _answered(self, key: str) -> bool:
        return self._answering[key] > 0 or key in self._cooldown

    def _release(self, release: ReleaseInput) -> None:
        """Release, then adopt; the instruction has ended (its shortfall cools down)."""
        spec = release.spec
        donor, receiver = self.shards[spec.donor], self.shards[spec.receiver]
        released = run_now(donor.transfers.release_machines(release))
        if released.refused:
            self.stats["transfers_refused"] += 1
            log.info("instruction %d refused by %s: %s", release.seq, spec.donor, released.refused)
        if released.moved:
            adopt = AdoptInput(release.term, release.seq, released.moved)
            run_now(receiver.transfers.adopt_machines(adopt))
        self._ended(spec)

    def _ended(self, spec: Instruction) -> None:
        key = _answer_key(spec)
        self._answering[key] -= 1
        if self._answering[key] <= 0:
            del self._answering[key]
        self._cooldown[key] = self.now + COOLDOWN_REPORT_INTERVALS * self.options.report_interval_s

    def _preempt(self, release: ReleaseInput) -> None:
        """The donor prepares its victims' drains; the hand-over follows once all ended."""
        donor = self.shards[release.spec.donor]
        plan = run_now(donor.transfers.prepare_preemption(release))
        if plan.refused or not plan.drains:
            # TransferWorkflow ends here: refused, or nothing strictly lower to preempt.
            self.stats["transfers_refused"] += bool(plan.refused)
            self._ended(release.spec)
            return
        waiting: set[str] = set()
        for start in plan.drains:
            drain = start.input
            mid = drain.machine.machine_id
            self.stats["preemptions_cross_shard"] += 1
            self.evict(mid, drain.cluster_id, "preempt")
            handover = _Op("handover", instruction=release.seq)
            if self.call(donor, mid, handover, grace=drain.grace_seconds):
                waiting.add(mid)
        self._preempting[release.seq] = (release, waiting)
        if not waiting:
            self._drained(release.seq, None)

    def _drained(self, instruction: int, machine_id: str | None) -> None:
        """A victim's drain ended; after the last, the donor hands over those now idle."""
        entry = self._preempting.get(instruction)
        if entry is None:
            return
        release, waiting = entry
        waiting.discard(machine_id or "")
        if waiting:
            return
        del self._preempting[instruction]
        self._release(release)

    # -- reading --------------------------------------------------------------------------------
    def machines_by_state(self) -> Counter[str]:
        """Machines per state over every shard (for the time series)."""
        return Counter(s.name for s in self.state_of.values())


def _answer_key(spec: Instruction) -> str:
    return answer_key(spec.receiver, spec.cluster_id, spec.need_key)


def _dealable(record: MachineRecord) -> Dealable:
    """A simulated machine as ``shard_engine.dealing`` sees it (nobody owns it yet)."""
    return Dealable(
        machine_id=record.id,
        provider=record.provider,
        zone=record.zone,
        instance_type=record.instance_type,
        capacity_type=int(record.capacity_type),
        rack=rack_of(record.labels, record.zone, LABEL_RACK),
        speculative=record.state is MachineState.SPECULATIVE,
    )


def _load_engines(
    config: EngineConfig,
    per_shard: int,
    loads: Mapping[str, list[MachineRecord]],
    now: float,
    shard_ids: Sequence[str],
) -> dict[str, ShardEngine]:
    """Each shard's engine with its share of the fleet (run where the engines live)."""
    engines = {}
    for sid in shard_ids:
        engine = ShardEngine(replace(config, expected_machines=per_shard))
        for record in loads[sid]:
            engine.upsert_machine(record, now=now)
        engines[sid] = engine
    return engines
