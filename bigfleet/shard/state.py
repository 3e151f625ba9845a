"""ShardState: the one owner of what a shard process knows about its machines.

    engine      the decision engine's inventory, needs in force, in-flight marks
    ownership   machine -> provider, as PostgreSQL records it (only these are acted on)
    workload    machine -> the priority it serves and (cluster, need) it was configured
                for, read back from the ``shard_metadata`` the provider echoes
    leaving     machines drained for another shard's need, by coordinator instruction
    lifecycle   quarantine, blocked drains, declared failures (:class:`MachineLifecycle`)
    node view   what each cluster's operator was last told (:class:`NodeView`)

Every change goes through a method named for its intent, and each method
changes every view it concerns or none (Karpenter's ``state.Cluster``):

    hold        the ownership record names the machine ours (start-up, adoption)
    observe     a fresh provider observation: workload read back, engine, node view
    settle      an operation ended (or never started): the engine's flight ends
    give_away   the machine leaves the shard: engine, ownership, workload, leaving
    take_back   undo a give_away the store refused, exactly
    mark_leaving / stay     a cross-shard victim leaves the engine, or rejoins it
    quarantine  the shard stops using the machine

The needs in force are the engine's (``ShardEngine.needs_of``); no copy is
kept here. Nothing in this module awaits, so a method is never interleaved
with a cycle. It imports no Temporal and no SQL: the simulator runs it too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from bigfleet.shard.lifecycle import MachineLifecycle
from shard_engine.model import MachineRecord, MachineState, Need
from shard_engine.transfers import VictimTerms

__all__ = [
    "Departure",
    "EngineView",
    "NodeSink",
    "ShardState",
    "Sighting",
    "Workload",
    "victim_terms",
]


class EngineView(Protocol):
    """What the state uses of an engine: ``ShardEngine`` itself, or (in the simulator)
    a handle to one that lives in a worker process."""

    def machine(self, machine_id: str) -> MachineRecord | None: ...

    def machines(self) -> Iterator[MachineRecord]: ...

    def needs_of(self, cluster_id: str) -> tuple[Need, ...]: ...

    def serving_priorities(self) -> Mapping[str, int]: ...

    def in_flight(self) -> Mapping[str, str]: ...

    def promised(self) -> Mapping[str, str]: ...

    def upsert_machine(self, record: MachineRecord, *, now: float, need_key: str = "") -> None: ...

    def settle(self, machine_id: str, record: MachineRecord | None, *, now: float) -> None: ...

    def remove_machine(self, machine_id: str) -> None: ...


E = TypeVar("E", bound=EngineView)


@dataclass(frozen=True, slots=True)
class Workload:
    """What a provider echoes of the workload a machine serves (its ``shard_metadata``)."""

    #: The priority it serves (None: the provider echoed none).
    priority: int | None = None
    #: The key of the need it was configured for ("" for none).
    need_key: str = ""


@dataclass(frozen=True, slots=True)
class Sighting:
    """One machine as its provider reports it now: the record and the workload it echoes.

    What a read of one machine yields (``ProviderObserver.read`` in production,
    the provider cores in the simulator); :meth:`ShardState.observe` folds it in.
    """

    record: MachineRecord
    workload: Workload


class NodeSink(Protocol):
    """Where machine state changes are shown to operators (:class:`NodeView`)."""

    def push(self, record: MachineRecord, *, cluster_hint: str = "") -> None: ...

    def remember(self, machine_id: str, cluster_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Held:
    """Everything the state knew about one machine when it left (to put it back)."""

    provider: str
    record: MachineRecord | None
    priority: int | None
    serving: tuple[str, str] | None
    leaving: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Departure:
    """Machines that left the shard by one :meth:`ShardState.give_away`."""

    held: Mapping[str, _Held] = field(default_factory=dict)

    @property
    def machine_ids(self) -> list[str]:
        return sorted(self.held)

    def provider(self, machine_id: str) -> str:
        return self.held[machine_id].provider


def victim_terms(
    serving: Mapping[str, tuple[str, str]], needs_of: Callable[[str], Iterable[Need]]
) -> dict[str, VictimTerms]:
    """Per configured machine: the penalties and app class of the need it serves.

    ``serving`` maps a machine to the (cluster, need key) it was configured
    for; ``needs_of`` gives a cluster's needs in force. The one place these
    terms are gathered, for production's cross-shard preemption and the
    simulator's alike.
    """
    by_cluster: dict[str, dict[str, Need]] = {}
    out: dict[str, VictimTerms] = {}
    for machine_id, (cluster_id, need_key) in serving.items():
        needs = by_cluster.get(cluster_id)
        if needs is None:
            needs = by_cluster[cluster_id] = {n.key: n for n in needs_of(cluster_id)}
        need = needs.get(need_key)
        if need is not None:
            out[machine_id] = VictimTerms(
                need.interruption_penalty, need.reclamation_penalty, need.app_class
            )
    return out


class ShardState(Generic[E]):
    """The only owner of a shard's in-memory state (see the module docstring)."""

    def __init__(
        self,
        engine: E,
        *,
        clock: Callable[[], float],
        lifecycle: MachineLifecycle | None = None,
        nodes: NodeSink | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._lifecycle = lifecycle if lifecycle is not None else MachineLifecycle()
        self._nodes = nodes
        self._owned: dict[str, str] = {}
        self._priorities: dict[str, int] = {}
        self._serving: dict[str, tuple[str, str]] = {}
        self._leaving: dict[str, tuple[int, int]] = {}
        # Shadow mode: machines a would-be operation settled in memory only
        # (bigfleet/shard/virtual.py); their provider's view is not news to the shard.
        self._virtual: dict[str, MachineRecord] = {}

    # ------------------------------------------------------------------ reading

    @property
    def engine(self) -> E:
        """The engine, for planning and reading (cycle, roll-ups, inspection).

        Machines enter and leave it only through this object's methods.
        """
        return self._engine

    @property
    def lifecycle(self) -> MachineLifecycle:
        return self._lifecycle

    @property
    def owned(self) -> Mapping[str, str]:
        """machine -> provider of every machine this shard owns (read-only)."""
        return MappingProxyType(self._owned)

    def owns(self, machine_id: str) -> bool:
        return machine_id in self._owned

    def provider_of(self, machine_id: str) -> str | None:
        return self._owned.get(machine_id)

    def machine(self, machine_id: str) -> MachineRecord | None:
        """The engine's record of the machine (None when it is not planned with)."""
        return self._engine.machine(machine_id)

    def machines(self) -> Iterator[MachineRecord]:
        return self._engine.machines()

    def priority(self, machine_id: str) -> int:
        """The priority of the workload the machine serves (0 when it serves none)."""
        return self._priorities.get(machine_id, 0)

    def priorities(self) -> Mapping[str, int]:
        """Per machine, the priority it serves now: what reports and victim choices read.

        The engine's view where it has one (the highest priority among the
        machine's cluster's needs in force that it can serve, 0 when none:
        a machine whose cluster no longer needs it is excess, as Phase 2
        already takes it). Else the workload its provider echoes it was
        configured for (:meth:`priority`). Without the engine's view a
        cluster's empty machines kept the priority of the gang that had
        left, so another shard's need could never preempt them across the
        border while the machines' own shard could (ADR 0177).
        """
        now = self._engine.serving_priorities()
        merged = dict(self._priorities)
        merged.update(now)
        return MappingProxyType(merged)

    def need(self, cluster_id: str, need_key: str) -> Need | None:
        """The need in force for a cluster with that key (the engine's), or None."""
        for need in self._engine.needs_of(cluster_id):
            if need.key == need_key:
                return need
        return None

    def victim_terms(self) -> dict[str, VictimTerms]:
        """Per configured machine: what the need it serves is worth (see :func:`victim_terms`)."""
        return victim_terms(self._serving, self._engine.needs_of)

    def busy(self) -> set[str]:
        """Machines no instruction may take: in flight, or promised to a preemptor."""
        return set(self._engine.in_flight()) | set(self._engine.promised())

    def is_leaving(self, machine_id: str) -> bool:
        return machine_id in self._leaving

    def leaving(self) -> frozenset[str]:
        return frozenset(self._leaving)

    def leaving_for(self, term: int, seq: int) -> list[str]:
        """The machines being drained for one coordinator instruction."""
        return [m for m, key in self._leaving.items() if key == (term, seq)]

    # ----------------------------------------------------------------- changing

    def hold(self, machine_id: str, provider: str, *, cluster_id: str = "") -> None:
        """The ownership record names the machine ours: observe it and act on it.

        ``cluster_id`` is the cluster the record last bound it to, so the node
        view can announce a departure that happened while no process ran.
        """
        self._owned[machine_id] = provider
        if cluster_id and self._nodes is not None:
            self._nodes.remember(machine_id, cluster_id)

    def observe(self, record: MachineRecord, workload: Workload) -> None:
        """Fold one fresh provider observation of an owned machine into every view.

        ``workload`` is what the provider echoed in ``shard_metadata``. A
        quarantined machine is ignored; a machine leaving for another shard
        updates the node view only; a machine an outcome declared FAILED
        stays FAILED while the provider reports it in motion.
        """
        mid = record.id
        if self._lifecycle.is_quarantined(mid):
            return
        if mid in self._virtual:
            return  # a shadow shard's memory of a would-be operation wins (ADR 0143)
        if mid in self._leaving:
            self._push(record)
            return
        declared = self._lifecycle.declared_failure(mid, transitional=record.state.transitional)
        if declared is not None:
            record = replace(record, state=MachineState.FAILED, last_error=declared)
        self._read_back(record, workload)
        self._engine.upsert_machine(record, now=self._clock(), need_key=workload.need_key)
        self._push(record)

    def _read_back(self, record: MachineRecord, workload: Workload) -> None:
        """The workload a machine serves, as its provider echoes it."""
        mid = record.id
        if workload.priority is not None:
            self._priorities[mid] = workload.priority
        elif not record.cluster:
            self._priorities.pop(mid, None)
        if workload.need_key and record.cluster:
            self._serving[mid] = (record.cluster, workload.need_key)
        else:
            self._serving.pop(mid, None)

    def settle(
        self,
        machine_id: str,
        record: MachineRecord | None,
        *,
        failed: str | None = None,
        cluster_hint: str = "",
        workload: Workload | None = None,
    ) -> None:
        """An operation on the machine ended, or never started: end its flight.

        ``record`` is the state it ended in (None: the machine is gone).
        ``failed`` is the error of an outcome that declared it FAILED: the
        declaration outlives provider reports of it still moving.
        ``workload``, when the caller read the provider's echo with the
        outcome (the simulator does), is folded in as an observation's is.
        """
        if workload is not None and record is not None:
            self._read_back(record, workload)
        if failed is not None:
            self._lifecycle.declare_failed(machine_id, failed)
            if record is not None:
                record = replace(record, state=MachineState.FAILED, last_error=failed)
        self._engine.settle(machine_id, record, now=self._clock())
        if record is not None:
            self._push(record, cluster_hint=cluster_hint)

    def settle_virtually(
        self, machine_id: str, record: MachineRecord, *, workload: Workload, virtual: bool = True
    ) -> None:
        """A shadow shard's would-be operation ended: end its flight in memory only.

        Nothing is pushed to the node view (no operator hears of a machine
        that never came) and nothing reaches the store or a provider. While
        ``virtual`` the machine's provider observations are ignored, since
        they describe a world the shadow shard decided not to change; a
        would-be operation that leaves the machine as its provider has it
        (a delete back to speculative) passes ``virtual=False`` and
        observations count again.
        """
        if virtual:
            self._virtual[machine_id] = record
        else:
            self._virtual.pop(machine_id, None)
        self._read_back(record, workload)
        now = self._clock()
        self._engine.settle(machine_id, record, now=now)
        if workload.need_key and record.cluster:
            # Bound to the need it was placed for, as a provider's echo would bind it.
            self._engine.upsert_machine(record, now=now, need_key=workload.need_key)

    def is_virtual(self, machine_id: str) -> bool:
        """Whether the machine is in a state only this shadow shard's memory holds."""
        return machine_id in self._virtual

    def settle_as_is(self, machine_ids: Iterable[str]) -> None:
        """Actions that were not started: their machines are planned with again."""
        for mid in machine_ids:
            self.settle(mid, self._engine.machine(mid))

    def give_away(self, machine_ids: Collection[str]) -> Departure:
        """The machines leave this shard: out of the engine, ownership and every view.

        Machines this shard does not own are skipped. The returned
        :class:`Departure` puts them back exactly (:meth:`take_back`) when
        the store refuses the move.
        """
        held: dict[str, _Held] = {}
        for mid in machine_ids:
            provider = self._owned.pop(mid, None)
            if provider is None:
                continue
            held[mid] = _Held(
                provider=provider,
                record=self._engine.machine(mid),
                priority=self._priorities.pop(mid, None),
                serving=self._serving.pop(mid, None),
                leaving=self._leaving.pop(mid, None),
            )
            self._engine.remove_machine(mid)
        return Departure(held)

    def take_back(self, departure: Departure, machine_ids: Iterable[str] | None = None) -> None:
        """Undo a :meth:`give_away` for ``machine_ids`` (all of it by default)."""
        ids = departure.held if machine_ids is None else machine_ids
        for mid in ids:
            was = departure.held.get(mid)
            if was is None:
                continue
            self._owned[mid] = was.provider
            if was.priority is not None:
                self._priorities[mid] = was.priority
            if was.serving is not None:
                self._serving[mid] = was.serving
            if was.leaving is not None:
                self._leaving[mid] = was.leaving
            elif was.record is not None:
                self._engine.upsert_machine(was.record, now=self._clock())

    def mark_leaving(self, machine_id: str, *, term: int, seq: int) -> MachineRecord | None:
        """A cross-shard victim: out of the engine, still ours until handed over idle.

        Returns the engine's record of it (None if it was not planned with).
        """
        record = self._engine.machine(machine_id)
        self._leaving[machine_id] = (term, seq)
        self._engine.remove_machine(machine_id)
        return record

    def stay(self, machine_id: str) -> None:
        """A leaving machine whose drain did not finish stays; the next observation
        brings it back into the engine."""
        self._leaving.pop(machine_id, None)

    def quarantine(self, machine_id: str, reason: str) -> None:
        """Stop using the machine: its observations are ignored from now on."""
        self._lifecycle.quarantine(machine_id, reason)
        self._engine.remove_machine(machine_id)

    def _push(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        if self._nodes is not None:
            self._nodes.push(record, cluster_hint=cluster_hint)
