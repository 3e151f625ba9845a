"""The fleet's idle machines as one shard sees them: idle first means fleet-wide.

Phase 1 takes a shard's own idle machines before creating or claiming new
ones. With several shards that stopped at the shard's border: shard B
created (or claimed bare metal) while shard A held matching idle machines,
and paid for both (issue 18: two clusters in sequence cost $21.60 on two
shards against $14.40 on one). The coordinator already moves idle machines
between shards first (its step 1), but only for a *shortfall*, and a shard
that can still buy never reports one.

So the coordinator (or whatever runs its rounds) hands each shard the idle
machines the *other* shards reported (:class:`RemoteIdle`), and before a
need draws on speculative capacity Phase 1 asks :class:`FleetIdle`: if
another shard holds an idle machine that fits the need, the need waits for
it — reported as a shortfall, so the coordinator's idle transfer brings
the machine — for at most ``fleet_idle_wait_seconds``. A transfer of an
idle machine is bookkeeping plus a configure; a create is a launch plus a
configure; bare metal claimed is paid for as long as the run. If the
transfer has not come within the wait, the need buys as before.

A gang (a ``Same`` requirement) waits only while it holds none of its
machines, and only for one domain that then holds it whole: the
coordinator moves a gang's machines inside one rack (ADR 0172). A gang
that already runs somewhere grows where it runs. Phase 1 asks for a gang
before taking any of its shard's idle machines when those cannot hold it
whole. The domain may be completed with the shard's own free machines in
it and the donors' unclaimed slots there, when that reuses more idle
machines than any rack the shard could serve the gang from alone
(ADR 0173): two idle servers of another shard's rack and one new one
beside them cost one claim where the shard's own rack would take three.

Pure and clock-free: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# RemoteIdle is the coordinator's word (``coordination.idle_offers`` computes them).
from shard_engine.coordination import RemoteIdle, RemoteWant, labels_satisfy
from shard_engine.model import Need, Operator

__all__ = ["FleetIdle", "IdleShape", "OwnRack", "RemoteIdle", "RemoteWant"]


@dataclass(frozen=True, slots=True)
class IdleShape:
    """Idle machines of one profile the shard holds and a need could take."""

    labels: Mapping[str, str]
    allocatable: Mapping[str, float]
    count: int


@dataclass(frozen=True, slots=True)
class OwnRack:
    """What the shard itself holds free in one of a gang's domains, in resources."""

    #: Its idle machines there (paid for already).
    idle: Mapping[str, float]
    #: Its idle machines and unclaimed slots there.
    free: Mapping[str, float]


@dataclass(slots=True)
class FleetIdle:
    """Other shards' idle machines, and since when each need has waited for one.

    ``offers`` is replaced whole by :meth:`update` each coordinator round;
    within a cycle :meth:`wait` spends them, so two needs do not wait for
    the same machine.
    """

    wait_seconds: float = 60.0
    offers: tuple[RemoteIdle, ...] = ()
    waiting_since: dict[tuple[int, str], float] = field(default_factory=dict)
    #: The other shards' shortfalls at the last round (ADR 0176).
    wants: tuple[RemoteWant, ...] = ()
    #: Since when each need has left the shard's idle machines to an older want.
    yielding_since: dict[tuple[int, str], float] = field(default_factory=dict)
    _left: list[int] = field(default_factory=list)
    _left_slots: list[int] = field(default_factory=list)

    def update(self, offers: Sequence[RemoteIdle], wants: Sequence[RemoteWant] = ()) -> None:
        """Replace what the other shards hold idle and lack (empty sequences: nothing).

        An offer of unclaimed slots alone (no idle machine) is kept: it is the
        rest of a rack a gang waits for, still on its way (ADR 0173).
        """
        self.offers = tuple(o for o in offers if o.count > 0 or o.speculative > 0)
        self.wants = tuple(wants)
        self.begin_cycle()

    @property
    def active(self) -> bool:
        """Is there anything of the fleet for Phase 1 to consult?"""
        return bool(self.offers or self.wants)

    def yields(
        self,
        *,
        cluster: int,
        key: str,
        need: Need,
        age_cycles: int,
        idle: Sequence[IdleShape],
        now: float,
    ) -> bool:
        """Should this need leave the shard's idle machines to an older need of another shard?

        Idle first is fleet-wide, and so is oldest first (ADR 0176): a need
        does not take an idle machine that a want of another shard could use
        when that want is of a higher priority, or of the same priority and
        short for more cycles than this need has been (``age_cycles``). A
        want could use ``idle`` when its requirements hold on a machine's
        labels and its ``min_unit`` fits; a gang's want needs, in one of its
        domains, the machines its deficit takes. The coordinator's idle step
        moves them at its next round. A need yields for at most
        ``wait_seconds`` from the first time, then takes what it finds: the
        want may not have been able to use them after all. A need that
        yields to nothing forgets its wait.
        """
        since_key = (cluster, key)
        for want in self.wants:
            if want.priority < need.priority or (
                want.priority == need.priority and want.age_cycles <= age_cycles
            ):
                continue
            if not _usable(want, idle):
                continue
            started = self.yielding_since.setdefault(since_key, now)
            return now - started < self.wait_seconds
        self.yielding_since.pop(since_key, None)
        return False

    def begin_cycle(self) -> None:
        """Every offer is whole again at the start of a cycle."""
        self._left = [o.count for o in self.offers]
        self._left_slots = [o.speculative for o in self.offers]

    def wait(
        self,
        *,
        cluster: int,
        key: str,
        need: Need,
        deficit: Mapping[str, float],
        now: float,
        holds_none: bool = True,
        own: Mapping[tuple[str, ...], OwnRack] | None = None,
    ) -> bool:
        """Should this need wait for another shard's idle machine instead of buying now?

        True when the offers that fit the need (requirements, ``min_unit``,
        and they offer something the deficit lacks) together cover the whole
        deficit, and the need has waited less than ``wait_seconds`` since it
        first did; the machines it waits for are then spent for this cycle.
        False otherwise, and the wait is over: the coordinator's idle step
        moves machines only for a shortfall they cover whole, so a need
        larger than what is on offer buys now (what it buys of its own first
        leaves a smaller shortfall, which the idle step may then cover).

        A gang's offers must cover it inside one domain (the values of its
        ``Same`` labels), and a gang waits only when ``holds_none``: one
        that holds machines in its domain can only be completed there.
        With ``own`` (the shard's own free machines per domain of the gang)
        a gang also waits for a domain its own free machines there, the
        offers' idle machines and their unclaimed slots cover together,
        when that reuses more idle machines than the best domain the shard
        could serve it from alone (:meth:`_reuse`, ADR 0173).
        """
        since_key = (cluster, key)
        same = tuple(r.key for r in need.requirements if r.operator is Operator.SAME)
        if not self.offers or (same and not holds_none):
            self.waiting_since.pop(since_key, None)
            return False
        started = self.waiting_since.get(since_key, now)
        if now - started >= self.wait_seconds:
            return False  # waited long enough: buy (the entry stays until the need is met)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, offer in enumerate(self.offers):
            # A gang may also take an offer's unclaimed slots (``_reuse``); others may not.
            spare = self._left[i] > 0 or (same and own is not None and self._left_slots[i] > 0)
            if not spare or not labels_satisfy(need.requirements, offer.labels):
                continue
            if any(offer.allocatable.get(k, 0.0) < v for k, v in need.min_unit.items() if v > 0):
                continue
            groups.setdefault(tuple(offer.labels.get(k, "") for k in same), []).append(i)
        for members in groups.values():  # one group for a need that is not a gang
            spend = self._cover(members, deficit)
            if spend is None:
                continue
            for i, take in spend:
                self._left[i] -= take
            self.waiting_since[since_key] = started
            return True
        if same and own is not None and self._reuse(groups, deficit, own):
            self.waiting_since[since_key] = started
            return True
        # The coordinator's idle step covers a shortfall whole or not at all, so a
        # need the offers cannot cover would wait the whole bound for nothing.
        self.waiting_since.pop(since_key, None)
        return False

    def _reuse(
        self,
        groups: Mapping[tuple[str, ...], Sequence[int]],
        deficit: Mapping[str, float],
        own: Mapping[tuple[str, ...], OwnRack],
    ) -> bool:
        """Spend the offers of the domain that completes a gang reusing the most idle machines.

        A domain qualifies when the shard's own free machines there fall
        short of the gang (else it is served here, as the coordinator would
        leave it), the offers' idle machines and unclaimed slots there cover
        the rest, and the idle machines there (own and offered) cover more of
        the gang than the idle machines of the best domain the shard could
        hold the gang in by itself. Coverage is summed over the deficit's
        resources, each capped at what the gang needs. The offers' idle
        machines are spent first, then their slots, as the coordinator's
        ``plan_transfers`` moves them.
        """
        wanted = {k: v for k, v in deficit.items() if v > 0}

        def cover(amounts: Mapping[str, float]) -> float:
            return sum(min(amounts.get(k, 0.0), v) / v for k, v in wanted.items())

        def short(amounts: Mapping[str, float], of: Mapping[str, float]) -> dict[str, float]:
            rest = {k: v - amounts.get(k, 0.0) for k, v in of.items()}
            return {k: v for k, v in rest.items() if v > 1e-9 * max(1.0, wanted[k])}

        # The idle machines of the best domain this shard holds the gang in by itself.
        alone = max(
            (cover(r.idle) for r in own.values() if not short(r.free, wanted)), default=-1.0
        )
        best: tuple[float, tuple[str, ...], dict[str, float]] | None = None
        for key, members in groups.items():
            here = own.get(key, OwnRack({}, {}))
            rest = short(here.free, wanted)
            if not rest:
                continue  # this shard holds the gang there itself
            idle = dict(here.idle)
            offered: dict[str, float] = {}
            for i in members:
                for name, per in self.offers[i].allocatable.items():
                    idle[name] = idle.get(name, 0.0) + self._left[i] * per
                    offered[name] = (
                        offered.get(name, 0.0) + (self._left[i] + self._left_slots[i]) * per
                    )
            reuse = cover(idle)
            if short(offered, rest) or reuse <= alone + 1e-9:
                continue
            if best is None or reuse > best[0]:
                best = (reuse, key, rest)
        if best is None:
            return False
        rest = best[2]
        for left in (self._left, self._left_slots):
            for i in groups[best[1]]:
                if not rest:
                    return True
                shape = self.offers[i].allocatable
                take = min(_machines_for(rest, shape), left[i])
                left[i] -= take
                rest = short({k: take * shape.get(k, 0.0) for k in rest}, rest)
        return True

    def _cover(
        self, members: Sequence[int], deficit: Mapping[str, float]
    ) -> list[tuple[int, int]] | None:
        """Machines of offers ``members``, in order, that cover ``deficit``; None if they cannot."""
        remaining = {k: v for k, v in deficit.items() if v > 0}
        spend: list[tuple[int, int]] = []
        for i in members:
            if not remaining:
                break
            offer = self.offers[i]
            machines = _machines_for(remaining, offer.allocatable)
            if machines <= 0:
                continue
            take = min(machines, self._left[i])
            spend.append((i, take))
            for name in list(remaining):
                remaining[name] -= take * offer.allocatable.get(name, 0.0)
                if remaining[name] <= 1e-9 * max(1.0, deficit[name]):
                    del remaining[name]
        return None if remaining else spend

    def met(self, cluster: int, key: str) -> None:
        """The need is covered: a later shortage waits afresh."""
        self.waiting_since.pop((cluster, key), None)
        self.yielding_since.pop((cluster, key), None)


def _usable(want: RemoteWant, idle: Sequence[IdleShape]) -> bool:
    """Could ``want`` use these idle machines (a gang: enough of them in one domain)?"""
    same = tuple(r.key for r in want.requirements if r.operator is Operator.SAME)
    per_domain: dict[tuple[str, ...], int] = {}
    for shape in idle:
        if shape.count <= 0 or not labels_satisfy(want.requirements, shape.labels):
            continue
        if any(shape.allocatable.get(k, 0.0) < v for k, v in want.min_unit.items() if v > 0):
            continue
        needed = _machines_for(want.deficit, shape.allocatable)
        if needed <= 0:
            continue
        if not same:
            return True
        domain = tuple(shape.labels.get(k, "") for k in same)
        per_domain[domain] = per_domain.get(domain, 0) + shape.count
        if per_domain[domain] >= needed:
            return True
    return False


def _machines_for(deficit: Mapping[str, float], allocatable: Mapping[str, float]) -> int:
    """Machines of this shape the deficit takes, counting only what the shape offers; 0 if none."""
    count = 0
    for name, amount in deficit.items():
        per = allocatable.get(name, 0.0)
        if amount > 0 and per > 0:
            count = max(count, -int(-amount // per))
    return count
