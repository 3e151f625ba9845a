"""Cross-shard transfers: this shard's half of the coordinator's instructions.

    release_machines    (donor)     unbound idle or speculative machines of one profile
                                    leave the engine, then move in the ownership ledger
    prepare_preemption  (donor)     victims for another shard's need leave the engine;
                                    one drain each (started by the coordinator)
    release_machines    (donor, kind "preempt") the drained victims that reached IDLE move
    retire_machines     (any)       a decommissioned domain's machines leave the engine at
                                    once, then are quarantined for good (configured ones
                                    drained first)
    adopt_machines      (receiver)  machines the ledger now records as ours are read, then
                                    owned and observed as one batch, and continue above
                                    the donor's sequences

Which machines move is decided by pure functions of the engine
(``shard_engine.transfers``: ``choose_donations`` and
``choose_cross_shard_victims``, which uses local preemption's victim score),
whose inputs ``bigfleet.shard.choices`` gathers; this module carries the
choice out.

Every instruction is checked against the highest coordinator term seen first
(a zombie coordinator's instruction is refused), and against the share of
this shard's machines one instruction may move. A machine leaves the shard
by one call, ``ShardState.give_away``, with no await between choosing and
removing it, so a cycle cannot plan on it meanwhile; any the ledger refuses
come back unchanged (``ShardState.take_back``). Machines arrive the same way:
every read first, then the whole batch with no await between, so a cycle
never plans with half of it.

Production and ``bigfleet simulate`` run this same class. It reaches the
outside through four ports, so it imports no Temporal, SQL or gRPC:

    ledger      who owns each machine (production: PostgreSQL, by compare-and-set;
                the simulator: its ownership map)
    reads       machines read from their providers (production: the providers' Gets,
                several at once; the simulator: the provider cores)
    choices     the donor's choices (production: over the engine in this process;
                the simulator: wherever its engines live)
    deadlines   the deadlines a prepared drain carries (the executor's policy)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from bigfleet.shard.choices import DonorChoices
from bigfleet.shard.core import Operation, ShardCore
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.state import EngineView, ShardState, Sighting
from bigfleet.shard.terms import CoordinatorTerms
from shard_engine.engine import EngineConfig
from shard_engine.model import MachineRecord, MachineState, Reclaim
from shard_engine.transfers import TransferProfile
from workflows import coordinator_contracts as co
from workflows.contracts import (
    OP_DRAIN,
    REASON_DECOMMISSION,
    REASON_PREEMPT,
    DeadlinePolicy,
    Deadlines,
    DrainInput,
    MachineTarget,
    PollPolicy,
)
from workflows.ids import workflow_id

log = logging.getLogger(__name__)

__all__ = ["CrossShardTransfers", "MachineReads", "OwnedRow", "OwnershipLedger"]

E = TypeVar("E", bound=EngineView)


class OwnedRow(Protocol):
    """The ledger's record of one machine, as far as a transfer reads it."""

    @property
    def machine_id(self) -> str: ...

    @property
    def shard_id(self) -> str: ...

    @property
    def operation_seq(self) -> int: ...


class OwnershipLedger(Protocol):
    """Who owns each machine (``bigfleet.store.Store`` in production)."""

    async def transfer(
        self, *, donor: str, receiver: str, machine_ids: Sequence[str], term: int, seq: int
    ) -> list[str]:
        """Move what ``donor`` still owns to ``receiver``; the ids that moved."""
        ...

    async def machines_by_id(self, machine_ids: Sequence[str]) -> Sequence[OwnedRow]: ...

    async def quarantine(self, machine_id: str, shard_id: str, reason: str) -> bool: ...


class MachineReads(Protocol):
    """Machines read from their providers (``ProviderObserver`` in production)."""

    async def read_many(self, machines: Sequence[MachineTarget]) -> list[Sighting | None]:
        """Each machine's sighting, in the order given (None: it could not be read)."""
        ...


class CrossShardTransfers(Generic[E]):
    """Carries out coordinator instructions that move machines between shards."""

    def __init__(
        self,
        ledger: OwnershipLedger,
        *,
        shard_id: str,
        state: ShardState[E],
        engine_config: EngineConfig,
        sequences: OperationSequences,
        reads: MachineReads,
        choices: DonorChoices,
        core: ShardCore,
        terms: CoordinatorTerms,
        max_share: float,
        deadlines: Callable[[MachineRecord], Deadlines] | None = None,
        poll: PollPolicy | None = None,
    ) -> None:
        """``deadlines`` and ``poll`` are what a prepared drain carries; without them,
        the defaults (the simulator starts no workflow from them)."""
        self._ledger = ledger
        self._shard_id = shard_id
        self._state = state
        self._config = engine_config
        self._sequences = sequences
        self._reads = reads
        self._choices = choices
        self._deadlines = deadlines if deadlines is not None else _default_deadlines
        self._core = core
        self._terms = terms
        self._poll = poll if poll is not None else PollPolicy()
        self._max_share = max_share

    def _limit(self) -> int:
        """The most machines one instruction may move: a share of what this shard owns."""
        return max(1, int(len(self._state.owned) * self._max_share))

    # --------------------------------------------------------------- donor side

    async def release_machines(self, inp: co.ReleaseInput) -> co.ReleaseResult:
        """Give up to ``count`` unbound machines of one profile to another shard.

        Chosen synchronously (no await between choosing and removing them from
        the engine, so the cycle cannot plan on them meanwhile), then moved by
        compare-and-set in the ownership ledger; any it refuses come back.
        """
        refused = self._terms.check(inp.term)
        if refused:
            return co.ReleaseResult([], refused)
        spec = inp.spec
        if spec.kind == co.TransferKind.PREEMPT:
            return await self._hand_over_drained(inp)
        limit = self._limit()
        if spec.count > limit:
            log.warning(
                "refusing instruction %d/%d: %d machines > limit %d",
                inp.term,
                inp.seq,
                spec.count,
                limit,
            )
            return co.ReleaseResult(
                [],
                f"moving {spec.count} machines exceeds the limit of {limit} "
                f"({self._max_share:.0%} of {len(self._state.owned)})",
            )
        chosen = self._choices.donations(
            profile=_profile(spec),
            state=MachineState.IDLE
            if spec.kind == co.TransferKind.IDLE
            else MachineState.SPECULATIVE,
            count=spec.count,
        )
        departure = self._state.give_away([r.id for r in chosen])
        moved_ids = set(
            await self._ledger.transfer(
                donor=self._shard_id,
                receiver=spec.receiver,
                machine_ids=[r.id for r in chosen],
                term=inp.term,
                seq=inp.seq,
            )
        )
        self._state.take_back(departure, [r.id for r in chosen if r.id not in moved_ids])
        return co.ReleaseResult(
            [MachineTarget(r.id, r.provider) for r in chosen if r.id in moved_ids]
        )

    async def prepare_preemption(self, inp: co.ReleaseInput) -> co.PreemptionPlan:
        """Choose victims for another shard's need and prepare one drain each.

        Victims: configured machines of the instruction's profile serving a
        priority strictly below ``below_priority``, none in flight, best first
        by the local preemption's victim score (``choose_cross_shard_victims``).
        They leave this shard's engine at once (the victim cluster sees the
        loss and may replace it) and are handed over once drained. The grace
        follows the priority gap, as for a local preemption.
        """
        refused = self._terms.check(inp.term)
        if refused:
            return co.PreemptionPlan([], refused)
        spec = inp.spec
        limit = self._limit()
        if spec.count > limit:
            return co.PreemptionPlan(
                [], f"preempting {spec.count} machines exceeds the limit of {limit}"
            )
        already = self._state.leaving_for(inp.term, inp.seq)
        victims = self._choices.victims(
            profile=_profile(spec),
            below_priority=spec.below_priority,
            count=spec.count - len(already),
            priorities=self._state.priorities(),
            terms=self._state.victim_terms(),
            config=self._config,
        )
        drains: list[co.DrainStart] = []
        for victim in victims:
            record = self._state.mark_leaving(victim.machine_id, term=inp.term, seq=inp.seq)
            if record is None:  # chosen from the engine with no await since: cannot happen
                self._state.stay(victim.machine_id)
                continue
            seq = self._sequences.next([record.id])
            drains.append(
                co.DrainStart(
                    workflow_id=workflow_id(self._shard_id, OP_DRAIN, [record.id], seq),
                    input=DrainInput(
                        shard_id=self._shard_id,
                        machine=MachineTarget(record.id, record.provider),
                        cluster_id=record.cluster,
                        grace_seconds=victim.grace_seconds,
                        operation_seq=seq,
                        reason=REASON_PREEMPT,
                        victim_priority=victim.priority,
                        deadlines=self._deadlines(record),
                        poll=self._poll,
                    ),
                )
            )
        log.info(
            "preempting %d machines for shard %s (priority %d, instruction %d/%d)",
            len(drains),
            spec.receiver,
            spec.below_priority,
            inp.term,
            inp.seq,
        )
        return co.PreemptionPlan(drains)

    async def _hand_over_drained(self, inp: co.ReleaseInput) -> co.ReleaseResult:
        """After a cross-shard preemption: move the victims that reached IDLE."""
        mine = [
            MachineTarget(m, self._state.provider_of(m) or "")
            for m in self._state.leaving_for(inp.term, inp.seq)
        ]
        ready: list[MachineTarget] = []
        for target, sighting in zip(mine, await self._reads.read_many(mine), strict=True):
            if sighting is not None and sighting.record.state is MachineState.IDLE:
                ready.append(target)
            else:
                # The drain did not finish: the machine stays ours and rejoins the engine.
                self._state.stay(target.machine_id)
                if sighting is not None:
                    self._state.observe(sighting.record, sighting.workload)
        departure = self._state.give_away([t.machine_id for t in ready])
        try:
            moved = set(
                await self._ledger.transfer(
                    donor=self._shard_id,
                    receiver=inp.spec.receiver,
                    machine_ids=[t.machine_id for t in ready],
                    term=inp.term,
                    seq=inp.seq,
                )
            )
        except BaseException:
            self._state.take_back(departure)
            raise
        refused = [t.machine_id for t in ready if t.machine_id not in moved]
        self._state.take_back(departure, refused)
        for machine_id in refused:
            self._state.stay(machine_id)  # ours still, and planned with again once observed
        return co.ReleaseResult([t for t in ready if t.machine_id in moved])

    async def retire_machines(self, inp: co.RetireInput) -> co.RetireResult:
        """Take machines of a decommissioned domain out of use for good.

        Each is quarantined durably first (a restart keeps it out). An unbound
        machine simply leaves the engine; a configured one is drained first
        with the default grace, and its cluster sees the loss and replaces
        it. A machine in the middle of an operation is left for the next
        decommission round (it is not counted as retired).

        Every machine chosen leaves the engine before the first await, as a
        release does: a cycle that runs while the quarantines are written
        cannot start an operation on one. Each drain is built from the
        machine's record before it leaves. One the ownership record refuses,
        and every one not yet recorded when the store fails, comes back.
        """
        busy = set(self._state.engine.in_flight())
        chosen = [
            m for m in dict.fromkeys(inp.machine_ids) if self._state.owns(m) and m not in busy
        ]
        grace = self._config.grace_default_seconds
        drains: dict[str, list[Operation]] = {}
        for machine_id in chosen:
            record = self._state.machine(machine_id)
            if record is not None and record.state == MachineState.CONFIGURED and record.cluster:
                drains[machine_id] = self._core.operations(
                    Reclaim(machine_id, record.cluster, grace, reason=REASON_DECOMMISSION)
                )
        departure = self._state.give_away(chosen)
        retired = draining = done = 0
        try:
            for machine_id in chosen:
                recorded = await self._ledger.quarantine(machine_id, self._shard_id, inp.reason)
                self._state.take_back(departure, [machine_id])
                done += 1
                if not recorded:
                    continue  # not ours by the record: back in use as it was
                self._state.quarantine(machine_id, inp.reason)
                retired += 1
                for op in drains.get(machine_id, ()):
                    if (await self._core.actuator.start(op)).refused:
                        log.warning("retiring %s: its drain was refused", machine_id)
                    else:
                        draining += 1
        finally:
            self._state.take_back(departure, chosen[done:])  # not recorded yet: back in use
        log.info("retired %d machines (%d draining first): %s", retired, draining, inp.reason)
        return co.RetireResult(retired, draining)

    # ------------------------------------------------------------ receiver side

    async def adopt_machines(self, inp: co.AdoptInput) -> co.AdoptResult:
        """Start acting on machines that the ledger now records as ours."""
        refused = self._terms.check(inp.term)
        if refused:
            return co.AdoptResult(0, refused)
        rows = {
            r.machine_id: r
            for r in await self._ledger.machines_by_id([m.machine_id for m in inp.machines])
        }
        ours = [
            (target, row)
            for target in inp.machines
            if (row := rows.get(target.machine_id)) is not None and row.shard_id == self._shard_id
        ]
        # Every read first, then the whole batch taken with no await between: a
        # cycle plans with all of the machines or none of them, never a part of
        # a batch that one read too slow cut in two (the donor's side, give_away,
        # is just as atomic).
        sightings = await self._reads.read_many([t for t, _ in ours])
        adopted = 0
        for (target, row), sighting in zip(ours, sightings, strict=True):
            # Continue above the previous owner's operation sequence, or our outcomes
            # would be discarded as stale by record_operation's compare-and-set.
            self._sequences.advance_to(target.machine_id, row.operation_seq)
            self._state.hold(target.machine_id, target.provider)
            if sighting is None:
                log.warning("adopting %s: not read (will load on next List)", target.machine_id)
                continue
            self._state.observe(sighting.record, sighting.workload)
            adopted += 1
        return co.AdoptResult(adopted)


def _default_deadlines(record: MachineRecord) -> Deadlines:
    """The deadlines of the default policy, as the executor keys them."""
    return DeadlinePolicy().for_machine(record.provider, record.capacity_type.name)


def _profile(spec: co.TransferSpec) -> TransferProfile:
    return TransferProfile(
        spec.provider, spec.instance_type, spec.zone, spec.capacity_type, domain=spec.domain
    )
