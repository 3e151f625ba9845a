"""A shard's side of membership changes: what leaves when it drains, what arrives with a cluster.

    release_cluster   (donor, draining)  stop planning for the cluster and defer its roll-ups;
                      wait until none of its machines is in motion; its machines leave the
                      shard (``ShardState.give_away``; no await in between, so no cycle can
                      plan on them); move cluster + machines in PostgreSQL by CAS; end the
                      operator's session with ABORTED naming the new shard and its address.
    hand_over         (donor, draining)  the same for unbound machines, without a cluster.
    adopt_bound       (receiver)  when a moved cluster's operator connects, make sure every
                      machine PostgreSQL binds to it here is owned and observed before its
                      first roll-up is planned on — the operator may arrive before the
                      coordinator's adoption does.

Anything the store refuses goes back into the engine unchanged, so a failed or
raced move loses nothing. A move abandoned half-way (the donor stopped
planning, but the cluster never moved) heals by itself: roll-ups are deferred
only for ``defer_s`` after the last attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from activities.membership import MachinesInMotion
from bigfleet.shard.sessions import ClusterElsewhere, SessionHub
from bigfleet.shard.state import ShardState
from bigfleet.shard.terms import CoordinatorTerms
from bigfleet.store import Store
from shard_engine.engine import ShardEngine
from workflows import coordinator_contracts as co
from workflows import membership_contracts as ms
from workflows.contracts import MachineTarget

log = logging.getLogger(__name__)

__all__ = ["ShardMembership"]


class ShardMembership:
    """Cluster moves and handovers for one shard process."""

    def __init__(
        self,
        store: Store,
        *,
        shard_id: str,
        state: ShardState[ShardEngine],
        hub: SessionHub,
        terms: CoordinatorTerms,
        adopt: Callable[[co.AdoptInput], Awaitable[co.AdoptResult]],
        clock: Callable[[], float],
        defer_s: float = 60.0,
    ) -> None:
        self._store = store
        self._shard_id = shard_id
        self._state = state
        self._hub = hub
        self._terms = terms
        self._adopt = adopt
        self._clock = clock
        self.defer_s = defer_s
        # cluster -> (receiver, clock value until which its roll-ups are deferred)
        self._leaving: dict[str, tuple[str, float]] = {}
        # Clusters moved to another shard -> the receiver. A roll-up acknowledged just
        # before the move may still be waiting to be applied (sessions run on their
        # own thread and roll-ups are staged): it must not bring the cluster back.
        self._gone: dict[str, str] = {}
        self._departures: list[Callable[[str], object]] = []

    def on_departure(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(cluster_id)`` once a cluster's roll-ups are deferred (it starts
        leaving) and once it has left, on the shard's loop: the Session port's intake drops
        the roll-up it staged for it, so the deferral is asked once, at the ack."""
        self._departures.append(listener)

    def _departing(self, cluster_id: str) -> None:
        for listener in self._departures:
            listener(cluster_id)

    def deferral(self, cluster_id: str) -> str:
        """Why this cluster's roll-ups are not applied right now, or '' when they are."""
        gone = self._gone.get(cluster_id)
        if gone is not None:
            return f"cluster moved to shard {gone}"
        leaving = self._leaving.get(cluster_id)
        if leaving is None:
            return ""
        receiver, until = leaving
        if self._clock() > until:
            del self._leaving[cluster_id]
            return ""
        return f"cluster is moving to shard {receiver}"

    async def elsewhere(self, cluster_id: str, owner: str) -> ClusterElsewhere:
        """The refusal for an operator that dialled the wrong shard (with the right address)."""
        row = await self._store.shard(owner)
        address = (row.address or "") if row is not None else ""
        return ClusterElsewhere(cluster_id, owner, address)

    async def _refusal(self) -> str:
        """'' when this shard may give things away (it is draining), else why not."""
        row = await self._store.shard(self._shard_id)
        state = row.state if row else "unknown"
        return "" if state == "draining" else f"shard {self._shard_id} is {state}, not draining"

    # ------------------------------------------------------------- donor side

    async def release_cluster(self, inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
        """Move a cluster and its bound machines to ``inp.receiver`` (see the module docstring).

        Refused for a stale coordinator term. Raises :class:`MachinesInMotion`
        while any of its machines is in motion.
        """
        cid = inp.cluster_id
        refused = self._terms.check(inp.term) or await self._refusal()
        if refused:
            return ms.ReleaseClusterResult(refused=refused)
        if cid not in {c.cluster_id for c in await self._store.clusters(self._shard_id)}:
            return await self._already_moved(inp)
        self._leaving[cid] = (inp.receiver, self._clock() + self.defer_s)
        self._departing(cid)
        if self._state.engine.forget_cluster(cid):
            log.info("shard %s: cluster %s is leaving for %s", self._shard_id, cid, inp.receiver)
        bound = await self._store.machines(self._shard_id, cluster_id=cid)
        # From here to the compare-and-set nothing awaits: no cycle can plan on these machines.
        busy = self._in_motion(cid)
        if busy:
            shown = ", ".join(busy[:5]) + (" …" if len(busy) > 5 else "")
            raise MachinesInMotion(
                f"cluster {cid}: {len(busy)} machine(s) in motion ({shown}); "
                "it moves once they settle"
            )
        leaving = {r.id for r in self._state.machines() if r.cluster == cid}
        leaving.update(r.machine_id for r in bound)
        departure = self._state.give_away(leaving)
        try:
            result = await self._store.move_cluster(
                cluster_id=cid,
                donor=self._shard_id,
                receiver=inp.receiver,
                machine_ids=departure.machine_ids,
                term=inp.term,
                seq=inp.seq,
            )
        except BaseException:
            self._state.take_back(departure)
            raise
        moved = {m for m, _ in result.machines} if result.moved else set()
        self._state.take_back(departure, [m for m in departure.machine_ids if m not in moved])
        if not result.moved:
            self._leaving.pop(cid, None)
            if result.owner and result.owner != self._shard_id:
                return await self._already_moved(inp)
            return ms.ReleaseClusterResult(
                refused=f"the store refused to move {cid} to {inp.receiver} "
                "(the receiver must be active and this shard draining)"
            )
        self._leaving.pop(cid, None)
        self._gone[cid] = inp.receiver
        self._departing(cid)
        reason = await self.elsewhere(cid, inp.receiver)
        self._hub.evict(cid, reason)
        log.info(
            "shard %s: cluster %s moved to %s with %d machine(s)",
            self._shard_id,
            cid,
            inp.receiver,
            len(result.machines),
        )
        return ms.ReleaseClusterResult(
            [MachineTarget(m, prov) for m, prov in result.machines], inp.receiver
        )

    async def _already_moved(self, inp: ms.ReleaseClusterInput) -> ms.ReleaseClusterResult:
        """A retry after the move succeeded (or another move won): report where it went."""
        result = await self._store.move_cluster(
            cluster_id=inp.cluster_id,
            donor=self._shard_id,
            receiver=inp.receiver,
            machine_ids=[],
            term=inp.term,
            seq=inp.seq,
        )
        if result.owner is None:
            return ms.ReleaseClusterResult(refused=f"cluster {inp.cluster_id} is unknown")
        if result.owner == self._shard_id:
            return ms.ReleaseClusterResult(
                refused=f"cluster {inp.cluster_id} stays: the store refused the move"
            )
        return ms.ReleaseClusterResult(
            [MachineTarget(m, prov) for m, prov in result.machines], result.owner
        )

    def _in_motion(self, cluster_id: str) -> list[str]:
        """Machines of the cluster with an operation in flight, or toward it."""
        engine = self._state.engine
        out = []
        for machine_id, target in engine.in_flight().items():
            record = engine.machine(machine_id)
            if target == cluster_id or (record is not None and record.cluster == cluster_id):
                out.append(machine_id)
        out += [
            r.id
            for r in engine.machines()
            if r.cluster == cluster_id and r.state.transitional and r.id not in out
        ]
        return sorted(out)

    async def hand_over(self, inp: ms.HandOverInput) -> ms.HandOverResult:
        """Give unbound, settled machines to ``inp.receiver``; the rest stay.

        Refused for a stale coordinator term, or while this shard is not draining.
        """
        refused = self._terms.check(inp.term) or await self._refusal()
        if refused:
            return ms.HandOverResult(refused=refused)
        busy = self._state.busy()
        leaving: list[str] = []
        for target in inp.machines:
            if not self._state.owns(target.machine_id):
                continue
            record = self._state.machine(target.machine_id)
            if record is not None and (
                record.id in busy or record.cluster or record.state.transitional
            ):
                continue
            leaving.append(target.machine_id)
        departure = self._state.give_away(leaving)
        try:
            moved = set(
                await self._store.transfer(
                    donor=self._shard_id,
                    receiver=inp.receiver,
                    machine_ids=departure.machine_ids,
                    term=inp.term,
                    seq=inp.seq,
                )
            )
        except BaseException:
            self._state.take_back(departure)
            raise
        self._state.take_back(departure, [m for m in departure.machine_ids if m not in moved])
        return ms.HandOverResult(
            [MachineTarget(m, departure.provider(m)) for m in sorted(moved) if m in departure.held]
        )

    # ---------------------------------------------------------- receiver side

    async def adopt_bound(self, cluster_id: str) -> int:
        """Own and observe every machine PostgreSQL binds to ``cluster_id`` on this shard."""
        # Called when the cluster is admitted here: if it once moved away, it is back.
        self._gone.pop(cluster_id, None)
        rows = await self._store.machines(self._shard_id, cluster_id=cluster_id)
        owns = self._state.owns
        missing = [MachineTarget(r.machine_id, r.provider) for r in rows if not owns(r.machine_id)]
        if not missing:
            return 0
        result = await self._adopt(co.AdoptInput(self._terms.highest, 0, missing))
        log.info(
            "shard %s: adopted %d machine(s) of %s on connect",
            self._shard_id,
            result.adopted,
            cluster_id,
        )
        return result.adopted
