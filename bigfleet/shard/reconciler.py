"""The reconcile loop: providers' List vs the ownership record vs the engine, drift repaired.

    every reconcile_interval_s (default 60, BIGFLEET_RECONCILE_SECONDS), while acting:
      full List of every provider ─┐
      this shard's rows (PG) ──────┤
      the engine's records ────────┼─▶ shard_engine.drift.find_drift ─▶ repairs
      running workflows (Temporal) ┘
      binding-recorded / -cleared  Store.reconcile_binding (CAS, logged as "reconcile")
      stale-flight                 ShardState.settle with the provider's view: plannable again
      engine-refreshed             ProviderObserver.observe
      adopted                      a hand-over's receiving step (adopt_machines), once a
                                   row has been ours and unheld in two rounds in a row
      unowned / vanished           reported only
    each repair: one log line naming the machine and the change, and
    bigfleet_reconcile_repairs_total{kind} += 1

The loop is the safety net under the fixes that keep drift from arising
(outcomes that always land, sequences never reused, ADR 0101/0102): a
machine leaked by a workflow that ended without settling — configured at
the provider, no binding recorded, held in flight by the engine — is
recorded and released for planning within one period, so Phase 3 can
reclaim it (ADR 0103). A stale in-flight mark is only released after a
second look at the running workflows, a visibility lag later, so a
workflow that just started is never mistaken for a missing one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from temporalio.client import Client

from activities.context import ProviderCalls
from bigfleet.metrics import RECONCILE_REPAIRS
from bigfleet.shard.convert import InvalidMachine, machine_record
from bigfleet.shard.lease import LeaseKeeper
from bigfleet.shard.observer import ProviderObserver
from bigfleet.shard.state import ShardState
from bigfleet.store import LeaseLost, Store
from bigfleet.v1alpha1 import provider_pb2
from providers.errors import ProviderError
from shard_engine.drift import Believed, Listed, Recorded, Repair, RepairKind, find_drift
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord, MachineState
from workflows import search_attributes as sa
from workflows.contracts import MachineTarget

log = logging.getLogger(__name__)

__all__ = ["REPAIRS", "ReconcileRound", "Reconciler", "running_machines"]

REPAIRS = RECONCILE_REPAIRS  # defined with every other metric in bigfleet.metrics


@dataclass(frozen=True)
class _Seen:
    """One machine of a provider's List (converted to a record only when a repair needs it)."""

    provider: str
    machine: provider_pb2.Machine
    state: MachineState

    def record(self) -> MachineRecord | None:
        try:
            return machine_record(self.provider, self.machine)
        except InvalidMachine as err:
            log.warning("reconcile: ignoring machine from %s: %s", self.provider, err)
            return None


@dataclass(frozen=True)
class ReconcileRound:
    """What one round found and did."""

    started_unix: float
    seconds: float
    repairs: tuple[Repair, ...]
    applied: tuple[Repair, ...]


async def running_machines(temporal: Client, shard_id: str) -> set[str]:
    """Every machine named by a running workflow of this shard (batches included)."""
    query = f"{sa.SHARD_ID.name}='{shard_id}' AND ExecutionStatus='Running'"
    machines: set[str] = set()
    async for wf in temporal.list_workflows(query):
        attrs = wf.typed_search_attributes
        machines.update(attrs.get(sa.MACHINE_IDS) or [])
        single = attrs.get(sa.MACHINE_ID)
        if single:
            machines.add(single)
    return machines


class Reconciler:
    """One shard's reconcile loop (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        lease: LeaseKeeper,
        providers: Mapping[str, ProviderCalls],
        observer: ProviderObserver,
        state: ShardState[ShardEngine],
        temporal: Client,
        clock: Callable[[], float],
        interval_s: float,
        visibility_lag_s: float = 2.0,
        adopt: Callable[[list[MachineTarget]], Awaitable[int]] | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._providers = dict(providers)
        self._observer = observer
        self._state = state
        self._temporal = temporal
        self._clock = clock
        self.interval_s = interval_s
        self._lag_s = visibility_lag_s
        self._adopt = adopt
        self._unheld_before: set[str] = set()
        # A flight younger than this is never judged stale (its workflow may be
        # starting): at least the visibility lag, at most one period.
        self.stale_after_s = max(3 * visibility_lag_s, min(30.0, interval_s))
        self.rounds: list[ReconcileRound] = []

    async def run_once(self) -> ReconcileRound | None:
        """One round; None when this process may not act (nothing is compared)."""
        if not self._lease.active:
            return None
        started, t0 = self._clock(), time.monotonic()
        listing, listed_providers = await self._list_all()
        shard_id = self._lease.shard_id
        rows = await self._store.machines(shard_id)
        owned = self._state.owned
        recorded = {
            r.machine_id: Recorded(r.machine_id, r.provider, r.cluster_id)
            for r in rows
            if r.machine_id in owned
        }
        # Ours by the record, not held: a hand-over whose receiving step never ran.
        # Only rows seen so in two rounds in a row are adopted: a machine this shard is
        # giving away leaves `owned` a moment before PostgreSQL names its new owner.
        unheld_now = (
            {
                r.machine_id: Recorded(r.machine_id, r.provider, r.cluster_id)
                for r in rows
                if r.machine_id not in owned and not self._state.is_leaving(r.machine_id)
            }
            if self._adopt is not None
            else {}
        )
        unheld = {m: row for m, row in unheld_now.items() if m in self._unheld_before}
        self._unheld_before = set(unheld_now)
        owners = await self._store.owners(list(listing))
        busy = await running_machines(self._temporal, shard_id)
        listed_at = time.monotonic()
        engine = self._state.engine
        believed = {r.id: Believed(r.state, r.cluster) for r in engine.machines()}
        lifecycle = self._state.lifecycle
        held = set(lifecycle.quarantined) | lifecycle.declared_failed() | self._state.leaving()
        # Pure and on snapshots: run beside the shard's loop, which keeps renewing
        # its lease and serving (100,000 machines take about a second of CPU).
        repairs = await asyncio.to_thread(
            find_drift,
            listed=[
                Listed(machine_id, seen.provider, seen.state, seen.machine.cluster)
                for machine_id, seen in listing.items()
            ],
            listed_providers=listed_providers,
            recorded=recorded,
            owners=owners,
            believed=believed,
            in_flight_since=engine.in_flight_since(),
            busy=busy,
            held=held,
            unheld=unheld,
            now=self._clock(),
            stale_after_s=self.stale_after_s,
        )
        applied: list[Repair] = []
        stale = [r for r in repairs if r.kind is RepairKind.STALE_FLIGHT]
        for repair in [r for r in repairs if r.kind is not RepairKind.STALE_FLIGHT]:
            if not await self._apply_if_acting(repair, listing, recorded, applied):
                break
        if stale:
            # A second look at the running workflows, at least a visibility lag after
            # the first: a workflow started just before it may not have been visible.
            await asyncio.sleep(max(0.0, self._lag_s - (time.monotonic() - listed_at)))
            busy |= await running_machines(self._temporal, shard_id)
            for repair in stale:
                if repair.machine_id in busy:
                    continue
                if not await self._apply_if_acting(repair, listing, recorded, applied):
                    break
        done = ReconcileRound(started, time.monotonic() - t0, repairs, tuple(applied))
        self.rounds.append(done)
        del self.rounds[:-100]
        return done

    async def _list_all(self) -> tuple[dict[str, _Seen], set[str]]:
        """Every machine of a full List of every provider, and the providers that answered."""
        out: dict[str, _Seen] = {}
        answered: set[str] = set()
        for name, client in self._providers.items():
            try:
                listing = await client.list()
            except ProviderError as err:
                log.warning("reconcile: provider %s: List failed: %s", name, err)
                continue
            answered.add(name)
            for machine in listing.machines:
                try:
                    out[machine.id] = _Seen(name, machine, MachineState(machine.state))
                except ValueError:
                    log.warning("reconcile: ignoring %s from %s: bad state", machine.id, name)
        return out, answered

    async def _apply_if_acting(
        self,
        repair: Repair,
        listing: Mapping[str, _Seen],
        recorded: Mapping[str, Recorded],
        applied: list[Repair],
    ) -> bool:
        """Apply one repair unless this process stopped acting (then False: stop the round)."""
        if not self._lease.active:
            log.warning("shard %s stopped acting mid-reconcile", self._lease.shard_id)
            return False
        if await self._apply(repair, listing, recorded):
            applied.append(repair)
        return True

    async def _apply(
        self,
        repair: Repair,
        listing: Mapping[str, _Seen],
        recorded: Mapping[str, Recorded],
    ) -> bool:
        """Carry one repair out; log it and count it. True when something changed."""
        kind = repair.kind
        changed = True
        if kind in (RepairKind.BINDING_RECORDED, RepairKind.BINDING_CLEARED):
            row = recorded[repair.machine_id]
            bound = listing[repair.machine_id].machine.cluster
            try:
                changed = await self._store.reconcile_binding(
                    machine_id=repair.machine_id,
                    shard_id=self._lease.shard_id,
                    shard_epoch=self._lease.epoch,
                    expected_cluster=row.cluster,
                    cluster_id=bound if kind is RepairKind.BINDING_RECORDED else None,
                    detail=repair.describe(),
                )
            except LeaseLost as err:
                self._lease.lost(err)
                return False
        elif kind is RepairKind.STALE_FLIGHT:
            fresh = listing.get(repair.machine_id)
            current = (
                fresh.record() if fresh is not None else self._state.machine(repair.machine_id)
            )
            self._state.settle(repair.machine_id, current)
        elif kind is RepairKind.ENGINE_REFRESHED:
            seen = listing[repair.machine_id]
            self._observer.observe(seen.provider, seen.machine)
        elif kind is RepairKind.ADOPTED:
            assert self._adopt is not None
            changed = await self._adopt([MachineTarget(repair.machine_id, repair.provider)]) > 0
        else:
            changed = False  # unowned, vanished: reported, not acted on
        if changed or kind in (RepairKind.UNOWNED, RepairKind.VANISHED):
            REPAIRS.labels(kind=kind.value).inc()
            log.warning("reconcile (shard %s): %s", self._lease.shard_id, repair.describe())
        return changed
