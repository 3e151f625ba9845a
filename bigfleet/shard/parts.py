"""The parts of one shard process, each built with exactly the dependencies it uses.

    LeaseKeeper            store                          epoch, fencing tokens, may we act?
    ProviderObserver       provider clients               providers' List -> engine, NodeView
    OutcomeRecorder        store, lease                   finished operations -> store, engine
    Executor               Temporal                       plan actions -> workflow starts
    CrossShardTransfers    store, observer, executor      coordinator instructions (donor, receiver)
    ShardMembership        store, hub, transfers          cluster moves and handovers
    CoordinatorReporter    Temporal, lease                periodic report to the coordinator
    CapacityHints          hub, engine                    AvailableCapacityUpdate to each cluster
    Reconciler             store, providers, Temporal     drift between providers, PG, engine
    ShardActivityContext   lease, observer, outcomes, …   what the activities see

Shared state, each piece owned by one object and handed to those that read it:
the engine (machines, needs, in-flight marks), :class:`Holdings` (ownership,
workload priorities, machines leaving), :class:`AppliedNeeds` (the needs of
each cluster's last applied roll-up), :class:`MachineLifecycle`
(quarantine, blocked drains, declared failures), :class:`OperationSequences`
and :class:`CoordinatorTerms`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from temporalio.client import Client

from activities.context import ProviderCalls
from bigfleet.shard.capacity_hints import CapacityHints
from bigfleet.shard.context import ShardActivityContext
from bigfleet.shard.demand import AppliedNeeds
from bigfleet.shard.executor import Executor
from bigfleet.shard.holdings import Holdings
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.lifecycle import MachineLifecycle
from bigfleet.shard.membership import ShardMembership
from bigfleet.shard.nodes import NodeView
from bigfleet.shard.observer import ProviderObserver
from bigfleet.shard.options import ShardOptions
from bigfleet.shard.outcomes import OutcomeRecorder
from bigfleet.shard.reconciler import Reconciler
from bigfleet.shard.reporter import CoordinatorReporter
from bigfleet.shard.sequences import OperationSequences
from bigfleet.shard.sessions import SessionHub
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.shard.transfers import CrossShardTransfers
from bigfleet.store import Store
from shard_engine.engine import ShardEngine
from workflows.contracts import DeadlinePolicy, MachineTarget
from workflows.coordinator_contracts import AdoptInput

__all__ = ["ShardParts", "assemble"]


@dataclass(frozen=True)
class ShardParts:
    """Everything one shard process is made of."""

    engine: ShardEngine
    hub: SessionHub
    lifecycle: MachineLifecycle
    holdings: Holdings
    needs: AppliedNeeds
    terms: CoordinatorTerms
    sequences: OperationSequences
    lease: LeaseKeeper
    nodes: NodeView
    observer: ProviderObserver
    outcomes: OutcomeRecorder
    executor: Executor
    transfers: CrossShardTransfers
    membership: ShardMembership
    reporter: CoordinatorReporter
    reconciler: Reconciler
    context: ShardActivityContext
    capacity_hints: CapacityHints


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
    hub = SessionHub()
    lifecycle = MachineLifecycle()
    holdings = Holdings()
    needs = AppliedNeeds()
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
    observer = ProviderObserver(
        providers, engine=engine, holdings=holdings, lifecycle=lifecycle, nodes=nodes, clock=clock
    )
    outcomes = OutcomeRecorder(
        store,
        lease=lease,
        engine=engine,
        holdings=holdings,
        lifecycle=lifecycle,
        nodes=nodes,
        clock=clock,
    )
    executor = Executor(
        temporal,
        shard_id=shard_id,
        task_queue=options.task_queue,
        engine=engine,
        sequences=sequences,
        deadlines=DeadlinePolicy(options.deadlines, dict(options.deadline_overrides)),
        poll=options.poll,
        clock=clock,
        guard=lease,
        priority_of=holdings.priority,
    )
    transfers = CrossShardTransfers(
        store,
        shard_id=shard_id,
        engine=engine,
        engine_config=options.engine,
        holdings=holdings,
        needs=needs,
        sequences=sequences,
        observer=observer,
        executor=executor,
        lifecycle=lifecycle,
        terms=terms,
        poll=options.poll,
        max_share=options.max_instruction_share,
        clock=clock,
    )
    membership = ShardMembership(
        store,
        shard_id=shard_id,
        engine=engine,
        holdings=holdings,
        hub=hub,
        terms=terms,
        adopt=transfers.adopt_machines,
        clock=clock,
    )
    reporter = CoordinatorReporter(
        temporal,
        lease=lease,
        engine=engine,
        holdings=holdings,
        needs=needs,
        lifecycle=lifecycle,
        terms=terms,
        clock=clock,
    )

    async def adopt_unheld(targets: list[MachineTarget]) -> int:
        """Take over rows that name this shard but that it does not hold (reconcile)."""
        return (await transfers.adopt_machines(AdoptInput(terms.highest, 0, targets))).adopted

    reconciler = Reconciler(
        store,
        lease=lease,
        providers=providers,
        observer=observer,
        engine=engine,
        holdings=holdings,
        lifecycle=lifecycle,
        nodes=nodes,
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
        hub=hub,
        lifecycle=lifecycle,
        holdings=holdings,
        needs=needs,
        terms=terms,
        sequences=sequences,
        lease=lease,
        nodes=nodes,
        observer=observer,
        outcomes=outcomes,
        executor=executor,
        transfers=transfers,
        membership=membership,
        reporter=reporter,
        reconciler=reconciler,
        context=context,
        capacity_hints=CapacityHints(hub, engine),
    )
