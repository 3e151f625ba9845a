"""Drift between the providers, the ownership record and the engine, and what repairs it.

    providers' full List ─┐
    ownership rows (PG) ──┼─▶ find_drift(...) ─▶ (Repair, ...)  ─▶ the reconcile loop
    engine's records ─────┤                                       (bigfleet/shard/reconciler.py)
    running workflows ────┘                                        carries each one out

Pure: values in, repairs out; time is an argument. The providers are the
truth about a machine's state and binding (DESIGN §5: state is observed);
the ownership record is the truth about which shard owns it. A machine with
a running workflow is left alone: that workflow records its own outcome.

    binding-recorded  the provider has the machine bound to a cluster and the record
                      names another (or none): record the provider's binding
    binding-cleared   the record names a cluster and the provider has the machine
                      unbound: clear it
    unowned           the provider has a machine past SPECULATIVE that no shard owns:
                      reported, never acted on
    vanished          the record owns a machine its provider no longer lists: reported
    adopted           the record names this shard as the owner of a machine the shard does
                      not hold (a hand-over whose receiving step failed for good): the
                      shard takes it over, as the hand-over's second step would have
    stale-flight      the engine holds a machine in flight with no workflow running for
                      it (the workflow ended without settling): release it, so the
                      machine can be planned again — a leaked machine becomes reclaimable
    engine-refreshed  the engine's state or binding differs from the provider's: fold
                      the provider's view in
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from shard_engine.model import MachineState

__all__ = [
    "BOUND_STATES",
    "Believed",
    "Listed",
    "Recorded",
    "Repair",
    "RepairKind",
    "find_drift",
]

# States in which a provider reports a machine's cluster binding.
BOUND_STATES = frozenset({MachineState.CONFIGURING, MachineState.CONFIGURED, MachineState.DRAINING})
NONE = "(none)"


class RepairKind(enum.StrEnum):
    """What kind of drift a repair fixes (the label of ``bigfleet_reconcile_repairs_total``)."""

    BINDING_RECORDED = "binding-recorded"
    BINDING_CLEARED = "binding-cleared"
    UNOWNED = "unowned"
    VANISHED = "vanished"
    STALE_FLIGHT = "stale-flight"
    ENGINE_REFRESHED = "engine-refreshed"
    ADOPTED = "adopted"


@dataclass(frozen=True, slots=True)
class Listed:
    """One machine as its provider lists it."""

    machine_id: str
    provider: str
    state: MachineState
    cluster: str = ""

    @property
    def binding(self) -> str:
        """The cluster the provider says the machine serves ("" when unbound)."""
        return self.cluster if self.state in BOUND_STATES else ""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One ownership row of this shard: its provider and recorded cluster binding."""

    machine_id: str
    provider: str
    cluster: str | None = None


@dataclass(frozen=True, slots=True)
class Believed:
    """What the engine believes of one machine."""

    state: MachineState
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class Repair:
    """One difference and what repairs it: ``before`` -> ``after``, in words."""

    kind: RepairKind
    machine_id: str
    provider: str
    before: str
    after: str

    def describe(self) -> str:
        return f"{self.kind} {self.machine_id} ({self.provider}): {self.before} -> {self.after}"


def find_drift(
    *,
    listed: Iterable[Listed],
    listed_providers: Collection[str],
    recorded: Mapping[str, Recorded],
    owners: Mapping[str, str],
    believed: Mapping[str, Believed],
    in_flight_since: Mapping[str, float],
    busy: Collection[str],
    held: Collection[str] = (),
    unheld: Mapping[str, Recorded] | None = None,
    now: float,
    stale_after_s: float,
) -> tuple[Repair, ...]:
    """Every repair that brings the record and the engine in line with the providers.

    ``listed`` is a full List of every provider in ``listed_providers`` (a
    provider whose List failed is absent, and nothing of it is judged).
    ``owners`` maps each listed machine some shard owns to that shard;
    ``recorded`` holds this shard's rows. ``busy`` names machines of running
    workflows; ``held`` those the engine keeps out of its view on purpose
    (quarantined, declared failed, leaving for another shard).
    ``in_flight_since`` is when the engine marked each machine in flight.
    ``unheld`` holds rows that name this shard but that the shard does not hold.
    """
    repairs: list[Repair] = []
    for machine_id, mine in sorted((unheld or {}).items()):
        repairs.append(
            Repair(
                RepairKind.ADOPTED,
                machine_id,
                mine.provider,
                "recorded as this shard's, not held",
                "held" + (f", bound to {mine.cluster}" if mine.cluster else ""),
            )
        )
    seen: set[str] = set()
    for m in listed:
        seen.add(m.machine_id)
        if m.machine_id not in owners:
            if m.state != MachineState.SPECULATIVE:
                repairs.append(
                    Repair(
                        RepairKind.UNOWNED,
                        m.machine_id,
                        m.provider,
                        "owned by no shard",
                        f"{m.state.name}" + (f" for {m.cluster}" if m.binding else ""),
                    )
                )
            continue
        row = recorded.get(m.machine_id)
        if row is None or m.machine_id in busy:
            continue
        bound = m.binding
        if bound and row.cluster != bound:
            repairs.append(
                Repair(
                    RepairKind.BINDING_RECORDED,
                    m.machine_id,
                    m.provider,
                    row.cluster or NONE,
                    bound,
                )
            )
        elif not bound and row.cluster:
            repairs.append(
                Repair(RepairKind.BINDING_CLEARED, m.machine_id, m.provider, row.cluster, NONE)
            )
        if m.machine_id in held or m.machine_id in in_flight_since:
            continue
        view = believed.get(m.machine_id)
        if view is None or (view.state, view.cluster) != (m.state, m.cluster):
            repairs.append(
                Repair(
                    RepairKind.ENGINE_REFRESHED,
                    m.machine_id,
                    m.provider,
                    "unknown" if view is None else _state(view.state, view.cluster),
                    _state(m.state, m.cluster),
                )
            )
    for machine_id, row in sorted(recorded.items()):
        if row.provider in listed_providers and machine_id not in seen:
            repairs.append(
                Repair(
                    RepairKind.VANISHED,
                    machine_id,
                    row.provider,
                    f"owned, bound to {row.cluster or NONE}",
                    "not listed by its provider",
                )
            )
    for machine_id, since in sorted(in_flight_since.items()):
        if machine_id in busy or now - since < stale_after_s:
            continue
        provider = recorded[machine_id].provider if machine_id in recorded else ""
        repairs.append(
            Repair(
                RepairKind.STALE_FLIGHT,
                machine_id,
                provider,
                f"in flight for {now - since:.0f} s with no workflow running",
                "free to plan",
            )
        )
    return tuple(repairs)


def _state(state: MachineState, cluster: str) -> str:
    return state.name + (f" for {cluster}" if cluster else "")
