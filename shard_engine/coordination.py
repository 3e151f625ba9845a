"""Coordinator planning: which shard gives what to whom. Pure: values in, instructions out.

Shards report what they could spare and what they are missing. The planner
walks shortfalls from the highest priority down and resolves each in the
paper's order, stopping at the first step that covers it:

    1. idle machines of another shard          (bookkeeping only, no drain)
    2. speculative quota of another shard      (the receiver creates them)
    3. cross-shard preemption                  (only for escalated shortfalls,
                                                strictly lower priority only)

A step may take several donations: when no single profile of one donor
covers the shortfall, profiles of one or more donors are combined, largest
machines first (scarce capacity is spread over zones and capacity types, so
four GPU machines are rarely one profile). Every instruction respects a
sanity limit: no donor gives away more than ``max_share`` of its machines in
one planning round. Supply handed out is subtracted as the plan grows, so
two shortfalls never claim the same machines.

Supply is reported per profile *and rack* (``ProfileSupply.domain``, the
``topology.kubernetes.io/rack`` label; zones are already part of a
profile), so what an instruction moves stays in one rack. A need with a
``Same`` requirement (a gang) is served inside one domain: by one donor
profile that covers it whole, or, when no shard holds a domain whole, by
assembling one: the receiver's own free machines in a rack plus one or more
donors' machines in that very rack, in the rack that takes the fewest
moves (:func:`_assemble`). A gang is never spread over domains. When idle
machines alone cannot complete any rack, a gang takes, before quota alone,
a rack's idle machines and unclaimed slots of the same rack for the rest,
in the rack that reuses the most idle machines (:func:`_resolve_reuse`,
ADR 0173): one idle and one quota instruction for one shortfall.

Quota nobody owns yet is spread by :func:`distribute_evenly`, per quota
group (provider, zone, instance type, capacity type) and, for the
remainders, per instance type (:func:`quota_kind`), so a scarce type ends
up even across shards whatever its zones: four GPU machines over two shards
are two and two (ADR 0111).

Every round, whether or not anything is lacking, :func:`idle_offers` tells
each shard which idle machines the *other* shards hold (:class:`RemoteIdle`),
so a shard waits briefly for one of them instead of buying (ADR 0129): a
shard that can still buy never reports a shortfall, so step 1 alone never
sees it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from shard_engine.model import Operator, Requirement

__all__ = [
    "COOLDOWN_REPORT_INTERVALS",
    "DOMAIN_LABEL",
    "CountUse",
    "Instruction",
    "ProfileSupply",
    "RemoteIdle",
    "RemoteWant",
    "RequirementWire",
    "ShardShortfall",
    "ShardView",
    "TransferKind",
    "answer_key",
    "deal_count",
    "distribute_evenly",
    "fleet_wants",
    "grant_count",
    "idle_offers",
    "labels_satisfy",
    "plan_transfers",
    "quota_group",
    "quota_kind",
    "requirements_from",
    "units_needed",
]


#: The label whose value splits a profile's supply into domains (racks): the only
#: topology finer than a zone that a gang can ask for and a profile does not already
#: name. Machines without it report the domain "". (``catalog.LABEL_RACK``, written out:
#: the coordinator's workflows load this module, and the catalog would bring numpy.)
DOMAIN_LABEL = "topology.kubernetes.io/rack"


#: After an instruction for a shortfall ends, the coordinator plans nothing more for it
#: for this many report intervals: the receiver's next report may not show the
#: machines it adopted yet, and answering again would move (or preempt) twice.
COOLDOWN_REPORT_INTERVALS = 2


def answer_key(receiver: str, cluster_id: str, need_key: str) -> str:
    """The shortfall an instruction answers, as the coordinator tracks it.

    While an instruction with this key is in flight, and for
    :data:`COOLDOWN_REPORT_INTERVALS` report intervals after it ended, the
    coordinator plans nothing for that shortfall (its workflow and the
    simulator's round alike).
    """
    return f"{receiver}|{cluster_id}|{need_key}"


class TransferKind(StrEnum):
    """What an instruction moves. The values are carried in workflow histories and the
    instruction log (``workflows.coordinator_contracts`` carries :class:`Instruction`
    itself), so a value never changes."""

    IDLE = "idle"  # idle machines, handed over as they are
    SPECULATIVE = "speculative"  # quota: speculative slots not yet created
    PREEMPT = "preempt"  # strictly lower-priority machines, drained on the donor first


@dataclass(frozen=True, slots=True)
class ProfileSupply:
    """Machines of one shape a shard holds, by what they are doing.

    ``configured_by_priority`` counts configured machines by the priority
    they serve; they are preemption candidates for strictly higher priorities.
    """

    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    labels: Mapping[str, str]
    allocatable: Mapping[str, float]
    idle: int = 0
    speculative: int = 0
    configured_by_priority: Mapping[int, int] = field(default_factory=dict)
    #: The machines' rack (their :data:`DOMAIN_LABEL`), "" for machines without one.
    domain: str = ""

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return (self.provider, self.instance_type, self.zone, self.capacity_type, self.domain)


@dataclass(frozen=True, slots=True)
class ShardShortfall:
    """Demand a shard could not meet locally."""

    cluster_id: str
    need_key: str
    priority: int
    deficit: Mapping[str, float]
    requirements: tuple[Requirement, ...] = ()
    min_unit: Mapping[str, float] = field(default_factory=dict)
    age_cycles: int = 0
    escalated: bool = False
    #: The shard holds back its own buying for another shard's idle machine (its reason
    #: is ``REASON_AWAITING_TRANSFER``): it is short of nothing but that machine.
    awaiting_idle: bool = False


@dataclass(frozen=True, slots=True)
class ShardView:
    """The latest report of one shard."""

    shard_id: str
    total_machines: int
    supply: tuple[ProfileSupply, ...] = ()
    shortfalls: tuple[ShardShortfall, ...] = ()


@dataclass(frozen=True, slots=True)
class Instruction:
    """Move ``count`` machines of one profile from ``donor`` to ``receiver``.

    The coordinator's workflows carry this very type (``TransferSpec`` in
    ``workflows.coordinator_contracts``), so it is also a workflow contract:
    recorded histories hold its fields by name. Add a field only at the end
    and with a default; never rename or retype one (ADR 0136).
    """

    kind: TransferKind
    donor: str
    receiver: str
    provider: str
    instance_type: str
    zone: str
    capacity_type: int
    count: int
    cluster_id: str
    need_key: str
    priority: int
    # For preemption: the victims' priority must be strictly below this.
    below_priority: int = 0
    #: The rack (:data:`DOMAIN_LABEL`) the machines must be in; "" for any.
    domain: str = ""


@dataclass(frozen=True, slots=True)
class RemoteIdle:
    """Idle machines of one shape that another shard holds (its last report).

    What :func:`idle_offers` hands a shard and ``ShardEngine.set_fleet_idle``
    takes (``fleet_idle.FleetIdle`` decides whether a need waits for one).
    """

    shard_id: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, float]
    count: int
    #: Unclaimed slots of the same profile (and rack) the donor could give with them:
    #: a gang short of a rack of idle machines may take them and claim the rest of
    #: the rack there (ADR 0173). Needs that are not gangs wait for idle machines only.
    speculative: int = 0


@dataclass(frozen=True, slots=True)
class RemoteWant:
    """A need another shard could not meet at its last report (its shortfall).

    What :func:`fleet_wants` hands a shard beside the idle offers: before a
    need takes one of the shard's idle machines, Phase 1 asks whether an
    older need of another shard, of at least its priority, could use it
    (``fleet_idle.FleetIdle.yields``, ADR 0176).
    """

    shard_id: str
    priority: int
    requirements: tuple[Requirement, ...]
    deficit: Mapping[str, float]
    min_unit: Mapping[str, float]
    #: Consecutive cycles the need has been short (its shard's count).
    age_cycles: int


class RequirementWire(Protocol):
    """A requirement as a report carries it: the operator as its wire number."""

    @property
    def key(self) -> str: ...

    @property
    def operator(self) -> int: ...

    @property
    def values(self) -> Sequence[str]: ...


def requirements_from(specs: Iterable[RequirementWire]) -> tuple[Requirement, ...]:
    """Reported requirements as the planner and the engine take them.

    Raises ValueError for an operator number this code does not know (a
    report from newer code).
    """
    return tuple(Requirement(r.key, Operator(r.operator), tuple(r.values)) for r in specs)


def fleet_wants(
    views: Mapping[str, ShardView], *, receivers: Collection[str] | None = None
) -> dict[str, tuple[RemoteWant, ...]]:
    """For each receiving shard, every *other* shard's shortfalls as :class:`RemoteWant`.

    ``receivers`` as for :func:`idle_offers` (every reporting shard when
    None); each gets an entry, empty when no other shard lacks anything.
    """
    wants = [
        RemoteWant(
            shard_id=sid,
            priority=sf.priority,
            requirements=tuple(sf.requirements),
            deficit=dict(sf.deficit),
            min_unit=dict(sf.min_unit),
            age_cycles=sf.age_cycles,
        )
        for sid, view in views.items()
        for sf in view.shortfalls
        if any(amount > 0 for amount in sf.deficit.values())
    ]
    targets = views.keys() if receivers is None else receivers
    return {r: tuple(w for w in wants if w.shard_id != r) for r in targets}


def idle_offers(
    views: Mapping[str, ShardView],
    *,
    receivers: Collection[str] | None = None,
    planned: Iterable[Instruction] = (),
    max_share: float = 0.05,
) -> dict[str, tuple[RemoteIdle, ...]]:
    """For each receiving shard, the idle machines of every *other* shard, per profile.

    :func:`offered_idle`, less each receiver's own. ``receivers`` are the
    shards that may take a transfer (the active ones; every reporting shard
    when None). Every receiver gets an entry, empty when nothing is on
    offer, so the caller replaces a shard's stale offers.
    """
    on_offer = offered_idle(views, planned=planned, max_share=max_share)
    wanted = sorted(views if receivers is None else receivers)
    return {r: tuple(o for o in on_offer if o.shard_id != r) for r in wanted}


def offered_idle(
    views: Mapping[str, ShardView],
    *,
    planned: Iterable[Instruction] = (),
    max_share: float = 0.05,
) -> tuple[RemoteIdle, ...]:
    """Every shard's idle machines on offer to the others, per profile.

    ``views`` are the shards' latest reports; every shard that reports is a
    donor, a draining one included (its idle machines are the first that
    should move). ``planned`` is what this
    round's :func:`plan_transfers` already handed out: an idle machine it
    moves is no longer on offer, and a donor's ``max_share`` budget (the
    same sanity limit as :func:`plan_transfers`) shrinks by what it gives.
    Each offer is capped at what is left of that budget, since a need that
    waits for more than the coordinator can move in a round waits in vain.
    An offer also carries the profile's unclaimed slots (``speculative``),
    within what is left of the budget after its idle machines, less what
    this round's quota transfers take: a gang may take a rack's idle
    machines with new ones of the same rack (ADR 0173).

    Offers are sorted by donor and profile key (a stable answer, and what a
    shard's Phase 1 tries first). One list for every receiver, each leaving
    out its own (:func:`idle_offers`): its size grows with the fleet's idle
    profiles, not with their number times the shards'.
    """
    budget = {sid: max(1, int(v.total_machines * max_share)) for sid, v in views.items()}
    taken: dict[tuple[str, tuple[str, str, str, int, str], TransferKind], int] = defaultdict(int)
    for ins in planned:
        if ins.donor in budget:
            budget[ins.donor] -= ins.count
        key = (ins.provider, ins.instance_type, ins.zone, ins.capacity_type, ins.domain)
        taken[(ins.donor, key, ins.kind)] += ins.count
    on_offer: list[RemoteIdle] = []
    for donor, view in sorted(views.items()):
        for supply in sorted(view.supply, key=lambda s: s.key):
            if supply.idle <= 0:
                continue
            idle = supply.idle - taken.get((donor, supply.key, TransferKind.IDLE), 0)
            count = min(idle, budget[donor])
            if count > 0:
                spare = supply.speculative - taken.get(
                    (donor, supply.key, TransferKind.SPECULATIVE), 0
                )
                on_offer.append(
                    RemoteIdle(
                        shard_id=donor,
                        labels=dict(supply.labels),
                        allocatable=dict(supply.allocatable),
                        count=count,
                        speculative=max(0, min(spare, budget[donor] - count)),
                    )
                )
    return tuple(on_offer)


def labels_satisfy(requirements: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    """Do a machine's labels satisfy every requirement? (SAME checks existence and values.)"""
    for req in requirements:
        value = labels.get(req.key)
        op = req.operator
        if op is Operator.IN and value not in req.values:
            return False
        if op is Operator.NOT_IN and value in req.values:
            return False
        if op is Operator.EXISTS and value is None:
            return False
        if op is Operator.DOES_NOT_EXIST and value is not None:
            return False
        if op is Operator.SAME and (value is None or (req.values and value not in req.values)):
            return False
    return True


def _covers(allocatable: Mapping[str, float], unit: Mapping[str, float]) -> bool:
    return all(allocatable.get(k, 0.0) >= v for k, v in unit.items() if v > 0)


def units_needed(deficit: Mapping[str, float], allocatable: Mapping[str, float]) -> int:
    """Machines of this shape needed to cover ``deficit``; 0 if it covers nothing needed."""
    count = 0
    for name, amount in deficit.items():
        if amount <= 0:
            continue
        per = allocatable.get(name, 0.0)
        if per <= 0:
            return 0
        count = max(count, math.ceil(amount / per - 1e-9))
    return count


def plan_transfers(views: Mapping[str, ShardView], *, max_share: float = 0.05) -> list[Instruction]:
    """Plan instructions for every reported shortfall, highest priority first."""
    budget = {sid: max(1, int(v.total_machines * max_share)) for sid, v in views.items()}
    # What this round's instructions took, per (donor, profile key, bucket); what
    # is left is a supply's count less this. Kept sparse: a fleet's shards
    # report hundreds of shapes and a round takes from a few of them.
    taken: _Taken = defaultdict(int)
    donors = sorted(views.items())
    shortfalls = sorted(
        ((sid, sf) for sid, v in views.items() for sf in v.shortfalls),
        key=lambda item: (-item[1].priority, -item[1].age_cycles, item[0], item[1].cluster_id),
    )
    out: list[Instruction] = []
    for receiver, sf in shortfalls:
        for kind in (TransferKind.IDLE, TransferKind.SPECULATIVE, TransferKind.PREEMPT):
            if kind is TransferKind.PREEMPT and not sf.escalated:
                break
            if kind is not TransferKind.IDLE and sf.awaiting_idle:
                # It could buy; it waits for a machine already paid for. When that is
                # gone by now, it buys with its own quota next cycle, and reports what
                # it still lacks then (ADR 0129).
                break
            donations = _resolve(donors, receiver, sf, kind, taken, budget, views)
            if not donations and kind is TransferKind.IDLE and _is_gang(sf):
                # A rack's idle machines and its unclaimed slots together (ADR 0173).
                donations = _resolve_reuse(donors, receiver, sf, taken, budget, views)
            if donations:
                out.extend(donations)
                break
    return out


#: Machines this round's instructions took, per (donor, profile key, bucket); a
#: bucket is "idle", "speculative" or "p<priority>" (configured machines serving it).
_Taken = defaultdict[tuple[str, tuple[str, str, str, int, str], str], int]


@dataclass(frozen=True, slots=True)
class _Offer:
    """What one donor can give of one profile for one shortfall and step."""

    donor: str
    supply: ProfileSupply
    #: The buckets it gives from, in order, each with what is left of it.
    buckets: tuple[tuple[str, int], ...]
    available: int


def _buckets(supply: ProfileSupply, kind: TransferKind, below: int) -> tuple[tuple[str, int], ...]:
    """The buckets of ``supply`` a step of ``kind`` takes from, with what each reports."""
    if kind is TransferKind.IDLE:
        return ((kind.value, supply.idle),) if supply.idle > 0 else ()
    if kind is TransferKind.SPECULATIVE:
        return ((kind.value, supply.speculative),) if supply.speculative > 0 else ()
    configured = supply.configured_by_priority
    return tuple((f"p{prio}", configured[prio]) for prio in sorted(configured) if prio < below)


def _offers(
    donors: Sequence[tuple[str, ShardView]],
    receiver: str,
    sf: ShardShortfall,
    kind: TransferKind,
    taken: _Taken,
    budget: Mapping[str, int],
) -> list[_Offer]:
    """Every donor profile that may serve ``sf`` in this step, with how much is left of it."""
    offers: list[_Offer] = []
    for donor, view in donors:
        if donor == receiver or budget[donor] <= 0:
            continue
        for supply in view.supply:
            # What is left first: it costs an attribute or two, the checks below more.
            reported = _buckets(supply, kind, sf.priority)
            if not reported:
                continue
            key = supply.key
            buckets = tuple((b, n - taken.get((donor, key, b), 0)) for b, n in reported)
            available = sum(n for _, n in buckets)
            if available <= 0:
                continue
            if not labels_satisfy(sf.requirements, supply.labels):
                continue
            if not _covers(supply.allocatable, sf.min_unit):
                continue
            if units_needed(sf.deficit, supply.allocatable) <= 0:
                continue
            offers.append(_Offer(donor, supply, buckets, available))
    return offers


def _combine(
    offers: Sequence[_Offer], deficit: Mapping[str, float], budget: Mapping[str, int]
) -> list[tuple[_Offer, int]]:
    """Several profiles that together cover ``deficit``; empty if all of them cannot."""
    plan, uncovered = _take(offers, deficit, budget)
    return plan if not uncovered else []


def _take(
    offers: Sequence[_Offer], deficit: Mapping[str, float], budget: Mapping[str, int]
) -> tuple[list[tuple[_Offer, int]], dict[str, float]]:
    """As much of ``deficit`` as ``offers`` cover, and what they leave uncovered.

    Largest contribution per machine first (fewest machines for the whole
    deficit), then the donor and profile for a stable answer; each takes
    what the rest of the deficit needs, within what is left and the donor's
    budget.
    """
    remaining = {k: v for k, v in deficit.items() if v > 0}
    spent: dict[str, int] = defaultdict(int)
    plan: list[tuple[_Offer, int]] = []
    order = sorted(
        offers,
        key=lambda o: (units_needed(deficit, o.supply.allocatable), o.donor, o.supply.key),
    )
    for offer in order:
        if not remaining:
            break
        need = units_needed(remaining, offer.supply.allocatable)
        take = min(need, offer.available, budget[offer.donor] - spent[offer.donor])
        if take <= 0:
            continue
        plan.append((offer, take))
        spent[offer.donor] += take
        for name in list(remaining):
            remaining[name] -= take * offer.supply.allocatable.get(name, 0.0)
            if remaining[name] <= 1e-9 * max(1.0, deficit[name]):
                del remaining[name]
    return plan, remaining


def _short_after_own(sf: ShardShortfall, own: FreeShapes) -> dict[str, float]:
    """What gang ``sf`` lacks in a rack after the receiver's own free machines there."""
    rest = dict(sf.deficit)
    for allocatable, count in own:
        for name in rest:
            rest[name] -= count * allocatable.get(name, 0.0)
    return {k: v for k, v in rest.items() if v > 1e-9 * max(1.0, sf.deficit[k])}


def _is_gang(sf: ShardShortfall) -> bool:
    return any(r.operator is Operator.SAME for r in sf.requirements)


#: Free machines of one shape: (allocatable, count).
FreeShapes = list[tuple[Mapping[str, float], int]]


def _own_in_domains(view: ShardView | None, sf: ShardShortfall) -> dict[str, FreeShapes]:
    """Per rack, the free machines the receiver itself holds that may serve gang ``sf``."""
    own: dict[str, FreeShapes] = defaultdict(list)
    if view is None:
        return own
    for supply in view.supply:
        free = supply.idle + supply.speculative
        if not supply.domain or free <= 0:
            continue
        if labels_satisfy(sf.requirements, supply.labels) and _covers(
            supply.allocatable, sf.min_unit
        ):
            own[supply.domain].append((supply.allocatable, free))
    return own


def _assemble(
    offers: Sequence[_Offer],
    sf: ShardShortfall,
    own: Mapping[str, FreeShapes],
    budget: Mapping[str, int],
) -> list[tuple[_Offer, int]]:
    """A gang's domain put together from what the receiver holds there and donors' machines.

    For every rack some donor offers machines in: the gang's deficit less
    the receiver's own free machines in that rack, covered by the donors'
    machines in the same rack (:func:`_combine`, one donor or several).
    The rack that takes the fewest machines wins (then the name, for a
    stable answer); a rack where the receiver already holds the whole gang
    is left to its own cycle. Empty when no rack can be completed.
    """
    by_domain: dict[str, list[_Offer]] = defaultdict(list)
    for offer in offers:
        if offer.supply.domain:
            by_domain[offer.supply.domain].append(offer)
    best: tuple[int, str, list[tuple[_Offer, int]]] | None = None
    for domain, group in sorted(by_domain.items()):
        rest = _short_after_own(sf, own.get(domain, []))
        if not rest:
            continue
        plan = _combine(group, rest, budget)
        moved = sum(count for _, count in plan)
        if plan and (best is None or moved < best[0]):
            best = (moved, domain, plan)
    return best[2] if best is not None else []


def _resolve(
    donors: Sequence[tuple[str, ShardView]],
    receiver: str,
    sf: ShardShortfall,
    kind: TransferKind,
    taken: _Taken,
    budget: dict[str, int],
    views: Mapping[str, ShardView],
) -> list[Instruction]:
    """Donations of one step that together cover ``sf``, or none if they cannot.

    One profile that covers the whole deficit wins when there is one (fewest
    machines first), so one instruction does it. Otherwise several profiles,
    of one donor or several, are combined (:func:`_combine`). A gang (a
    ``Same`` requirement) stays in one rack: one profile's rack that holds it
    whole, or a rack assembled from the receiver's own machines there and
    donors' machines in it (:func:`_assemble`).
    """
    offers = _offers(donors, receiver, sf, kind, taken, budget)
    plan: list[tuple[_Offer, int]] = []
    best: tuple[int, _Offer] | None = None
    for offer in offers:
        need = units_needed(sf.deficit, offer.supply.allocatable)
        fits = need <= offer.available and need <= budget[offer.donor]
        if fits and (best is None or need < best[0]):
            best = (need, offer)
    if best is not None:
        plan = [(best[1], best[0])]
    elif not _is_gang(sf):
        plan = _combine(offers, sf.deficit, budget)
    else:
        plan = _assemble(offers, sf, _own_in_domains(views.get(receiver), sf), budget)
    return [_instruct(kind, offer, count, receiver, sf, taken, budget) for offer, count in plan]


def _instruct(
    kind: TransferKind,
    offer: _Offer,
    count: int,
    receiver: str,
    sf: ShardShortfall,
    taken: _Taken,
    budget: dict[str, int],
) -> Instruction:
    """The instruction moving ``count`` of ``offer``'s machines; books what it takes."""
    remaining = count
    for bucket, left in offer.buckets:
        take = min(max(left, 0), remaining)
        taken[(offer.donor, offer.supply.key, bucket)] += take
        remaining -= take
        if remaining == 0:
            break
    budget[offer.donor] -= count
    return Instruction(
        kind=kind,
        donor=offer.donor,
        receiver=receiver,
        provider=offer.supply.provider,
        instance_type=offer.supply.instance_type,
        zone=offer.supply.zone,
        capacity_type=offer.supply.capacity_type,
        count=count,
        cluster_id=sf.cluster_id,
        need_key=sf.need_key,
        priority=sf.priority,
        below_priority=sf.priority if kind is TransferKind.PREEMPT else 0,
        domain=offer.supply.domain,
    )


def _resolve_reuse(
    donors: Sequence[tuple[str, ShardView]],
    receiver: str,
    sf: ShardShortfall,
    taken: _Taken,
    budget: dict[str, int],
    views: Mapping[str, ShardView],
) -> list[Instruction]:
    """A gang's rack completed from donors' idle machines there and, for the rest, their
    unclaimed slots in the same rack (ADR 0173); none when no rack can be.

    For every rack some donor holds idle machines in: the gang's deficit less
    the receiver's own free machines there, first from the donors' idle
    machines in the rack (as many as it takes, fewest machines first), then
    from their unclaimed slots in it (:func:`_combine`). The rack that reuses
    the most idle machines wins, then the one moving fewest machines, then
    the name. Only after the idle step alone found no rack: a rack of idle
    machines is better still, and only before quota alone: quota moves no
    machine already paid for.
    """
    idle = [
        o
        for o in _offers(donors, receiver, sf, TransferKind.IDLE, taken, budget)
        if o.supply.domain
    ]
    if not idle:
        return []
    slots = [
        o
        for o in _offers(donors, receiver, sf, TransferKind.SPECULATIVE, taken, budget)
        if o.supply.domain
    ]
    own = _own_in_domains(views.get(receiver), sf)
    best: tuple[tuple[int, int, str], list[tuple[TransferKind, _Offer, int]]] | None = None
    for domain in sorted({o.supply.domain for o in idle}):
        short = _short_after_own(sf, own.get(domain, []))
        if not short:
            continue
        reuse, rest = _take([o for o in idle if o.supply.domain == domain], short, budget)
        reused = sum(count for _, count in reuse)
        if not rest or reused == 0:
            continue  # the idle step alone covers it (or nothing here is idle)
        left = dict(budget)
        for offer, count in reuse:
            left[offer.donor] -= count
        completion = _combine([o for o in slots if o.supply.domain == domain], rest, left)
        if not completion:
            continue
        plan = [(TransferKind.IDLE, o, n) for o, n in reuse]
        plan += [(TransferKind.SPECULATIVE, o, n) for o, n in completion]
        rank = (-reused, reused + sum(n for _, n in completion), domain)
        if best is None or rank < best[0]:
            best = (rank, plan)
    if best is None:
        return []
    return [_instruct(kind, offer, n, receiver, sf, taken, budget) for kind, offer, n in best[1]]


def quota_group(provider: str, zone: str, instance_type: str, capacity_type: int) -> str:
    """The key quota is distributed by: ``provider/zone/instance type/capacity type``."""
    return f"{provider}/{zone}/{instance_type}/{int(capacity_type)}"


def quota_kind(group: str) -> str:
    """The scarce resource a quota group holds: its provider and instance type.

    Other group keys (a rack, a test's ``"g"``) are their own kind.
    """
    rest, slash, _capacity = group.rpartition("/")
    rest, slash2, instance_type = rest.rpartition("/")
    provider, slash3, _zone = rest.rpartition("/")
    if not (slash and slash2 and slash3):
        return group
    return f"{provider}/{instance_type}"


def distribute_evenly(
    groups: Mapping[str, Sequence[str]],
    shards: Sequence[str],
    current: Mapping[str, Mapping[str, int]],
) -> dict[str, list[str]]:
    """Spread unowned items of each group over ``shards`` so counts even out.

    ``groups`` maps a group key (a quota group, see :func:`quota_group`, or a
    whole rack) to its unowned item ids; ``current`` gives each shard's count
    per group already owned. Items go one at a time to the shard with the
    fewest of that group; among those, to the one with the fewest of the
    group's kind (:func:`quota_kind`: the instance type whatever its zone and
    capacity type), then the fewest items overall, then by shard id. So the
    remainders of small groups rotate over the shards instead of all landing
    on the first: four GPU machines in four (zone, capacity type) groups over
    two shards are two and two, not four and none. Repeated runs are stable.
    Returns shard -> items assigned.
    """
    if not shards:
        return {}
    out: dict[str, list[str]] = {s: [] for s in shards}
    by_group = {s: dict(current.get(s, {})) for s in shards}
    by_kind: dict[str, dict[str, int]] = {s: defaultdict(int) for s in shards}
    total = dict.fromkeys(shards, 0)
    for s in shards:
        for group, count in by_group[s].items():
            by_kind[s][quota_kind(group)] += count
            total[s] += count
    for group, items in sorted(groups.items()):
        kind = quota_kind(group)
        for item in sorted(items):
            target = min(
                shards,
                key=lambda s: (by_group[s].get(group, 0), by_kind[s][kind], total[s], s),
            )
            out[target].append(item)
            by_group[target][group] = by_group[target].get(group, 0) + 1
            by_kind[target][kind] += 1
            total[target] += 1
    return {s: ids for s, ids in out.items() if ids}


# -- fleet-wide count budgets (ADR 0140) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class CountUse:
    """One shard's use of a count budget: machines in its scope, those draining now, and
    the drains the budget held back there in its last cycle (what it would start now)."""

    shard_id: str
    in_scope: int
    draining: int
    held: int = 0
    # The share it drains under now: it may start drains up to it until it has
    # applied a smaller one, whatever it was granted since.
    in_force: int = 0


def deal_count(cap: int, uses: Sequence[CountUse]) -> dict[str, int]:
    """Deal a fleet-wide count ``cap`` to the shards: shard id -> its share.

    1. Each shard keeps what it is draining now (a drain in flight is never
       revoked).
    2. What is left goes one machine at a time to the shards that have drains
       held back (up to that many each), to the one furthest below its fair
       part ``cap × in_scope / Σ in_scope`` first (equal parts when no shard
       has a machine in scope), ties by shard id.
    3. Whatever is still left goes the same way to every shard, so a shard
       whose drains start next cycle has room without waiting for a deal.

    The shares sum to ``cap`` exactly, unless the drains in flight already
    exceed it (after a restart or a lowered cap): then each share is what that
    shard drains, and nothing new starts anywhere until drains finish.
    Integers throughout ("below its fair part" is ``cap·w − share·Σw``), so
    the coordinator and a test compute the same.
    """
    if cap < 0:
        raise ValueError(f"cap: {cap} is negative")
    ordered = sorted(uses, key=lambda u: u.shard_id)
    if len({u.shard_id for u in ordered}) != len(ordered):
        raise ValueError("uses: a shard appears twice")
    shares = {u.shard_id: max(0, u.draining) for u in ordered}
    left = cap - sum(shares.values())
    if left <= 0 or not ordered:
        return shares
    weights = {u.shard_id: max(0, u.in_scope) for u in ordered}
    if sum(weights.values()) == 0:
        weights = dict.fromkeys(weights, 1)
    total = sum(weights.values())
    wants = {u.shard_id: max(0, u.held) for u in ordered}

    def furthest_below(candidates: list[str]) -> str:
        return min(candidates, key=lambda s: (shares[s] * total - cap * weights[s], s))

    for _ in range(left):
        wanting = [s for s, n in wants.items() if n > 0]
        target = furthest_below(wanting or list(shares))
        shares[target] += 1
        if wanting:
            wants[target] -= 1
    return shares


def grant_count(
    cap: int, uses: Sequence[CountUse], *, asking: str, granted: Mapping[str, int]
) -> int:
    """The share of a count budget to grant ``asking`` now, given what the others hold.

    Shares are granted one shard at a time (each asks after its report), so
    the dealt share is also bounded by what the other shards may already be
    using: the cap less, for each other shard, the largest of its last
    grant, its drains and the share it said it drains under (a grant it has
    not applied yet does not free the share it still uses, ADR 0168). The
    grants recorded therefore never sum past the cap (while the drains in
    flight stay under it). Never below what ``asking`` drains now.
    """
    dealt = deal_count(cap, uses).get(asking, 0)
    own = next((max(0, u.draining) for u in uses if u.shard_id == asking), 0)
    others = sum(
        max(granted.get(u.shard_id, 0), u.draining, u.in_force, 0)
        for u in uses
        if u.shard_id != asking
    )
    others += sum(
        g for s, g in granted.items() if s != asking and s not in {u.shard_id for u in uses}
    )
    return max(own, min(dealt, cap - others))
