"""Verdicts: what the last committed cycle decided for each need, for why-not questions.

"Why didn't it scale up?" is answered from evidence the cycle already
produced and would otherwise discard: which needs Phase 1 and Phase 2 left
short and by how much (``pending``), the reason ``shortfalls.explain`` gave,
how many machines the cycle sent toward each need from idle and from
speculative, and what preemption took for it. :class:`LastCycle` keeps that
evidence (a few references and two small dictionaries per cycle);
:func:`inspect` turns it into one :class:`NeedVerdict` per need when asked,
adding what only the inventory can say (machines counting toward the need,
matching supply per state) as it stands at that moment.

Nothing here feeds back into a decision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind
from shard_engine.catalog import ProfileCatalog
from shard_engine.inventory import Inventory
from shard_engine.model import MachineState, Need
from shard_engine.needs import Demand, NeedsTable
from shard_engine.pending import (
    REASON_NO_SUPPLY,
    REASON_PREEMPTION_EXHAUSTED,
    REASON_PRIORITY_STARVED,
    REASON_TOPOLOGY,
    PendingNeed,
)
from shard_engine.worksheet import Worksheet

__all__ = [
    "MATCHING_CAP",
    "Arrivals",
    "Inspection",
    "LastCycle",
    "MatchingSupply",
    "NeedVerdict",
    "UnmetReason",
    "inspect",
    "reason_category",
]

MATCHING_CAP = 100_000
"""Matching-supply counts are reported up to this many machines per state."""


class UnmetReason:
    """Why a need is short, as a category (the text of ``explain`` starts with it)."""

    NONE = ""
    PRIORITY_STARVED = REASON_PRIORITY_STARVED
    NO_MATCHING_SUPPLY = REASON_NO_SUPPLY
    TOPOLOGY = REASON_TOPOLOGY
    PREEMPTION_EXHAUSTED = REASON_PREEMPTION_EXHAUSTED


def reason_category(text: str) -> str:
    """The category of a why-not text (``"<category>: <detail>"``), or "" for another text."""
    head = text.split(":", 1)[0].strip()
    known = (
        UnmetReason.PRIORITY_STARVED,
        UnmetReason.NO_MATCHING_SUPPLY,
        UnmetReason.TOPOLOGY,
        UnmetReason.PREEMPTION_EXHAUSTED,
    )
    return head if head in known else UnmetReason.NONE


@dataclass(frozen=True, slots=True)
class MatchingSupply:
    """Machines of a shape that may serve a need, by state (free or not)."""

    idle: int
    configured: int
    speculative: int
    capped: bool


@dataclass(frozen=True, slots=True)
class NeedVerdict:
    """One need and what the last cycle made of it."""

    cluster_id: str
    need_key: str
    need: Need
    arrival_seconds: float
    fingerprint: str
    satisfied: bool
    deficit: Mapping[str, float]
    claimed: int
    from_idle: int
    from_speculative: int
    same_domain: str
    same_satisfiable: bool
    age_cycles: int
    reason: str
    detail: str
    matching: MatchingSupply | None
    victims: int
    victims_hold: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Inspection:
    """The answer to one why-not question: the cycle it describes and the verdicts."""

    cycle: int
    computed_at: float
    total: int
    verdicts: tuple[NeedVerdict, ...]


@dataclass(slots=True)
class Arrivals:
    """When each need was first seen (the needs table keeps only the order)."""

    first_seen: dict[int, dict[str, float]] = field(default_factory=dict)
    _versions: dict[int, int] = field(default_factory=dict)

    def observe(self, demand: Demand, *, now: float) -> None:
        """Note new need keys of a cluster; unchanged needs cost a version comparison."""
        if self._versions.get(demand.cluster) == demand.version:
            return
        self._versions[demand.cluster] = demand.version
        known = self.first_seen.get(demand.cluster, {})
        if len(known) == len(demand.keys) and all(key in known for key in demand.keys):
            return  # the same needs, resized: every key keeps when it was first seen
        self.first_seen[demand.cluster] = {key: known.get(key, now) for key in demand.keys}

    def of(self, cluster: int, key: str) -> float | None:
        """When need ``key`` of ``cluster`` was first seen, if it is known."""
        return self.first_seen.get(cluster, {}).get(key)

    def forget(self, cluster: int) -> None:
        """Drop a cluster that left this shard."""
        self._versions.pop(cluster, None)
        self.first_seen.pop(cluster, None)


@dataclass(frozen=True, slots=True)
class LastCycle:
    """The evidence one committed cycle left (see module docstring)."""

    number: int
    now: float
    demands: tuple[Demand, ...]
    pending: Mapping[tuple[int, str], PendingNeed]
    # (cluster, need key) -> [machines from idle, machines from speculative]
    acquired: Mapping[tuple[int, str], tuple[int, int]]
    # (cluster, need key) -> (victims taken, what they hold per resource)
    preempted: Mapping[tuple[int, str], tuple[int, Mapping[str, float]]]

    @classmethod
    def capture(
        cls,
        *,
        number: int,
        now: float,
        sheet: Worksheet,
        demands: Sequence[Demand],
        pending: Sequence[PendingNeed],
        catalog: ProfileCatalog,
    ) -> LastCycle:
        """Keep what the cycle decided; costs one pass over its action segments."""
        acquired: dict[tuple[int, str], tuple[int, int]] = {}
        preempted: dict[tuple[int, str], tuple[int, dict[str, float]]] = {}
        inventory = sheet.inventory
        names = catalog.dims.names
        log = sheet.log
        for s, kind in enumerate(log.kind):
            need = log.need[s]
            cluster = log.cluster[s]
            if need < 0 or cluster < 0:
                continue
            key = (cluster, log.needs[need][0])
            rows = log.rows[s]
            if kind == ActionKind.ASSIGN_IDLE:
                idle, spec = acquired.get(key, (0, 0))
                acquired[key] = (idle + len(rows), spec)
            elif kind == ActionKind.PROVISION:
                idle, spec = acquired.get(key, (0, 0))
                acquired[key] = (idle, spec + len(rows))
            elif kind == ActionKind.PREEMPT:
                count, hold = preempted.get(key, (0, {}))
                profiles = inventory.profile[np.asarray(rows, dtype=np.int64)]
                total = catalog.alloc[profiles.astype(np.int64)].sum(axis=0)
                for d, amount in enumerate(total.tolist()[: len(names)]):
                    if amount:
                        hold[names[d]] = hold.get(names[d], 0.0) + amount
                preempted[key] = (count + len(rows), hold)
        return cls(
            number=number,
            now=now,
            demands=tuple(demands),
            pending={(p.cluster, p.key): p for p in pending},
            acquired=acquired,
            preempted=preempted,
        )


def _matching_counts(inventory: Inventory) -> npt.NDArray[np.int64]:
    """Machines per (state, profile), counted from the columns."""
    profiles = len(inventory.catalog)
    rows = np.asarray(inventory.ids.live_rows(), dtype=np.int64)
    counts = np.zeros((len(MachineState), max(profiles, 1)), dtype=np.int64)
    if len(rows) == 0 or profiles == 0:
        return counts
    flat = inventory.state[rows].astype(np.int64) * profiles + inventory.profile[rows].astype(
        np.int64
    )
    counts[:, :profiles] = np.bincount(flat, minlength=len(MachineState) * profiles).reshape(
        len(MachineState), profiles
    )
    return counts


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _fingerprint(demand: Demand, index: int) -> str:
    return hashlib.blake2b(repr(demand.mask_keys[index]).encode(), digest_size=8).hexdigest()


def _domain_name(catalog: ProfileCatalog, keys: tuple[str, ...], code: int | None) -> str:
    """The label values of gang domain ``code`` over ``keys``, joined with "/"."""
    if code is None or not keys:
        return ""
    codes = catalog.domain_codes(keys)
    where = np.flatnonzero(codes == code)
    if len(where) == 0:
        return ""
    labels = catalog.labels(int(where[0]))
    return "/".join(labels.get(k, "") for k in keys)


def inspect(
    *,
    last: LastCycle | None,
    cluster_id: str | None,
    limit: int,
    inventory: Inventory,
    table: NeedsTable,
    catalog: ProfileCatalog,
    reasons: Mapping[int, Mapping[str, str]],
    ages: Mapping[tuple[int, str], int],
    arrivals: Arrivals,
) -> Inspection:
    """Verdicts for every need (or one cluster's), highest priority first (see module doc).

    ``limit`` > 0 keeps only the first ``limit`` verdicts; ``total`` counts
    them all. Before the first committed cycle the answer is cycle 0 with
    no verdicts.
    """
    if limit < 0:
        raise ValueError("limit: must not be negative")
    if last is None:
        return Inspection(cycle=0, computed_at=0.0, total=0, verdicts=())
    clusters = inventory.clusters
    wanted = None if not cluster_id else clusters.find(cluster_id)
    if cluster_id and wanted is None:
        return Inspection(cycle=last.number, computed_at=last.now, total=0, verdicts=())
    rows: list[tuple[int, int, str, Demand, int]] = []
    for demand in last.demands:
        if wanted is not None and demand.cluster != wanted:
            continue
        name = clusters.name(demand.cluster)
        for i in range(len(demand.keys)):
            rows.append((-int(demand.priority[i]), int(demand.arrival[i]), name, demand, i))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    total = len(rows)
    if limit:
        rows = rows[:limit]
    if not rows:
        return Inspection(cycle=last.number, computed_at=last.now, total=total, verdicts=())
    names = catalog.dims.names
    by_state: npt.NDArray[np.int64] | None = None
    verdicts: list[NeedVerdict] = []
    for _, _, name, demand, i in rows:
        cluster = demand.cluster
        key = demand.keys[i]
        item = last.pending.get((cluster, key))
        short = item is not None and item.unsatisfied
        supply = inventory.supply_row(cluster)
        width = min(len(supply), demand.matrix.shape[1])
        claimed = int((demand.matrix[i, :width] * supply[:width]).sum())
        matching: MatchingSupply | None = None
        deficit: dict[str, float] = {}
        if short and item is not None:
            if by_state is None:
                by_state = _matching_counts(inventory)
            mask = item.mask[: by_state.shape[1]]
            counts = [
                int(by_state[int(state), : len(mask)][mask].sum())
                for state in (MachineState.IDLE, MachineState.CONFIGURED, MachineState.SPECULATIVE)
            ]
            matching = MatchingSupply(
                idle=min(counts[0], MATCHING_CAP),
                configured=min(counts[1], MATCHING_CAP),
                speculative=min(counts[2], MATCHING_CAP),
                capped=max(counts) > MATCHING_CAP,
            )
            deficit = {
                names[d]: float(item.deficit[d])
                for d in np.flatnonzero(item.deficit > 0).tolist()
                if d < len(names)
            }
        text = reasons.get(cluster, {}).get(key, "") if short else ""
        entry = table.entry(cluster)
        gang = demand.gang_keys[i]
        domain = _domain_name(
            catalog, gang, entry.gang_domain.get(key) if entry is not None else None
        )
        idle, spec = last.acquired.get((cluster, key), (0, 0))
        victims, hold = last.preempted.get((cluster, key), (0, {}))
        verdicts.append(
            NeedVerdict(
                cluster_id=name,
                need_key=key,
                need=demand.needs[i],
                arrival_seconds=_or(arrivals.of(cluster, key), last.now),
                fingerprint=_fingerprint(demand, i),
                satisfied=not short,
                deficit=deficit,
                claimed=claimed,
                from_idle=idle,
                from_speculative=spec,
                same_domain=domain,
                same_satisfiable=bool(gang) and not (item is not None and item.topology_block),
                age_cycles=ages.get((cluster, key), 0) if short else 0,
                reason=reason_category(text),
                detail=text,
                matching=matching,
                victims=victims,
                victims_hold=dict(hold),
            )
        )
    return Inspection(
        cycle=last.number, computed_at=last.now, total=total, verdicts=tuple(verdicts)
    )
