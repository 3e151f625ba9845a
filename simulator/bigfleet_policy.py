"""The BigFleet policy: real shard engines and the coordinator's planner, in virtual time.

For every shard the simulator plays the shard process, its executor and the
activities, around the **real** ``shard_engine.engine.ShardEngine``:

    cluster roll-up (wire) ──rollup_from_wire──▶ engine.apply_rollup  (each interval, if changed)
    engine.cycle(now) ──Plan──▶ provider core calls, fenced per shard (every cycle interval)
        Provision  → Create, then Configure once IDLE
        AssignIdle → Configure
        Preempt / Reclaim → the node leaves its cluster (cordon, evict), Drain with the grace
        Release    → Delete
    provider state change ──▶ engine.upsert_machine, or engine.settle once the operation ended

and for the fleet the coordinator's planner, ``shard_engine.coordination.plan_transfers``,
every report interval, over each shard's supply and shortfalls: idle and
speculative machines move between engines (bookkeeping); a cross-shard
preemption drains the donor's victims and hands them to the receiver once
idle, as ``bigfleet/shard/process.py`` does; which machines a donor gives is
chosen by the pure functions of ``shard_engine.transfers``, as there.

Nothing here decides what the engine or the planner would decide; it only
carries the decisions out after the providers' simulated latency and reports
back, like production. Differences from production, on purpose: no Temporal
(transitions are followed directly on the provider core), no PostgreSQL
(ownership lives in memory), a roll-up equal to the one the engine last
applied is not re-sent (the engine would only move its timestamp; one that
was quarantined is re-sent, since re-sends confirm it), and nodes are not
reported for health checks.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from providers.errors import ProviderError
from providers.model import FencingToken
from shard_engine.catalog import LABEL_RACK
from shard_engine.coordination import (
    Instruction,
    ProfileSupply,
    ShardShortfall,
    ShardView,
    plan_transfers,
)
from shard_engine.dealing import Dealable, deal, rack_of
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
    Action,
    AssignIdle,
    MachineRecord,
    MachineState,
    Need,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Shortfall,
    Verify,
)
from shard_engine.transfers import TransferProfile, VictimTerms
from simulator import engines as ops
from simulator.cluster import ClusterModel
from simulator.engines import Applied, Engines, LocalEngines, Result, WorkerEngines
from simulator.fleet import Fleet

__all__ = ["BigFleetOptions", "BigFleetPolicy"]

log = logging.getLogger(__name__)

ProfileKey = tuple[str, str, str, int]


@dataclass(frozen=True, slots=True)
class BigFleetOptions:
    """Cadences of the shard process and coordinator (virtual seconds)."""

    shards: int = 2
    cycle_interval_s: float = 10.0
    rollup_interval_s: float = 10.0
    report_interval_s: float = 30.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    #: Worker processes holding the engines (1: in this process). Decisions do not depend on it.
    workers: int = 1


@dataclass(slots=True)
class _Op:
    """An operation the simulated executor is carrying out for one machine."""

    kind: str  # provision | assign | drain | delete | handover
    cluster: str = ""
    need_key: str = ""
    priority: int = 0
    receiver: str = ""


@dataclass(slots=True)
class _Shard:
    shard_id: str
    owned: dict[str, str] = field(default_factory=dict)  # machine -> provider
    ops: dict[str, _Op] = field(default_factory=dict)
    clusters: set[str] = field(default_factory=set)
    seq: int = 0

    def token(self) -> FencingToken:
        self.seq += 1
        return FencingToken(self.shard_id, 1, self.seq)


class BigFleetPolicy:
    """Shard engines + coordinator planner driving the fleet (see the module docstring)."""

    name = "bigfleet"

    def __init__(
        self, fleet: Fleet, clusters: Mapping[str, ClusterModel], options: BigFleetOptions
    ) -> None:
        self.fleet = fleet
        self.clusters = clusters
        self.options = options
        self.shards: dict[str, _Shard] = {}
        self.engines: Engines = LocalEngines({})
        self.owner: dict[str, str] = {}  # machine -> shard
        self.cluster_shard: dict[str, str] = {}
        self.needs: dict[tuple[str, str], Need] = {}
        self.priority_of: dict[str, int] = {}  # configured machine -> priority it serves
        self.need_of: dict[str, tuple[str, str]] = {}  # configured machine -> (cluster, need)
        self.state_of: dict[str, MachineState] = {}
        self.profile_of: dict[str, ProfileKey] = {}
        self.profiles: dict[ProfileKey, MachineRecord] = {}
        self.stats: Counter[str] = Counter()
        self._applied: dict[str, bytes] = {}  # cluster -> its last applied roll-up, timestamp 0
        self._next_cycle = 0.0
        self._next_rollup = 0.0
        self._next_report = options.report_interval_s

    # -- set-up -----------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Create the shards and give each its share of every profile (the coordinator's split)."""
        ids = [f"shard-{i:02d}" for i in range(self.options.shards)]
        records = list(self.fleet.records())
        per_shard = len(records) // max(1, len(ids)) + 1
        for sid in ids:
            self.shards[sid] = _Shard(sid)
        by_id = {r.id: r for r in records}
        # Production's dealing (the coordinator's distribution): whole racks, even quota.
        dealt = deal([_dealable(r) for r in records], ids)
        loads: dict[str, list[MachineRecord]] = {}
        for sid in ids:
            shard = self.shards[sid]
            loads[sid] = [by_id[mid] for mid in dealt.machines_of(sid)]
            for record in loads[sid]:
                shard.owned[record.id] = record.provider
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
        key = (record.provider, record.instance_type, record.zone, int(record.capacity_type))
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
        if now >= self._next_rollup:
            self._next_rollup = now + self.options.rollup_interval_s
            self._send_rollups(now)
        if now >= self._next_cycle:
            self._next_cycle = now + self.options.cycle_interval_s
            plans = self.engines.call_each(self.shards, ops.cycle, now)
            for shard, actions in zip(self.shards.values(), plans, strict=True):
                self._execute(shard, actions, now)
        if now >= self._next_report:
            self._next_report = now + self.options.report_interval_s
            self._coordinate(now)

    def _send_rollups(self, now: float) -> None:
        for cluster_id, cluster in self.clusters.items():
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
        for need in applied.needs:
            self.needs[(cluster_id, need.key)] = need

    # -- carrying out a plan --------------------------------------------------------------
    def _execute(self, shard: _Shard, actions: tuple[Action, ...], now: float) -> None:
        for action in actions:
            if isinstance(action, Provision):
                for mid in action.machine_ids:
                    op = _Op("provision", action.cluster_id, action.need_key, action.priority)
                    self._call(shard, mid, op, now)
            elif isinstance(action, AssignIdle):
                op = _Op("assign", action.cluster_id, action.need_key, action.priority)
                self._call(shard, action.machine_id, op, now)
            elif isinstance(action, Preempt):
                self.stats["preemptions"] += 1
                self._drain(shard, action.machine_id, action.victim_cluster_id, now, "preempt")
                self._call(shard, action.machine_id, _Op("drain"), now, grace=action.grace_seconds)
            elif isinstance(action, Reclaim):
                self.stats["reclaims"] += 1
                self._drain(shard, action.machine_id, action.cluster_id, now, "reclaim")
                self._call(shard, action.machine_id, _Op("drain"), now, grace=action.grace_seconds)
            elif isinstance(action, Release):
                self.stats["releases"] += 1
                self._call(shard, action.machine_id, _Op("delete"), now)
            elif isinstance(action, Verify):
                record = self._record(shard, action.machine_id)
                self.engines.post(shard.shard_id, ops.settle, action.machine_id, record, now)

    def _drain(self, shard: _Shard, mid: str, cluster_id: str, now: float, reason: str) -> None:
        """The operator cordons the node and evicts its pods when told to drain it."""
        cluster = self.clusters.get(cluster_id)
        if cluster is not None:
            cluster.remove_node(mid, now, reason=reason)
        self.priority_of.pop(mid, None)
        self.need_of.pop(mid, None)

    def _call(self, shard: _Shard, mid: str, op: _Op, now: float, *, grace: int = 0) -> None:
        provider = shard.owned.get(mid)
        if provider is None:
            self.engines.post(shard.shard_id, ops.settle, mid, None, now)
            return
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
            self.engines.post(shard.shard_id, ops.settle, mid, self._record(shard, mid), now)

    def _configure(self, shard: _Shard, mid: str, op: _Op) -> None:
        core = self.fleet.providers[shard.owned[mid]]
        metadata = {"bigfleet.io/need": op.need_key, "bigfleet.io/priority": str(op.priority)}
        core.configure(mid, op.cluster, b"", shard.token(), metadata)

    def _record(self, shard: _Shard, mid: str) -> MachineRecord | None:
        provider = shard.owned.get(mid)
        if provider is None:
            return None
        return self.fleet.machine(provider, mid)

    # -- observing the providers ------------------------------------------------------------
    def on_changes(self, changes: list[tuple[str, str]], now: float) -> None:
        """Fold provider state changes into the engines (the shard's observe + record steps)."""
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
            self.priority_of.pop(record.id, None)
        self.engines.post(shard.shard_id, ops.upsert, record, now)

    def _progress(self, shard: _Shard, record: MachineRecord, op: _Op, now: float) -> None:
        mid = record.id
        state = record.state
        if op.kind == "provision" and state is MachineState.IDLE:
            self.engines.post(shard.shard_id, ops.upsert, record, now)
            op.kind = "assign"
            try:
                self._configure(shard, mid, op)
            except ProviderError:
                shard.ops.pop(mid, None)
                self.engines.post(shard.shard_id, ops.settle, mid, self._record(shard, mid), now)
            return
        if op.kind == "handover":
            if state is MachineState.IDLE:
                self._hand_over(shard, record, op, now)
                return
            shard.ops.pop(mid, None)
            self.engines.post(shard.shard_id, ops.upsert, record, now)
            return
        shard.ops.pop(mid, None)
        self.engines.post(shard.shard_id, ops.settle, mid, record, now)
        if state is MachineState.CONFIGURED and op.kind in ("assign", "provision"):
            self.priority_of[mid] = op.priority
            self.need_of[mid] = (op.cluster, op.need_key)
            cluster = self.clusters.get(record.cluster)
            if cluster is not None:
                cluster.add_node(mid, record.allocatable, record.labels, now)

    # -- the coordinator ----------------------------------------------------------------------
    def _coordinate(self, now: float) -> None:
        lacking = dict(
            zip(self.shards, self.engines.call_each(self.shards, ops.shortfalls), strict=True)
        )
        if not any(lacking.values()):
            return
        busy = dict(zip(self.shards, self.engines.call_each(self.shards, ops.busy), strict=True))
        views = {
            sid: self._view(shard, busy[sid], lacking[sid]) for sid, shard in self.shards.items()
        }
        for instruction in plan_transfers(views):
            self.stats[f"transfer:{instruction.kind}"] += 1
            self._transfer(instruction, now)

    def _view(
        self, shard: _Shard, busy: frozenset[str], lacking: tuple[Shortfall, ...]
    ) -> ShardView:
        """What the shard reports: supply per profile (not busy) and its shortfalls."""
        idle: Counter[ProfileKey] = Counter()
        speculative: Counter[ProfileKey] = Counter()
        configured: dict[ProfileKey, Counter[int]] = defaultdict(Counter)
        for mid in shard.owned:
            if mid in busy or mid in shard.ops:
                continue
            state = self.state_of.get(mid)
            key = self.profile_of[mid]
            if state is MachineState.IDLE:
                idle[key] += 1
            elif state is MachineState.SPECULATIVE:
                speculative[key] += 1
            elif state is MachineState.CONFIGURED and mid in self.priority_of:
                configured[key][self.priority_of[mid]] += 1
        supply = []
        for key in set(idle) | set(speculative) | set(configured):
            sample = self.profiles[key]
            supply.append(
                ProfileSupply(
                    provider=key[0],
                    instance_type=key[1],
                    zone=key[2],
                    capacity_type=key[3],
                    labels=sample.labels,
                    allocatable=sample.allocatable,
                    idle=idle[key],
                    speculative=speculative[key],
                    configured_by_priority=dict(configured.get(key, {})),
                )
            )
        shortfalls = []
        for sf in lacking:
            need = self.needs.get((sf.cluster_id, sf.need_key))
            shortfalls.append(
                ShardShortfall(
                    cluster_id=sf.cluster_id,
                    need_key=sf.need_key,
                    priority=sf.priority,
                    deficit=sf.deficit,
                    requirements=need.requirements if need else (),
                    min_unit=need.min_unit if need else {},
                    age_cycles=sf.age_cycles,
                    escalated=sf.escalated,
                )
            )
        return ShardView(
            shard_id=shard.shard_id,
            total_machines=len(shard.owned),
            supply=tuple(sorted(supply, key=lambda s: s.key)),
            shortfalls=tuple(shortfalls),
        )

    def _transfer(self, instruction: Instruction, now: float) -> None:
        """Carry out one instruction; the donor chooses with ``shard_engine.transfers``."""
        donor = self.shards[instruction.donor]
        receiver = self.shards[instruction.receiver]
        profile = TransferProfile(
            provider=instruction.provider,
            instance_type=instruction.instance_type,
            zone=instruction.zone,
            capacity_type=instruction.capacity_type,
        )
        if instruction.kind == "preempt":
            self._preempt_for(instruction, donor, profile, now)
            return
        wanted = MachineState.IDLE if instruction.kind == "idle" else MachineState.SPECULATIVE
        chosen = self.engines.call(
            donor.shard_id,
            ops.donations,
            profile,
            wanted,
            instruction.count,
            frozenset(donor.ops),
        )
        for record in chosen:
            self._move(donor, receiver, record, now)

    def _move(self, donor: _Shard, receiver: _Shard, record: MachineRecord, now: float) -> None:
        self.engines.post(donor.shard_id, ops.remove, record.id)
        provider = donor.owned.pop(record.id)
        receiver.owned[record.id] = provider
        self.engines.post(receiver.shard_id, ops.upsert, record, now)
        self.owner[record.id] = receiver.shard_id

    def _preempt_for(
        self,
        instruction: Instruction,
        donor: _Shard,
        profile: TransferProfile,
        now: float,
    ) -> None:
        """Drain the donor's victims (``choose_cross_shard_victims``) and hand them over idle."""
        terms: dict[str, VictimTerms] = {}
        priorities: dict[str, int] = {}
        for mid in donor.owned:
            need_ref = self.need_of.get(mid)
            if need_ref is None:  # not configured for a need (priority_of is a subset)
                continue
            if mid in self.priority_of:
                priorities[mid] = self.priority_of[mid]
            need = self.needs.get(need_ref)
            if need is not None:
                terms[mid] = VictimTerms(
                    interruption_penalty=need.interruption_penalty,
                    reclamation_penalty=need.reclamation_penalty,
                    app_class=need.app_class,
                )
        victims = self.engines.call(
            donor.shard_id,
            ops.victims,
            profile,
            instruction.below_priority,
            instruction.count,
            frozenset(donor.ops),
            priorities,
            terms,
            self.options.engine,
        )
        for victim in victims:
            self.engines.post(donor.shard_id, ops.remove, victim.machine_id)
            self.stats["preemptions_cross_shard"] += 1
            self._drain(donor, victim.machine_id, victim.cluster_id, now, "preempt")
            self._call(
                donor,
                victim.machine_id,
                _Op("handover", receiver=instruction.receiver),
                now,
                grace=victim.grace_seconds,
            )

    def _hand_over(self, donor: _Shard, record: MachineRecord, op: _Op, now: float) -> None:
        donor.ops.pop(record.id, None)
        receiver = self.shards[op.receiver]
        provider = donor.owned.pop(record.id)
        receiver.owned[record.id] = provider
        self.engines.post(receiver.shard_id, ops.upsert, record, now)
        self.owner[record.id] = receiver.shard_id

    # -- reading --------------------------------------------------------------------------------
    def machines_by_state(self) -> Counter[str]:
        """Machines per state over every shard (for the time series)."""
        return Counter(s.name for s in self.state_of.values())


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
