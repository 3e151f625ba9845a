"""The supply: the real simulated providers' cores, on one virtual clock.

Both policies run against the same two provider cores the servers run —
``providers.sim_cloud.SimCloudProvider`` and
``providers.bare_metal.BareMetalProvider`` — built from the shipped
catalogs, with their latencies, quotas (``quota_scale``), prices, launch
rate limits and spot interruptions, on a ``ManualScheduler`` that the
driver advances. No gRPC: the simulator calls the cores' public methods
(Create, Configure, Drain, Delete, Get) in process.

The cores are subclassed only to *observe*: every state change (the
substrate hook ``_on_transition``) appends the machine to
:attr:`Fleet.changed`, which the policies drain after each step — the
simulator's equivalent of the shard's List/Get polling, without the
per-poll scan. Billing is kept here too: a machine costs its hourly price
from the moment Create is accepted until it is back to SPECULATIVE (or
FAILED). Bare metal reports its amortised price (the provider's
``bare_metal_pricing="amortised"``): a server in use is not free, and a
comparison of policies must count what each keeps busy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from clusters.pods import DIMENSIONS
from providers.bare_metal import BareMetalProvider
from providers.clock import ManualScheduler
from providers.config import ProviderConfig
from providers.core import MachineRecord as CoreRecord
from providers.core import ProviderCore
from providers.model import HOSTLESS_STATES, Machine, State
from providers.model import CapacityType as ProviderCapacityType
from providers.sim_cloud import SimCloudProvider
from shard_engine.model import CapacityType, MachineRecord, MachineState
from shard_engine.quantity import parse_quantity

__all__ = ["BILLED_STATES", "Fleet", "FleetOptions"]

_ENGINE_STATE = {s: MachineState(int(s)) for s in State}
_ENGINE_CAPACITY = {c: CapacityType(int(c)) for c in ProviderCapacityType}

#: States in which a machine holds a real host and costs money.
BILLED_STATES = frozenset(
    {
        State.CREATING,
        State.IDLE,
        State.CONFIGURING,
        State.CONFIGURED,
        State.DRAINING,
        State.DELETING,
    }
)


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """How large the fleet is and how its providers behave.

    ``quota_scale`` multiplies the shipped catalogs' quotas and rack sizes.
    A fleet that large is run by many cloud accounts, so the per-account
    launch rate limit (2/s, burst 100) is multiplied by it too, so the
    fleet's launch rate grows with the fleet. FAILED machines (a spot
    interruption, a failed launch) return to SPECULATIVE after
    ``failed_cleanup_s``.
    """

    quota_scale: float = 1.0
    seed: int = 1
    interruption_scale: float = 1.0
    failed_cleanup_s: float = 900.0
    error_rate: float = 0.0


class _Observed:
    """Mixin: report every state change of a core to the fleet, and read its records.

    ``core_record`` and ``core_records`` read the core's own records, which
    is what ``get`` and ``list`` snapshot: the simulator converts them to the
    engine's records directly instead of through an immutable snapshot
    (four map copies a machine, a third of the set-up at 1M machines).
    """

    _fleet: Fleet
    _machines: dict[str, CoreRecord]

    def _on_transition(self, record: CoreRecord) -> None:
        super()._on_transition(record)  # type: ignore[misc]
        self._fleet._observe(self.name, record)  # type: ignore[attr-defined]

    def core_record(self, machine_id: str) -> CoreRecord:
        """The core's record of one machine (``get`` without the snapshot)."""
        return self._machines[machine_id]

    def core_records(self) -> list[CoreRecord]:
        """Every record, oldest change first (``list`` without the snapshots)."""
        return sorted(self._machines.values(), key=lambda r: r.revision)


class _Cloud(_Observed, SimCloudProvider):
    def __init__(self, config: ProviderConfig, scheduler: ManualScheduler, fleet: Fleet) -> None:
        self._fleet = fleet
        super().__init__(config, scheduler=scheduler)


class _Metal(_Observed, BareMetalProvider):
    def __init__(self, config: ProviderConfig, scheduler: ManualScheduler, fleet: Fleet) -> None:
        self._fleet = fleet
        super().__init__(config, scheduler=scheduler)


#: Where a billed machine's money goes, by state: serving a cluster, or not.
_SERVING = frozenset({State.CONFIGURING, State.CONFIGURED, State.DRAINING})


@dataclass(slots=True)
class _Bill:
    since: float | None = None
    price: float = 0.0
    category: str = ""  # the cost category of the interval that started at ``since``


def _category(capacity: str, gpu: bool, state: State) -> str:
    """``<capacity type>[-gpu]/<serving|idle>``: what a billed interval is spent on."""
    kind = f"{capacity}-gpu" if gpu else capacity
    return f"{kind}/{'serving' if state in _SERVING else 'idle'}"


@dataclass(slots=True)
class Fleet:
    """Two provider cores on one virtual clock, observed and billed."""

    scheduler: ManualScheduler
    options: FleetOptions
    providers: dict[str, ProviderCore] = field(default_factory=dict)
    changed: list[tuple[str, str]] = field(default_factory=list)
    spent: float = 0.0
    #: Dollars of finished intervals per cost category (see ``_category``).
    spent_by: dict[str, float] = field(default_factory=dict)
    _bills: dict[str, _Bill] = field(default_factory=dict)
    _billed_rate: float = 0.0
    billed_machines: int = 0
    billed_alloc: np.ndarray = field(default_factory=lambda: np.zeros(len(DIMENSIONS)))
    _vectors: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    _alloc_cache: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)

    @classmethod
    def build(cls, options: FleetOptions, scheduler: ManualScheduler | None = None) -> Fleet:
        """Both cores at ``options.quota_scale``, started on the scheduler."""
        fleet = cls(scheduler=scheduler or ManualScheduler(), options=options)
        scale = max(1.0, options.quota_scale)
        errors = {"create": options.error_rate} if options.error_rate else {}
        cloud = ProviderConfig(
            kind="sim-cloud",
            seed=options.seed,
            quota_scale=options.quota_scale,
            interruption_scale=options.interruption_scale,
            failed_cleanup_s=options.failed_cleanup_s,
            run_instances_per_second=2.0 * scale,
            run_instances_burst=int(100 * scale),
            error_rate=errors,
        )
        metal = ProviderConfig(
            kind="bare-metal",
            seed=options.seed + 1,
            quota_scale=options.quota_scale,
            failed_cleanup_s=options.failed_cleanup_s,
            error_rate=errors,
            bare_metal_pricing="amortised",
        )
        for core in (_Cloud(cloud, fleet.scheduler, fleet), _Metal(metal, fleet.scheduler, fleet)):
            fleet.providers[core.name] = core
            core.start()
        return fleet

    # -- observation ----------------------------------------------------------------
    def _observe(self, provider: str, record: CoreRecord) -> None:
        self.changed.append((provider, record.id))
        bill = self._bills.get(record.id)
        billed = record.state in BILLED_STATES
        now = self.scheduler.now()
        if billed and (bill is None or bill.since is None):
            if bill is None:
                bill = self._bills[record.id] = _Bill()
            bill.since, bill.price = now, record.price_per_hour
            bill.category = self._category_of(provider, record)
            self._billed_rate += record.price_per_hour
            self.billed_machines += 1
            self.billed_alloc += self._vector(provider, record)
        elif not billed and bill is not None and bill.since is not None:
            self._close(bill, now)
            self._billed_rate -= bill.price
            bill.since = None
            self.billed_machines -= 1
            self.billed_alloc -= self._vector(provider, record)
        elif billed and bill is not None and bill.since is not None:
            category = self._category_of(provider, record)
            if category != bill.category:
                self._close(bill, now)
                bill.since, bill.category = now, category

    def _close(self, bill: _Bill, now: float) -> None:
        """Book a billed interval ending now."""
        assert bill.since is not None
        dollars = (now - bill.since) * bill.price / 3600.0
        self.spent += dollars
        self.spent_by[bill.category] = self.spent_by.get(bill.category, 0.0) + dollars

    def _category_of(self, provider: str, record: CoreRecord) -> str:
        gpu = self._vector(provider, record)[2] > 0
        return _category(record.capacity_type.label, bool(gpu), record.state)

    def _vector(self, provider: str, record: CoreRecord) -> np.ndarray:
        key = (provider, record.instance_type)
        vec = self._vectors.get(key)
        if vec is None:
            vec = np.array([parse_quantity(record.allocatable.get(d, "0")) for d in DIMENSIONS])
            self._vectors[key] = vec
        return vec

    def drain_changes(self) -> list[tuple[str, str]]:
        """The machines that changed since the last call, in order (duplicates kept)."""
        out, self.changed = self.changed, []
        return out

    def cost_so_far(self) -> float:
        """Dollars spent up to now, machines still running included."""
        now = self.scheduler.now()
        running = sum(
            (now - b.since) * b.price / 3600.0 for b in self._bills.values() if b.since is not None
        )
        return self.spent + running

    def cost_by_category(self) -> dict[str, float]:
        """Dollars spent up to now per cost category, machines still running included."""
        now = self.scheduler.now()
        out = dict(self.spent_by)
        for b in self._bills.values():
            if b.since is not None:
                out[b.category] = out.get(b.category, 0.0) + (now - b.since) * b.price / 3600.0
        return {k: round(v, 2) for k, v in sorted(out.items())}

    @property
    def cost_rate(self) -> float:
        """Dollars per hour of every machine holding a host now."""
        return self._billed_rate

    # -- reading ----------------------------------------------------------------------
    def machine(self, provider: str, machine_id: str) -> MachineRecord:
        """The machine now, as the engine's record (what the shard's observe step builds)."""
        core = self.providers[provider]
        assert isinstance(core, _Observed)
        return self._from_core(provider, core.core_record(machine_id))

    def echo(self, provider: str, machine_id: str) -> Mapping[str, str]:
        """The ``shard_metadata`` the provider echoes for the machine (what it serves)."""
        core = self.providers[provider]
        assert isinstance(core, _Observed)
        return core.core_record(machine_id).shard_metadata

    def records(self) -> Iterator[MachineRecord]:
        """Every machine of every provider (the initial List)."""
        for name, core in self.providers.items():
            assert isinstance(core, _Observed)
            for record in core.core_records():
                yield self._from_core(name, record)

    def _from_core(self, provider: str, r: CoreRecord) -> MachineRecord:
        """What ``to_record(provider, core.get(id))`` returns, without the snapshot."""
        key = (provider, r.instance_type)
        allocatable = self._alloc_cache.get(key)
        if allocatable is None:
            allocatable = {k: parse_quantity(v) for k, v in r.allocatable.items()}
            self._alloc_cache[key] = allocatable
        return MachineRecord(
            id=r.id,
            state=_ENGINE_STATE[r.state],
            provider=provider,
            instance_type=r.instance_type,
            zone=r.zone,
            capacity_type=_ENGINE_CAPACITY[r.capacity_type],
            price_per_hour=r.price_per_hour,
            interruption_probability=r.interruption_probability,
            allocatable=allocatable,
            labels=dict(r.labels),
            cluster=r.cluster,
            host_ref="" if r.state in HOSTLESS_STATES or r.host is None else r.host.ref,
            last_error=r.last_error,
        )

    def to_record(self, provider: str, m: Machine) -> MachineRecord:
        """Convert a provider snapshot into the engine's ``MachineRecord``."""
        key = (provider, m.instance_type)
        allocatable = self._alloc_cache.get(key)
        if allocatable is None:
            allocatable = {k: parse_quantity(v) for k, v in m.allocatable.items()}
            self._alloc_cache[key] = allocatable
        return MachineRecord(
            id=m.id,
            state=MachineState(int(m.state)),
            provider=provider,
            instance_type=m.instance_type,
            zone=m.zone,
            capacity_type=CapacityType(int(m.capacity_type)),
            price_per_hour=m.price_per_hour,
            interruption_probability=m.interruption_probability,
            allocatable=allocatable,
            labels=m.labels,
            cluster=m.cluster,
            host_ref="" if m.state in HOSTLESS_STATES or m.host is None else m.host.ref,
            last_error=m.last_error,
        )

    def close(self) -> None:
        """Cancel every provider timer."""
        for core in self.providers.values():
            core.close()
