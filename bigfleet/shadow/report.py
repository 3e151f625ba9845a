"""The shadow report: what BigFleet would have run against what the incumbent ran.

Both sides become *intervals* of one machine in one cluster, clipped to the
report's window:

- BigFleet's come from its decision log. ``provision`` and ``assign`` open
  an interval for the cluster; ``reclaim`` and ``release`` close it; a
  ``preempt`` closes it in the victim's cluster and opens one of the same
  shape in the preemptor's (in shadow mode nothing settles, so the machine
  is taken to move at the instant of the decision). Times are decision
  times: the report compares decisions, not how long a cloud takes.
- The incumbent's come from its node joins and leaves
  (:mod:`bigfleet.shadow.incumbent`).

Per cluster the report sums machine-hours and cost by (instance type,
capacity type); an incumbent node without a price is priced from the
price BigFleet saw for the same shape, or listed as unpriced.

*Unmet intervals* are BigFleet's demand episodes: a need's first decision
(short, or an action for it) opens one; a quiet gap of ``episode_gap_s``
between decisions about the need ends it. For each, the report says who
covered it first: BigFleet's first action for the need, or the
incumbent's first node joining that cluster at or after the episode began
(and before the need's next episode).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bigfleet.decisions.entries import Decision
from bigfleet.shadow.incumbent import NodeEvent, NodeEventKind

__all__ = ["ClusterReport", "CoverageRace", "ShadowReport", "ShapeUsage", "compare"]

_OPENS = ("provision", "assign")
_CLOSES = ("reclaim", "release")
_COVERS = ("provision", "assign", "preempt")


@dataclass(frozen=True, slots=True)
class ShapeUsage:
    """Machine-hours and cost of one shape in one cluster over the window."""

    instance_type: str
    capacity_type: str
    machine_hours: float
    cost: float
    priced: bool = True


@dataclass(frozen=True, slots=True)
class CoverageRace:
    """One unmet interval and when each side first covered it (None: not in the window)."""

    cluster: str
    need_key: str
    unmet_at: float
    bigfleet_at: float | None
    incumbent_at: float | None

    @property
    def first(self) -> str:
        """``bigfleet``, ``incumbent``, ``tie`` or ``neither``."""
        b, i = self.bigfleet_at, self.incumbent_at
        if b is None and i is None:
            return "neither"
        if i is None or (b is not None and b < i):
            return "bigfleet"
        if b is None or i < b:
            return "incumbent"
        return "tie"


@dataclass(frozen=True, slots=True)
class ClusterReport:
    """Both sides for one cluster."""

    cluster: str
    bigfleet: tuple[ShapeUsage, ...]
    incumbent: tuple[ShapeUsage, ...]
    races: tuple[CoverageRace, ...]

    @property
    def bigfleet_cost(self) -> float:
        return sum(u.cost for u in self.bigfleet)

    @property
    def incumbent_cost(self) -> float:
        return sum(u.cost for u in self.incumbent)

    @property
    def bigfleet_hours(self) -> float:
        return sum(u.machine_hours for u in self.bigfleet)

    @property
    def incumbent_hours(self) -> float:
        return sum(u.machine_hours for u in self.incumbent)


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """The comparison over ``[since, until)``."""

    since: float
    until: float
    clusters: tuple[ClusterReport, ...] = field(default_factory=tuple)

    def render(self) -> str:
        """The text ``bigfleet shadow report`` prints."""

        def stamp(t: float | None) -> str:
            if t is None:
                return "-"
            return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")

        out = [f"shadow report {stamp(self.since)} .. {stamp(self.until)} UTC"]
        for c in self.clusters:
            out.append("")
            out.append(
                f"cluster {c.cluster}: bigfleet {c.bigfleet_hours:.2f} machine-h"
                f" ${c.bigfleet_cost:.2f} | incumbent {c.incumbent_hours:.2f} machine-h"
                f" ${c.incumbent_cost:.2f}"
            )
            out.append(
                f"  {'side':<10} {'shape':<24} {'capacity':<11} {'machine-h':>10} {'cost':>10}"
            )
            for side, usages in (("bigfleet", c.bigfleet), ("incumbent", c.incumbent)):
                for u in usages:
                    cost = f"${u.cost:.2f}" if u.priced else "unpriced"
                    out.append(
                        f"  {side:<10} {u.instance_type:<24} {u.capacity_type:<11} "
                        f"{u.machine_hours:>10.2f} {cost:>10}"
                    )
            for r in c.races:
                out.append(
                    f"  unmet {r.need_key} at {stamp(r.unmet_at)}: bigfleet {stamp(r.bigfleet_at)},"
                    f" incumbent {stamp(r.incumbent_at)} -> {r.first} first"
                )
        return "\n".join(out)


@dataclass(slots=True)
class _Interval:
    cluster: str
    instance_type: str
    capacity_type: str
    price: float | None
    start: float
    end: float | None = None


def _usage(
    intervals: Sequence[_Interval],
    *,
    since: float,
    until: float,
    prices: dict[tuple[str, str], float],
) -> dict[str, tuple[ShapeUsage, ...]]:
    hours: dict[str, dict[tuple[str, str], list[float]]] = defaultdict(
        lambda: defaultdict(lambda: [0.0, 0.0])
    )
    unpriced: set[tuple[str, str, str]] = set()
    for iv in intervals:
        start = max(iv.start, since)
        end = min(iv.end if iv.end is not None else until, until)
        if end <= start:
            continue
        shape = (iv.instance_type, iv.capacity_type)
        price = iv.price if iv.price is not None else prices.get(shape)
        span = (end - start) / 3600.0
        slot = hours[iv.cluster][shape]
        slot[0] += span
        if price is None:
            unpriced.add((iv.cluster, *shape))
        else:
            slot[1] += span * price
    return {
        cluster: tuple(
            ShapeUsage(
                shape[0],
                shape[1],
                round(h, 6),
                round(cost, 6),
                priced=(cluster, *shape) not in unpriced,
            )
            for shape, (h, cost) in sorted(shapes.items())
        )
        for cluster, shapes in hours.items()
    }


def _bigfleet_intervals(
    decisions: Sequence[Decision],
) -> tuple[list[_Interval], dict[tuple[str, str], float]]:
    open_by_machine: dict[str, _Interval] = {}
    intervals: list[_Interval] = []
    prices: dict[tuple[str, str], float] = {}

    def shape_of(d: Decision) -> tuple[str, str, float | None]:
        price = d.inputs.get("price_per_hour")
        instance_type = str(d.inputs.get("instance_type", "?"))
        capacity_type = str(d.inputs.get("capacity_type", "?"))
        if isinstance(price, int | float):
            prices[(instance_type, capacity_type)] = float(price)
            return instance_type, capacity_type, float(price)
        return instance_type, capacity_type, None

    def close(machine_id: str, at: float) -> None:
        interval = open_by_machine.pop(machine_id, None)
        if interval is not None:
            interval.end = at

    def open_(machine_id: str, cluster: str, d: Decision) -> None:
        close(machine_id, d.decided_at)
        instance_type, capacity_type, price = shape_of(d)
        interval = _Interval(cluster, instance_type, capacity_type, price, d.decided_at)
        open_by_machine[machine_id] = interval
        intervals.append(interval)

    for d in sorted(decisions, key=lambda d: d.decided_at):
        if not d.machine_id:
            continue
        if d.kind in _OPENS:
            open_(d.machine_id, d.cluster_id, d)
        elif d.kind in _CLOSES:
            close(d.machine_id, d.decided_at)
        elif d.kind == "preempt":
            open_(d.machine_id, str(d.inputs.get("preemptor_cluster", "")), d)
    return intervals, prices


def _incumbent_intervals(events: Sequence[NodeEvent], *, since: float) -> list[_Interval]:
    open_nodes: dict[tuple[str, str], _Interval] = {}
    intervals: list[_Interval] = []
    for e in sorted(events, key=lambda e: e.time):
        key = (e.cluster, e.node)
        if e.event is NodeEventKind.JOIN:
            if key in open_nodes:
                continue  # a repeated join of a node already present
            interval = _Interval(
                e.cluster, e.instance_type, e.capacity_type, e.price_per_hour, e.time
            )
            open_nodes[key] = interval
            intervals.append(interval)
        else:
            interval_or_none = open_nodes.pop(key, None)
            if interval_or_none is not None:
                interval_or_none.end = e.time
    return intervals


def _races(
    decisions: Sequence[Decision],
    events: Sequence[NodeEvent],
    *,
    since: float,
    until: float,
    gap: float,
) -> dict[str, list[CoverageRace]]:
    about: dict[tuple[str, str], list[Decision]] = defaultdict(list)
    for d in sorted(decisions, key=lambda d: d.decided_at):
        if d.kind == "unmet" or d.kind in _COVERS:
            cluster = (
                str(d.inputs.get("preemptor_cluster", "")) if d.kind == "preempt" else d.cluster_id
            )
            if cluster and d.need_key:
                about[(cluster, d.need_key)].append(d)
    joins: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.event is NodeEventKind.JOIN:
            joins[e.cluster].append(e.time)
    for times in joins.values():
        times.sort()
    result: dict[str, list[CoverageRace]] = defaultdict(list)
    for (cluster, key), rows in about.items():
        episodes: list[list[Decision]] = []
        for d in rows:
            if episodes and d.decided_at - episodes[-1][-1].decided_at <= gap:
                episodes[-1].append(d)
            else:
                episodes.append([d])
        for n, episode in enumerate(episodes):
            start = episode[0].decided_at
            if not since <= start < until:
                continue
            end = episodes[n + 1][0].decided_at if n + 1 < len(episodes) else until
            covered = next((d.decided_at for d in episode if d.kind in _COVERS), None)
            incumbent = next((t for t in joins.get(cluster, ()) if start <= t < end), None)
            result[cluster].append(CoverageRace(cluster, key, start, covered, incumbent))
    for races in result.values():
        races.sort(key=lambda r: (r.unmet_at, r.need_key))
    return result


def compare(
    decisions: Sequence[Decision],
    incumbent: Sequence[NodeEvent],
    *,
    since: float,
    until: float,
    cluster: str = "",
    episode_gap_s: float = 600.0,
) -> ShadowReport:
    """Compare both sides over ``[since, until)`` (one cluster when ``cluster`` is given).

    ``decisions`` should reach back far enough to see the machines already
    placed when the window opens (the decision log's retention does).
    Raises ``ValueError`` when ``until`` is not after ``since``.
    """
    if not until > since:
        raise ValueError("until: must be after since")
    if cluster:
        decisions = [
            d
            for d in decisions
            if d.cluster_id == cluster or d.inputs.get("preemptor_cluster") == cluster
        ]
        incumbent = [e for e in incumbent if e.cluster == cluster]
    ours, prices = _bigfleet_intervals(decisions)
    theirs = _incumbent_intervals(incumbent, since=since)
    bigfleet = _usage(ours, since=since, until=until, prices=prices)
    existing = _usage(theirs, since=since, until=until, prices=prices)
    races = _races(decisions, incumbent, since=since, until=until, gap=episode_gap_s)
    names = sorted((set(bigfleet) | set(existing) | set(races)) - {""})
    return ShadowReport(
        since=since,
        until=until,
        clusters=tuple(
            ClusterReport(
                cluster=name,
                bigfleet=bigfleet.get(name, ()),
                incumbent=existing.get(name, ()),
                races=tuple(races.get(name, ())),
            )
            for name in names
        ),
    )
