"""The shard process: lease, inventory, operator sessions, decision cycle, workflow starts.

    lease (Postgres CAS, epoch)      -> fencing token on every provider call
    providers' List (observe loop)   -> engine.upsert_machine, NodeStateUpdate frames
    operator roll-ups (Session)      -> engine.apply_rollup
    cycle loop                       -> engine.cycle -> Executor -> workflows on shard-<id>
    activities (same process)        -> providers, sessions, store, engine.settle

The process implements :class:`activities.context.ShardContext` (what its
activities need) and :class:`bigfleet.shard.sessions.RollupSink` (what its
operator sessions need). It stops acting — no provider mutation, no workflow
start — the moment it is fenced or cannot renew its lease, and resumes only
after taking the lease again with a new epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.context import BootstrapBlob, ProviderCalls, ShardInactive
from activities.machines import META_PRIORITY
from activities.membership import MembershipActivities
from activities.registry import activities_for
from activities.transfers import TransferActivities
from bigfleet.identity import KeyPairSource, server_credentials
from bigfleet.shard.convert import (
    InvalidMachine,
    machine_record,
    requirement_specs,
    resources_to_wire,
)
from bigfleet.shard.executor import Executor, workflow_id
from bigfleet.shard.lifecycle import MachineLifecycle, reclaim_key
from bigfleet.shard.membership import ShardMembership
from bigfleet.shard.sessions import SessionHub, ShardServicer
from bigfleet.store import LeaseLost, Store
from bigfleet.store.repository import LeaseHeld, ShardRemoved
from bigfleet.v1alpha1 import provider_pb2, shard_pb2, shard_pb2_grpc
from providers.client import FencingToken
from providers.errors import ProviderError
from shard_engine.costs import drain_grace_seconds
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
    MachineRecord,
    MachineState,
    Need,
    Plan,
    Reclaim,
    Rollup,
    Shortfall,
)
from workflows import coordinator as co
from workflows import membership as ms
from workflows import search_attributes as sa
from workflows.contracts import (
    OP_DRAIN,
    REASON_PREEMPT,
    BlockedDrain,
    Deadlines,
    DrainInput,
    MachineTarget,
    NotifyReclaimInput,
    PollPolicy,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
    default_deadline_overrides,
)
from workflows.registry import ALL_WORKFLOWS, workflow_runner

log = logging.getLogger(__name__)

__all__ = ["ShardOptions", "ShardProcess", "task_queue"]


def task_queue(shard_id: str) -> str:
    """The Temporal task queue served only by the holder of ``shard_id``'s lease."""
    return f"shard-{shard_id}"


@dataclass(frozen=True)
class ShardOptions:
    """Tunables of one shard process."""

    shard_id: str = "shard-0"
    listen: str = "127.0.0.1:0"
    holder: str = "local"
    lease_ttl_s: float = 30.0
    cycle_interval_s: float = 5.0
    observe_interval_s: float = 2.0
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)
    # Deadline overrides per provider and capacity type (see workflows.contracts.DeadlinePolicy).
    deadline_overrides: dict[str, dict[str, float]] = field(
        default_factory=default_deadline_overrides
    )
    engine: EngineConfig = field(default_factory=EngineConfig)
    # How often the shard reports to the coordinator (summary + shortfalls).
    report_interval_s: float = 30.0
    # No coordinator instruction may move more than this share of our machines.
    max_instruction_share: float = 0.05


class ShardProcess:
    """One shard: owns its task queue, its operator sessions and its slice of the fleet."""

    def __init__(
        self,
        options: ShardOptions,
        *,
        store: Store,
        temporal: Client,
        providers: Mapping[str, ProviderCalls],
        clock: Callable[[], float] = time.time,
        tls: KeyPairSource | None = None,
    ) -> None:
        self.options = options
        # Mutual TLS for the Session port (None: plaintext); see bigfleet.identity.
        self.tls = tls
        self.store = store
        self.temporal = temporal
        self.providers: dict[str, ProviderCalls] = dict(providers)
        self.clock = clock
        self.engine = ShardEngine(options.engine)
        self.hub = SessionHub()
        self.epoch = 0
        self.fenced = False
        self.lease_ok = False
        self.coordinator_term = 0
        self.address = ""
        self.cycles = 0
        self.last_plan_actions = 0
        self._seq = itertools.count(1)
        self._op_seq: dict[str, int] = {}
        self._declared_failed: dict[str, str] = {}
        self._last_pushed: dict[str, tuple[int, str]] = {}
        self._cursors: dict[str, bytes] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._worker: Worker | None = None
        self._executor = Executor(self)
        self.lifecycle = MachineLifecycle()
        self._stopping = False
        # Machines PostgreSQL records as ours (id -> provider); only these are acted on.
        self.owned: dict[str, str] = {}
        self.highest_term = 0
        self.standing_by = False
        self._machine_priority: dict[str, int] = {}
        self._needs: dict[str, dict[str, Need]] = {}
        # Machines being drained for another shard, by (term, seq) of the instruction.
        self._leaving: dict[str, tuple[int, int]] = {}
        # Clusters and machines leaving (drain) or arriving (cluster move).
        self.membership = ShardMembership(self)

    # ------------------------------------------------------------ lifecycle

    @property
    def shard_id(self) -> str:
        return self.options.shard_id

    @property
    def task_queue(self) -> str:
        return task_queue(self.shard_id)

    async def start(self) -> None:
        """Take the lease, load inventory, serve sessions, and start the loops."""
        await self._take_lease_or_stand_by()
        for row in await self.store.machines(self.shard_id):
            self._op_seq[row.machine_id] = row.operation_seq
            self.owned[row.machine_id] = row.provider
        # Before the first observation, so quarantined machines never reach the engine.
        await self.load_quarantine()
        await self._observe_all(full=True)
        await self._resume_open_workflows()
        self._server = grpc.aio.server()
        shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(self.hub, self), self._server)
        health_servicer = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self._server)
        await health_servicer.set("bigfleet.v1alpha1.Shard", health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (shard_pb2.DESCRIPTOR.services_by_name["Shard"].full_name, reflection.SERVICE_NAME),
            self._server,
        )
        if self.tls is None:
            port = self._server.add_insecure_port(self.options.listen)
        else:
            port = self._server.add_secure_port(self.options.listen, server_credentials(self.tls))
        host = self.options.listen.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        await self._server.start()
        # Where a moved cluster's operator is sent: the lease row carries our address.
        await self.store.publish_address(
            self.shard_id, self.options.holder, self.epoch, self.address
        )
        transfers = TransferActivities(self)
        membership = MembershipActivities(self)
        self._worker = Worker(
            self.temporal,
            task_queue=self.task_queue,
            workflows=list(ALL_WORKFLOWS),
            activities=[
                *activities_for(self),
                transfers.release_machines,
                transfers.adopt_machines,
                transfers.prepare_preemption,
                transfers.retire_machines,
                membership.release_cluster,
                membership.hand_over,
            ],
            workflow_runner=workflow_runner(),
            graceful_shutdown_timeout=timedelta(seconds=5),
        )
        self._tasks = [
            asyncio.create_task(self._worker.run(), name="worker"),
            asyncio.create_task(self._lease_loop(), name="lease"),
            asyncio.create_task(self._observe_loop(), name="observe"),
            asyncio.create_task(self._cycle_loop(), name="cycle"),
            asyncio.create_task(self._report_loop(), name="report"),
        ]
        log.info(
            "shard %s serving on %s (epoch %d, task queue %s)",
            self.shard_id,
            self.address,
            self.epoch,
            self.task_queue,
        )

    async def _resume_open_workflows(self) -> int:
        """Re-mark the machines of this shard's still-running workflows (restart recovery).

        A restarted process rebuilds its engine from PostgreSQL and the
        providers, but an operation its predecessor started may still be
        running in Temporal. Its machines are claimed as in flight so the
        first cycle neither plans on them nor provisions their cluster twice;
        the workflows finish on this process's worker and settle them.
        Visibility lags about a second; a workflow missed here is still safe,
        because its deterministic id makes a re-planned start find it.
        """
        query = f"BigFleetShardId='{self.shard_id}' AND ExecutionStatus='Running'"
        claimed = 0
        async for wf in self.temporal.list_workflows(query):
            attrs = wf.typed_search_attributes
            operation = attrs.get(sa.OPERATION) or ""
            ids = list(attrs.get(sa.MACHINE_IDS) or [])
            single = attrs.get(sa.MACHINE_ID)
            if single and single not in ids:
                ids.append(single)
            target = (attrs.get(sa.CLUSTER_ID) or "") if operation in _BINDING_OPS else ""
            for machine_id in ids:
                if machine_id in self.owned and self.engine.claim(
                    machine_id,
                    operation=operation,
                    target_cluster=target,
                    now=self.clock(),
                    priority=attrs.get(sa.PRIORITY) or 0,
                ):
                    claimed += 1
        if claimed:
            log.info("shard %s resumed %d machines of running workflows", self.shard_id, claimed)
        return claimed

    async def stop(self) -> None:
        """Stop the loops, the worker and the server, and give the lease up."""
        self._stopping = True
        for task in self._tasks[1:]:
            task.cancel()
        for task in self._tasks[1:]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._worker is not None:
            with contextlib.suppress(Exception):
                await self._worker.shutdown()
        if self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._tasks[0]
        self.hub.close_all()
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self.lease_ok:
            with contextlib.suppress(Exception):
                await self.store.release_lease(self.shard_id, self.options.holder, self.epoch)
        self.lease_ok = False

    async def _take_lease_or_stand_by(self) -> None:
        """Take the lease; while another live process holds it, stand by and retry.

        Two processes started for one shard: exactly one acts, the other waits
        here until the first stops renewing (its lease expires) or gives up.
        """
        while True:
            try:
                await self._take_lease()
                self.standing_by = False
                return
            except ShardRemoved:
                raise  # nothing will ever free this lease: do not wait for it
            except LeaseHeld as err:
                if not self.standing_by:
                    log.info("standing by: %s", err)
                self.standing_by = True
                await asyncio.sleep(max(0.2, self.options.lease_ttl_s / 3))

    async def _take_lease(self) -> None:
        self.epoch = await self.store.acquire_lease(
            self.shard_id,
            self.options.holder,
            ttl_seconds=self.options.lease_ttl_s,
            address=self.address,
        )
        self.lease_ok = True
        self.fenced = False
        log.info("shard %s took its lease at epoch %d", self.shard_id, self.epoch)

    async def _lease_loop(self) -> None:
        interval = self.options.lease_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                if self.fenced or not self.lease_ok:
                    await self._take_lease()
                    self._cursors.clear()
                    await self._observe_all(full=True)
                else:
                    await self.store.renew_lease(
                        self.shard_id,
                        self.options.holder,
                        self.epoch,
                        ttl_seconds=self.options.lease_ttl_s,
                    )
            except LeaseLost:
                log.error(
                    "shard %s lost its lease at epoch %d; not acting", self.shard_id, self.epoch
                )
                self.lease_ok = False
            except LeaseHeld as err:
                log.error("shard %s cannot take its lease: %s", self.shard_id, err)
                self.lease_ok = False
            except Exception:  # the store is down: we cannot prove the lease, so do not act
                log.exception("lease renewal failed; not acting until it succeeds")
                self.lease_ok = False

    # -------------------------------------------------------- ShardContext

    @property
    def active(self) -> bool:
        return self.lease_ok and not self.fenced and not self._stopping

    def check_active(self) -> None:
        if self.fenced:
            raise ShardInactive(f"shard {self.shard_id} epoch {self.epoch} was fenced")
        if not self.lease_ok:
            raise ShardInactive(f"shard {self.shard_id} does not hold its lease")

    def provider(self, name: str) -> ProviderCalls:
        try:
            return self.providers[name]
        except KeyError:
            raise KeyError(f"provider {name!r} is not configured") from None

    def next_token(self) -> FencingToken:
        return FencingToken(self.shard_id, self.epoch, next(self._seq))

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        if not self.fenced:
            log.error(
                "shard %s epoch %d fenced by %s on %s (%s): stopping all actuation",
                self.shard_id,
                self.epoch,
                provider,
                machine_id,
                detail,
            )
        self.fenced = True

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        return await self.hub.request_bootstrap(cluster_id, requirements, wait_seconds=wait_seconds)

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        if self.lifecycle.is_quarantined(machine.id):
            return
        try:
            record = machine_record(provider, machine)
        except InvalidMachine as err:
            log.warning("ignoring machine from %s: %s", provider, err)
            return
        if record.id in self._leaving:
            # Drained for another shard: its new owner plans with it, we do not.
            self._push_node_state(record)
            return
        declared = self._declared_failed.get(record.id)
        if declared is not None:
            if record.state.transitional:
                record = _with_state(record, MachineState.FAILED, declared)
            else:
                del self._declared_failed[record.id]
        priority = machine.shard_metadata.get(META_PRIORITY)
        if priority and priority.lstrip("-").isdigit():
            self._machine_priority[record.id] = int(priority)
        elif not record.cluster:
            self._machine_priority.pop(record.id, None)
        self.engine.upsert_machine(record, now=self.clock())
        self._push_node_state(record)

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        for result in outcome.outcomes:
            configured = result.state == "CONFIGURED"
            reached = result.state == _TARGET_STATE.get(outcome.operation, result.state)
            try:
                await self.store.record_operation(
                    machine_id=result.machine_id,
                    shard_id=self.shard_id,
                    shard_epoch=self.epoch,
                    provider=result.provider,
                    cluster_id=outcome.cluster_id if configured else None,
                    operation=outcome.operation
                    if reached and result.state != "FAILED"
                    else f"{outcome.operation}-failed",
                    operation_seq=outcome.operation_seq,
                    shard_metadata={"bigfleet.io/need": outcome.need_key} if configured else {},
                    detail=result.last_error,
                )
            except LeaseLost as err:
                self.lease_ok = False
                raise ShardInactive(str(err)) from err
            if result.machine_id in self._leaving:
                continue
            current = self.engine.machine(result.machine_id)
            if result.state == "FAILED":
                self._declared_failed[result.machine_id] = result.last_error
                if current is not None:
                    current = _with_state(current, MachineState.FAILED, result.last_error)
            self.engine.settle(result.machine_id, current, now=self.clock())
            if current is not None:
                self._push_node_state(current, cluster_hint=outcome.cluster_id)

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        frame = shard_pb2.ShardMessage(
            reclaim_instruction=shard_pb2.ReclaimInstruction(
                instruction_id=instruction.instruction_id,
                nodes=list(instruction.machine_ids),
                grace_period_seconds=instruction.grace_seconds,
                preemptor_priority=instruction.preemptor_priority,
            )
        )
        return self.hub.send(instruction.cluster_id, frame, key=reclaim_key(instruction))

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        self.lifecycle.report_blocked(report)

    def shortfalls_to_report(self) -> list[Shortfall]:
        """Preemption drains blocked past their grace first, then the engine's shortfalls."""

        def allocatable(machine_id: str) -> Mapping[str, float]:
            record = self.engine.machine(machine_id)
            return record.allocatable if record is not None else {}

        blocked = self.lifecycle.shortfalls(now=self.clock(), deficit_of=allocatable)
        return [*blocked, *self.engine.shortfalls()]

    async def start_recovery(self, recovery: RecoverInput) -> str:
        return await self._executor.start_recovery(recovery)

    async def record_machine(self, record: RecordMachineInput) -> None:
        result = record.outcome
        if record.persist:
            bound = record.cluster_id if record.succeeded else ""
            try:
                await self.store.record_operation(
                    machine_id=result.machine_id,
                    shard_id=self.shard_id,
                    shard_epoch=self.epoch,
                    provider=result.provider,
                    cluster_id=bound or None,
                    operation=record.operation
                    if record.succeeded
                    else f"{record.operation}-failed",
                    operation_seq=record.operation_seq,
                    shard_metadata={"bigfleet.io/need": record.need_key}
                    if bound and record.need_key
                    else {},
                    detail=result.last_error or record.note,
                )
            except LeaseLost as err:
                self.lease_ok = False
                raise ShardInactive(str(err)) from err
        reason = result.last_error or record.note
        if record.quarantine:
            # Written before any in-memory change, so a retry of this activity
            # after a store failure replays the whole step.
            await self.store.quarantine(result.machine_id, self.shard_id, reason)
        self.lifecycle.settled(result.machine_id)
        current = self.engine.machine(result.machine_id)
        if result.state == "FAILED":
            self._declared_failed[result.machine_id] = result.last_error
            if current is not None:
                current = _with_state(current, MachineState.FAILED, result.last_error)
        self.engine.settle(result.machine_id, current, now=self.clock())
        if current is not None:
            self._push_node_state(current, cluster_hint=record.cluster_id)
        if record.quarantine:
            self.lifecycle.quarantine(result.machine_id, reason)
            self.engine.remove_machine(result.machine_id)

    async def load_quarantine(self) -> None:
        """Take back the machines an earlier process of this shard quarantined."""
        self.lifecycle.restore_quarantine(await self.store.quarantined(self.shard_id))

    async def release_quarantine(self, machine_id: str) -> bool:
        """Use a quarantined machine again (store first, then memory). Its
        provider's cursor is dropped so the next observation is a full List
        that brings the machine back into the engine. True if it was
        quarantined."""
        stored = await self.store.release_quarantine(machine_id)
        released = self.lifecycle.release_quarantine(machine_id)
        provider = self.owned.get(machine_id)
        if provider is not None:
            self._cursors.pop(provider, None)
        return released or stored

    # ---------------------------------------------------------- RollupSink

    async def admit_cluster(self, cluster_id: str) -> None:
        owner = await self.store.assign_cluster(cluster_id)
        if owner != self.shard_id:
            raise await self.membership.elsewhere(cluster_id, owner)
        # A cluster that just moved here may connect before its machines were adopted.
        await self.membership.adopt_bound(cluster_id)

    def apply_rollup(self, rollup: Rollup) -> str:
        deferred = self.membership.deferral(rollup.cluster_id)
        if deferred:
            return f"rollup-deferred: {deferred}"
        result = self.engine.apply_rollup(rollup, now=self.clock())
        if result.status == "applied":
            self._needs[rollup.cluster_id] = {n.key: n for n in rollup.needs}
            return "rollup"
        return f"rollup-{result.status}" + (f": {result.detail}" if result.detail else "")

    def ack_fields(self) -> tuple[int, int]:
        return self.coordinator_term, self.epoch

    # -------------------------------------------------------------- loops

    async def _observe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.observe_interval_s)
            try:
                await self._observe_all(full=False)
            except Exception:
                log.exception("observing providers failed")

    async def _observe_all(self, *, full: bool) -> None:
        """List every provider (incrementally when it returned a cursor) into the engine."""
        for name, client in self.providers.items():
            try:
                listing = await _list(client, b"" if full else self._cursors.get(name, b""))
            except ProviderError as err:
                log.warning("provider %s: List failed: %s", name, err)
                continue
            for machine in listing.machines:
                if machine.id not in self.owned:
                    continue
                self.observe(name, machine)
            self._cursors[name] = bytes(listing.revision)

    async def _cycle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.cycle_interval_s)
            if not self.active:
                continue
            try:
                await self.run_cycle()
            except Exception:
                log.exception("decision cycle failed")

    async def run_cycle(self) -> int:
        """One decision cycle: plan, then start a workflow per action. Returns actions started.

        A process that cannot prove it holds its lease (or was fenced) plans
        nothing and starts nothing.
        """
        if not self.active:
            return 0
        plan = self.engine.cycle(now=self.clock())
        self.cycles += 1
        self.last_plan_actions = len(plan.actions)
        return await self._executor.execute(plan)

    def next_operation_seq(self, machine_ids: Sequence[str]) -> int:
        """A new operation sequence for these machines (one number for a batch)."""
        seq = max((self._op_seq.get(m, 0) for m in machine_ids), default=0) + 1
        for m in machine_ids:
            self._op_seq[m] = seq
        return seq

    # --------------------------------------------------- coordinator side

    def _check_term(self, term: int) -> str:
        """'' if an instruction of ``term`` may act, else why it is refused."""
        if term < self.highest_term:
            return f"stale coordinator term {term} < {self.highest_term} already seen"
        self.highest_term = term
        return ""

    async def release_machines(self, inp: co.ReleaseInput) -> co.ReleaseResult:
        """Give up to ``count`` unbound machines of one profile to another shard.

        Chosen synchronously (no await between choosing and removing them from
        the engine, so the cycle cannot plan on them meanwhile), then moved by
        compare-and-set in PostgreSQL; any the store refuses come back.
        """
        refused = self._check_term(inp.term)
        if refused:
            return co.ReleaseResult([], refused)
        spec = inp.spec
        if spec.kind == "preempt":
            return await self._hand_over_drained(inp)
        limit = max(1, int(len(self.owned) * self.options.max_instruction_share))
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
                f"({self.options.max_instruction_share:.0%} of {len(self.owned)})",
            )
        wanted = MachineState.IDLE if spec.kind == "idle" else MachineState.SPECULATIVE
        busy = set(self.engine.in_flight()) | set(self.engine.promised())
        chosen: list[MachineRecord] = []
        for record in self.engine.machines():
            if len(chosen) >= spec.count:
                break
            if (
                record.state == wanted
                and record.id not in busy
                and not record.cluster
                and record.provider == spec.provider
                and record.instance_type == spec.instance_type
                and record.zone == spec.zone
                and int(record.capacity_type) == spec.capacity_type
            ):
                chosen.append(record)
        for record in chosen:
            self.engine.remove_machine(record.id)
            self.owned.pop(record.id, None)
        moved_ids = set(
            await self.store.transfer(
                donor=self.shard_id,
                receiver=spec.receiver,
                machine_ids=[r.id for r in chosen],
                term=inp.term,
                seq=inp.seq,
            )
        )
        for record in chosen:
            if record.id not in moved_ids:
                self.owned[record.id] = record.provider
                self.engine.upsert_machine(record, now=self.clock())
        return co.ReleaseResult(
            [MachineTarget(r.id, r.provider) for r in chosen if r.id in moved_ids]
        )

    async def prepare_preemption(self, inp: co.ReleaseInput) -> co.PreemptionPlan:
        """Choose victims for another shard's need and prepare one drain each.

        Victims: configured machines of the instruction's profile serving a
        priority strictly below ``below_priority``, lowest priority first,
        none in flight. They leave this shard's engine at once (the victim
        cluster sees the loss and may replace it) and are handed over once
        drained. The grace follows the priority gap, as for a local preemption.
        """
        refused = self._check_term(inp.term)
        if refused:
            return co.PreemptionPlan([], refused)
        spec = inp.spec
        limit = max(1, int(len(self.owned) * self.options.max_instruction_share))
        if spec.count > limit:
            return co.PreemptionPlan(
                [], f"preempting {spec.count} machines exceeds the limit of {limit}"
            )
        already = [m for m, key in self._leaving.items() if key == (inp.term, inp.seq)]
        busy = set(self.engine.in_flight()) | set(self.engine.promised())
        candidates = sorted(
            (
                r
                for r in self.engine.machines()
                if r.state == MachineState.CONFIGURED
                and r.id not in busy
                and r.provider == spec.provider
                and r.instance_type == spec.instance_type
                and r.zone == spec.zone
                and int(r.capacity_type) == spec.capacity_type
                and self._machine_priority.get(r.id, 0) < spec.below_priority
            ),
            key=lambda r: (self._machine_priority.get(r.id, 0), r.id),
        )
        chosen = candidates[: max(0, spec.count - len(already))]
        config = self.options.engine
        drains: list[co.DrainStart] = []
        for record in chosen:
            victim_priority = self._machine_priority.get(record.id, 0)
            grace = drain_grace_seconds(
                spec.below_priority - victim_priority,
                config.grace_thresholds,
                config.grace_default_seconds,
            )
            seq = self.next_operation_seq([record.id])
            self._leaving[record.id] = (inp.term, inp.seq)
            self.engine.remove_machine(record.id)
            drains.append(
                co.DrainStart(
                    workflow_id=workflow_id(self.shard_id, OP_DRAIN, [record.id], seq),
                    input=DrainInput(
                        shard_id=self.shard_id,
                        machine=MachineTarget(record.id, record.provider),
                        cluster_id=record.cluster,
                        grace_seconds=grace,
                        operation_seq=seq,
                        reason=REASON_PREEMPT,
                        victim_priority=victim_priority,
                        deadlines=self._executor.deadlines_for(record),
                        poll=self.options.poll,
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

    async def retire_machines(self, inp: co.RetireInput) -> co.RetireResult:
        """Take machines of a decommissioned domain out of use for good.

        Each is quarantined durably first (a restart keeps it out). An unbound
        machine simply leaves the engine; a configured one is drained first
        with the default grace, and its cluster sees the loss and replaces
        it. A machine in the middle of an operation is left for the next
        decommission round (it is not counted as retired).
        """
        retired = draining = 0
        busy = set(self.engine.in_flight())
        for machine_id in inp.machine_ids:
            if machine_id not in self.owned or machine_id in busy:
                continue
            if not await self.store.quarantine(machine_id, self.shard_id, inp.reason):
                continue
            record = self.engine.machine(machine_id)
            if record is not None and record.state == MachineState.CONFIGURED and record.cluster:
                grace = self.options.engine.grace_default_seconds
                await self._executor.execute(
                    Plan(now=self.clock(), actions=(Reclaim(machine_id, record.cluster, grace),))
                )
                draining += 1
            self.lifecycle.quarantine(machine_id, inp.reason)
            self.engine.remove_machine(machine_id)
            retired += 1
        log.info("retired %d machines (%d draining first): %s", retired, draining, inp.reason)
        return co.RetireResult(retired, draining)

    async def _hand_over_drained(self, inp: co.ReleaseInput) -> co.ReleaseResult:
        """After a cross-shard preemption: move the victims that reached IDLE."""
        mine = [m for m, key in self._leaving.items() if key == (inp.term, inp.seq)]
        ready: list[MachineTarget] = []
        for machine_id in mine:
            provider = self.owned.get(machine_id, "")
            machine: provider_pb2.Machine | None
            try:
                machine = await self.provider(provider).get(machine_id)
            except (ProviderError, KeyError) as err:
                log.warning("handing over %s: %s", machine_id, err)
                machine = None
            if machine is not None and machine.state == provider_pb2.MACHINE_STATE_IDLE:
                ready.append(MachineTarget(machine_id, provider))
            else:
                # The drain did not finish: the machine stays ours and rejoins the engine.
                del self._leaving[machine_id]
                if machine is not None:
                    self.observe(provider, machine)
        moved = set(
            await self.store.transfer(
                donor=self.shard_id,
                receiver=inp.spec.receiver,
                machine_ids=[t.machine_id for t in ready],
                term=inp.term,
                seq=inp.seq,
            )
        )
        for target in ready:
            self._leaving.pop(target.machine_id, None)
            if target.machine_id in moved:
                self.owned.pop(target.machine_id, None)
                self._machine_priority.pop(target.machine_id, None)
        return co.ReleaseResult([t for t in ready if t.machine_id in moved])

    async def adopt_machines(self, inp: co.AdoptInput) -> co.AdoptResult:
        """Start acting on machines that PostgreSQL now records as ours."""
        refused = self._check_term(inp.term)
        if refused:
            return co.AdoptResult(0, refused)
        rows = {
            r.machine_id: r
            for r in await self.store.machines_by_id([m.machine_id for m in inp.machines])
        }
        adopted = 0
        for target in inp.machines:
            row = rows.get(target.machine_id)
            if row is None or row.shard_id != self.shard_id:
                continue
            # Continue above the previous owner's operation sequence, or our outcomes
            # would be discarded as stale by record_operation's compare-and-set.
            self._op_seq[target.machine_id] = max(
                self._op_seq.get(target.machine_id, 0), row.operation_seq
            )
            self.owned[target.machine_id] = target.provider
            try:
                machine = await self.provider(target.provider).get(target.machine_id)
            except ProviderError as err:
                log.warning("adopting %s: %s (will load on next List)", target.machine_id, err)
                continue
            self.observe(target.provider, machine)
            adopted += 1
        return co.AdoptResult(adopted)

    async def release_cluster(self, inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
        """Give a cluster and its bound machines to another shard (only while draining)."""
        refused = self._check_term(inp.term)
        if refused:
            return ms.ReleaseClusterResult(refused=refused)
        return await self.membership.release_cluster(inp)

    async def hand_over(self, inp: ms.HandOverInput) -> ms.HandOverResult:
        """Give unbound machines to another shard (only while draining)."""
        refused = self._check_term(inp.term)
        if refused:
            return ms.HandOverResult(refused=refused)
        return await self.membership.hand_over(inp)

    def build_report(self) -> co.ShardReport:
        """Summary + up to 100 shortfalls for the coordinator."""
        busy = set(self.engine.in_flight()) | set(self.engine.promised())
        profiles: dict[tuple[str, str, str, int], co.ProfileReport] = {}
        total = 0
        for record in self.engine.machines():
            total += 1
            key = (record.provider, record.instance_type, record.zone, int(record.capacity_type))
            prof = profiles.get(key)
            if prof is None:
                prof = profiles[key] = co.ProfileReport(
                    provider=record.provider,
                    instance_type=record.instance_type,
                    zone=record.zone,
                    capacity_type=int(record.capacity_type),
                    labels=dict(record.labels),
                    allocatable=dict(record.allocatable),
                )
            if record.id in busy:
                continue
            if record.state == MachineState.IDLE and not record.cluster:
                prof.idle += 1
            elif record.state == MachineState.SPECULATIVE:
                prof.speculative += 1
            elif record.state == MachineState.CONFIGURED:
                prio = str(self._machine_priority.get(record.id, 0))
                prof.configured_by_priority[prio] = prof.configured_by_priority.get(prio, 0) + 1
        shortfalls = []
        for sf in self.shortfalls_to_report()[:100]:
            need = self._needs.get(sf.cluster_id, {}).get(sf.need_key)
            shortfalls.append(
                co.ShortfallReport(
                    cluster_id=sf.cluster_id,
                    need_key=sf.need_key,
                    priority=sf.priority,
                    deficit=dict(sf.deficit),
                    requirements=requirement_specs(need.requirements) if need else [],
                    min_unit=dict(need.min_unit) if need else {},
                    age_cycles=sf.age_cycles,
                    escalated=sf.escalated,
                    reason=sf.reason,
                )
            )
        return co.ShardReport(
            shard_id=self.shard_id,
            epoch=self.epoch,
            sent_at=self.clock(),
            total_machines=total,
            profiles=list(profiles.values()),
            shortfalls=shortfalls,
            highest_term_seen=self.highest_term,
        )

    async def send_report(self) -> bool:
        """Signal the coordinator; False when it is not running (shards carry on alone)."""
        try:
            handle = self.temporal.get_workflow_handle(co.COORDINATOR_ID)
            await handle.signal(co.CoordinatorWorkflow.report, self.build_report())
        except RPCError as err:
            log.debug("coordinator unreachable (%s); carrying on alone", err)
            return False
        return True

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.report_interval_s)
            if self.active:
                try:
                    await self.send_report()
                except Exception:
                    log.exception("reporting to the coordinator failed")

    # ------------------------------------------------------- node updates

    def _push_node_state(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        cluster = record.cluster or self.engine.in_flight().get(record.id, "") or cluster_hint
        if not cluster:
            return
        stamp = (int(record.state), cluster)
        if self._last_pushed.get(record.id) == stamp:
            return
        frame = shard_pb2.ShardMessage(
            node_state_update=shard_pb2.NodeStateUpdate(
                supersedes_key=f"node:{record.id}",
                machine_id=record.id,
                cluster_id=cluster,
                state=int(record.state),  # type: ignore[arg-type]
                node_name=record.id if record.state.has_host else "",
                provider_id=f"{record.provider}://{record.zone}/{record.host_ref}"
                if record.host_ref
                else "",
                last_error=record.last_error,
                labels=dict(record.labels),
                resources=resources_to_wire(record.allocatable),
            )
        )
        if self.hub.send(cluster, frame, key=f"node:{record.id}"):
            self._last_pushed[record.id] = stamp


# Operations that bind their machines to the workflow's cluster.
_BINDING_OPS = ("provision", "configure", "recover")

# The state each operation is meant to reach; anything else is recorded as its failure.
_TARGET_STATE = {"provision": "CONFIGURED", "configure": "CONFIGURED", "delete": "SPECULATIVE"}


def _with_state(record: MachineRecord, state: MachineState, error: str) -> MachineRecord:
    return replace(record, state=state, last_error=error)


async def _list(client: ProviderCalls, cursor: bytes) -> provider_pb2.MachineList:
    return await client.list(since_revision=cursor)
