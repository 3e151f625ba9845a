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
machines, and only for offers of one domain that hold it whole: the
coordinator moves a gang's machines inside one rack (ADR 0172). A gang
that already runs somewhere grows where it runs. Phase 1 asks for a gang
before taking any of its shard's idle machines when those cannot hold it
whole.

Pure and clock-free: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# RemoteIdle is the coordinator's word (``coordination.idle_offers`` computes them).
from shard_engine.coordination import RemoteIdle, labels_satisfy
from shard_engine.model import Need, Operator

__all__ = ["FleetIdle", "RemoteIdle"]


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
    _left: list[int] = field(default_factory=list)

    def update(self, offers: Sequence[RemoteIdle]) -> None:
        """Replace what the other shards hold idle (an empty sequence: nothing)."""
        self.offers = tuple(o for o in offers if o.count > 0)
        self._left = [o.count for o in self.offers]

    def begin_cycle(self) -> None:
        """Every offer is whole again at the start of a cycle."""
        self._left = [o.count for o in self.offers]

    def wait(
        self,
        *,
        cluster: int,
        key: str,
        need: Need,
        deficit: Mapping[str, float],
        now: float,
        holds_none: bool = True,
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
            if self._left[i] <= 0 or not labels_satisfy(need.requirements, offer.labels):
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
        # The coordinator's idle step covers a shortfall whole or not at all, so a
        # need the offers cannot cover would wait the whole bound for nothing.
        self.waiting_since.pop(since_key, None)
        return False

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


def _machines_for(deficit: Mapping[str, float], allocatable: Mapping[str, float]) -> int:
    """Machines of this shape the deficit takes, counting only what the shape offers; 0 if none."""
    count = 0
    for name, amount in deficit.items():
        per = allocatable.get(name, 0.0)
        if amount > 0 and per > 0:
            count = max(count, -int(-amount // per))
    return count
