"""The parts of one shard process, each built with exactly the dependencies it uses.

    LeaseKeeper            store                          epoch, fencing tokens, may we act?
    ProviderObserver       provider clients               providers' List -> engine, NodeView
    OutcomeRecorder        store, lease                   finished operations -> store, engine
    ShardCore              state, actuator                plan actions -> operations (core.py)
    Executor               Temporal                       the actuator: operations -> workflows
    CrossShardTransfers    store, observer, executor      coordinator instructions (donor, receiver)
    ShardMembership        store, hub, transfers          cluster moves and handovers
    CoordinatorReporter    Temporal, lease                periodic report to the coordinator
    CapacityHints          hub, engine                    AvailableCapacityUpdate to each cluster
    Reconciler             store, providers, Temporal     drift between providers, PG, engine
    ShardActivityContext   lease, observer, outcomes, …   what the activities see

Shared state: one :class:`ShardState` owns what the shard knows of its
machines — the engine (machines, needs in force, in-flight marks),
ownership, workload priorities, machines leaving, the
:class:`MachineLifecycle` (quarantine, blocked drains, declared failures)
and the :class:`NodeView` — and every part that changes it does so through
its methods. :class:`OperationSequences` and :class:`CoordinatorTerms` are
the only other state, each owned by one object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from temporalio.client import Client

from activities.context import ProviderCalls
from bigfleet.decisions import DecisionLog
from bigfleet.shard.capacity_hints import CapacityHints
from bigfleet.shard.choices import EngineChoices
from bigfleet.shard.context import ShardActivityContext
from bigfleet.shard.core import ShardCore
from bigfleet.shard.executor import Executor
from bigfleet.shard.gate import Adoption, GatedActuator, Modes
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.lifecycle import MachineLifecycle
from bigfleet.shard.marks import ModeMarker
from bigfleet.shard.membership import ShardMembership
from bigfleet.shard.nodes import NodeView
from bigfleet.shard.observer import ProviderObserver
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.outcomes import OutcomeRecorder
from bigfleet.shard.reconciler import Reconciler
from bigfleet.shard.relay import RelayHub
from bigfleet.shard.reporter import CoordinatorReporter
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.sessions import SessionHub
from bigfleet.shard.state import ShardState
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.shard.transfers import CrossShardTransfers
from bigfleet.shard.virtual import VirtualSettlement
from bigfleet.store import Store
from bigfleet.store.controls import ControlStore
from bigfleet.store.decisions import DecisionStore
from shard_engine.engine import ShardEngine
from workflows.contracts import DeadlinePolicy, MachineTarget
from workflows.coordinator_contracts import AdoptInput

__all__ = ["ShardParts", "assemble"]


@dataclass(frozen=True)
class ShardParts:
    """Everything one shard process is made of."""

    engine: ShardEngine
    state: ShardState[ShardEngine]
    hub: SessionHub
    lifecycle: MachineLifecycle
    terms: CoordinatorTerms
    sequences: OperationSequences
    lease: LeaseKeeper
    nodes: NodeView
    observer: ProviderObserver
    outcomes: OutcomeRecorder
    core: ShardCore
    executor: Executor
    transfers: CrossShardTransfers[ShardEngine]
    membership: ShardMembership
    reporter: CoordinatorReporter
    reconciler: Reconciler
    context: ShardActivityContext
    capacity_hints: CapacityHints
    adoption: Adoption
    # Shadow mode only: would-be operations settling in memory (virtual.py).
    settlement: VirtualSettlement | None = None


def assemble(
    options: ShardOptions,
    *,
    store: Store,
    temporal: Client,
    providers: Mapping[str, ProviderCalls],
    clock: Callable[[], float],
) -> ShardParts:
    """Build the parts of the shard ``options.shard_id`` and wire them to each other."""
    shard_id = options.shard_id
    engine = ShardEngine(options.engine, stopwatch=time.perf_counter)
    engine.budgets = options.budgets
    # With edge processes the sessions live there; the hub relays to them (ADR 0147).
    hub = RelayHub() if options.edges else SessionHub()
    lifecycle = MachineLifecycle()
    terms = CoordinatorTerms()
    lease = LeaseKeeper(
        store,
        shard_id=shard_id,
        holder=options.holder,
        ttl_s=options.lease_ttl_s,
        margin_s=options.lease_margin_s,
    )
    # Numbered from the lease epoch: never reused across restarts and takeovers.
    sequences = OperationSequences(lambda: lease.epoch)
    nodes = NodeView(hub, engine)
    state = ShardState(engine, clock=clock, lifecycle=lifecycle, nodes=nodes)
    observer = ProviderObserver(providers, state=state)
    outcomes = OutcomeRecorder(store, lease=lease, state=state)
    modes = Modes(shadow=options.shadow)
    executor = Executor(
        temporal,
        shard_id=shard_id,
        task_queue=options.task_queue,
        sequences=sequences,
        deadlines=DeadlinePolicy(options.deadlines, dict(options.deadline_overrides)),
        poll=options.poll,
        guard=lease,
        mode=lambda: modes.shard_mode,
    )
    # The one core production and the simulator share; the executor is its actuator,
    # behind the gate that shadow mode, pause and dry run close (gate.py).
    settlement = (
        VirtualSettlement(state, clock=clock, delays=options.shadow_delays)
        if options.shadow
        else None
    )
    core = ShardCore(
        state, GatedActuator(executor, modes, settlement=settlement), shard_id=shard_id
    )
    adoption = Adoption(
        shard_id=shard_id,
        engine=engine,
        modes=modes,
        controls=ControlStore(store.engine),
        decisions=DecisionLog(shard_id, DecisionStore(store.engine), clock=clock),
        # Work in flight says in the Temporal UI when its shard is paused (ADR 0153).
        marker=ModeMarker(temporal, shard_id=shard_id),
    )
    transfers = CrossShardTransfers(
        store,
        shard_id=shard_id,
        state=state,
        engine_config=options.engine,
        sequences=sequences,
        reads=observer,
        choices=EngineChoices(engine),
        deadlines=executor.deadlines_for,
        core=core,
        terms=terms,
        poll=options.poll,
        max_share=options.max_instruction_share,
    )
    membership = ShardMembership(
        store,
        shard_id=shard_id,
        state=state,
        hub=hub,
        terms=terms,
        adopt=transfers.adopt_machines,
        clock=clock,
    )
    reporter = CoordinatorReporter(
        temporal,
        lease=lease,
        state=state,
        terms=terms,
        clock=clock,
        # Budget shares older than three reports give way to the safe default.
        stale_after_s=3 * options.report_interval_s,
        early_gap_s=options.early_report_gap_s,
    )

    async def adopt_unheld(targets: list[MachineTarget]) -> int:
        """Take over rows that name this shard but that it does not hold (reconcile)."""
        return (await transfers.adopt_machines(AdoptInput(terms.highest, 0, targets))).adopted

    reconciler = Reconciler(
        store,
        lease=lease,
        providers=providers,
        observer=observer,
        state=state,
        temporal=temporal,
        clock=clock,
        interval_s=options.reconcile_interval_s,
        adopt=adopt_unheld,
    )
    context = ShardActivityContext(
        lease=lease,
        observer=observer,
        outcomes=outcomes,
        hub=hub,
        lifecycle=lifecycle,
        executor=executor,
    )
    return ShardParts(
        engine=engine,
        state=state,
        hub=hub,
        lifecycle=lifecycle,
        terms=terms,
        sequences=sequences,
        lease=lease,
        nodes=nodes,
        observer=observer,
        outcomes=outcomes,
        core=core,
        executor=executor,
        transfers=transfers,
        membership=membership,
        reporter=reporter,
        reconciler=reconciler,
        context=context,
        capacity_hints=CapacityHints(hub, engine),
        adoption=adoption,
        settlement=settlement,
    )
