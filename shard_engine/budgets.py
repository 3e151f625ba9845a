"""Disruption budgets and do-not-disrupt: how many machines may be draining at once.

The per-cycle reclaim cap (``max(1, 5 %)`` of a cluster) keeps one wrong
roll-up from emptying one cluster. Platform teams need more than that: a
cap on the share of a *fleet* — every GPU shape, or every cluster of a
team — that is draining at any moment, by reason, and quiet hours in which
no excess is taken back at all. Karpenter offers this per NodePool inside
one cluster; a shard sees many clusters, so a budget's scope here is a set
of machine shapes and/or a set of clusters (ADR 0140).

Semantics, in the order they are applied:

- A :class:`Budget` caps the machines in its scope that are *draining* for
  one of its ``reasons`` — those in flight for such a drain plus those this
  cycle would start — at ``count`` machines or ``percent`` of the machines
  in scope (rounded up, like Karpenter, so 10 % of 5 machines is 1).
- A budget with a ``window`` is in force only while the window is open: a
  window opens at every minute its five-field cron ``schedule`` matches (UTC)
  and stays open ``duration_seconds``. ``Budget(count=0, window=weekdays
  08:00 for 10 h)`` means "no reclaim on weekdays 08:00–18:00".
- Reasons are ``reclaim`` (excess) and ``preempt`` (a strictly higher
  priority needs the machine). A budget that does not name ``preempt``
  never holds a preemption back: priority is the fleet's first rule and a
  budget must say explicitly that it overrides it.
- Every budget that applies to a drain must admit it; the one with the
  least room left is named in the hold.
- **Do-not-disrupt.** A need may ask that the machines able to serve it are
  never reclaimed as excess within ``do_not_disrupt_seconds`` of having
  been configured (``Need.do_not_disrupt_seconds``, carried on the wire as a
  BigFleet extension). It protects against excess only: preemption by a
  strictly higher priority still takes the machine (ADR 0141).

Budgets are enforced by each shard over its own slice of the fleet. A
percentage therefore holds for the fleet as a whole (each shard keeps its
share under it); a count is per shard.

Everything here is pure: ``now`` is passed in, nothing reads a clock, and
enforcement works on the cycle's :class:`~shard_engine.actions.ActionLog`
after the phases have decided, so budgets change which drains start, never
how a need is judged. A held machine is simply not in the plan; the hold,
with the budget and its use, is returned for the decision log and the
why-not.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from shard_engine.actions import ActionKind, ActionLog
from shard_engine.catalog import ProfileCatalog, capacity_type_label
from shard_engine.inventory import Inventory
from shard_engine.needs import Demand
from shard_engine.worksheet import Worksheet

__all__ = [
    "HELD_PREEMPTION",
    "MAX_WINDOW_SECONDS",
    "Budget",
    "BudgetError",
    "BudgetUse",
    "CronSchedule",
    "DrainGroup",
    "DrainReason",
    "Hold",
    "Scope",
    "Subject",
    "Window",
    "admit",
    "admit_counts",
    "apply",
    "census",
    "enforce",
    "parse_budgets",
    "use_of",
]

IntArray = npt.NDArray[np.int64]

HELD_PREEMPTION = "preemption held by budget "
"""How the why-not of a need whose preemption a budget held back begins (:meth:`Hold.why_not`)."""

MAX_WINDOW_SECONDS = 7 * 24 * 3600
"""The longest a window may stay open: a week (every schedule repeats within one)."""


class BudgetError(ValueError):
    """A budget definition that cannot be used; names the field and the reason."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


class DrainReason(StrEnum):
    """Why a machine would drain: what a budget may be scoped to."""

    RECLAIM = "reclaim"
    PREEMPT = "preempt"
    INTERRUPTION = "interruption"  # ahead of an interruption its provider announced


# -- cron ----------------------------------------------------------------------------

_CRON_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_ALIASES = {
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def _cron_field(text: str, name: str, low: int, high: int, where: str) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        step = 1
        base = part
        if "/" in part:
            base, _, step_text = part.partition("/")
            if not step_text.isdigit() or int(step_text) == 0:
                raise BudgetError(where, f"{name}: step {step_text!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            if not (a.isdigit() and b.isdigit()):
                raise BudgetError(where, f"{name}: {base!r} is not a range of numbers")
            first, last = int(a), int(b)
        elif base.isdigit():
            first = int(base)
            last = high if "/" in part else first
        else:
            raise BudgetError(where, f"{name}: {part!r} is not a number, range, list or step")
        if first < low or last > high or first > last:
            raise BudgetError(where, f"{name}: {part!r} is outside {low}-{high}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A five-field cron expression (minute hour day-of-month month day-of-week), in UTC.

    Fields take ``*``, numbers, ranges ``a-b``, lists ``a,b`` and steps
    ``*/n`` or ``a-b/n``; day of week 0 and 7 are Sunday; when both day
    fields are restricted a day matches either (as in cron). The ``@daily``
    style aliases are accepted. Names of days and months are not.
    """

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, text: str, *, where: str = "schedule") -> CronSchedule:
        """Parse ``text``; raises :class:`BudgetError` naming ``where`` and the bad field."""
        expanded = _ALIASES.get(text.strip(), text)
        parts = expanded.split()
        if len(parts) != 5:
            raise BudgetError(where, f"{text!r} has {len(parts)} fields, a cron schedule has 5")
        sets = [
            _cron_field(part, name, low, high, where)
            for part, (name, low, high) in zip(parts, _CRON_FIELDS, strict=True)
        ]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(
            text=text,
            minutes=sets[0],
            hours=sets[1],
            days=sets[2],
            months=sets[3],
            weekdays=weekdays,
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
        )

    def day_matches(self, moment: datetime) -> bool:
        """Does the calendar day of ``moment`` match (month and the two day fields)?"""
        if moment.month not in self.months:
            return False
        in_month = moment.day in self.days
        in_week = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return in_week
        if self.any_weekday:
            return in_month
        return in_month or in_week

    def last_start(self, now: float, *, within: float) -> float | None:
        """The latest minute at or before ``now`` (epoch seconds) the schedule matches.

        Only the last ``within`` seconds are searched; None when no match
        lies in them. Days, then hours, are skipped whole when they cannot
        match, so a week's search costs at most a few hundred steps.
        """
        minute = math.floor(now / 60) * 60
        earliest = now - within
        while minute >= earliest - 60:
            moment = datetime.fromtimestamp(minute, tz=UTC)
            if not self.day_matches(moment):
                minute = minute - (moment.hour * 3600 + moment.minute * 60) - 60
                continue
            if moment.hour not in self.hours:
                minute = minute - moment.minute * 60 - 60
                continue
            below = [m for m in self.minutes if m <= moment.minute]
            if not below:
                minute = minute - moment.minute * 60 - 60
                continue
            start = minute - (moment.minute - max(below)) * 60
            return start if start > earliest else None
        return None


@dataclass(frozen=True, slots=True)
class Window:
    """When a budget is in force: from each start of ``schedule`` for ``duration_seconds``."""

    schedule: CronSchedule
    duration_seconds: int

    def open_at(self, now: float) -> bool:
        """True while a window that opened at a scheduled minute has not yet closed."""
        start = self.schedule.last_start(now, within=self.duration_seconds)
        return start is not None and now < start + self.duration_seconds

    def opens_next(self, now: float, *, horizon: float = MAX_WINDOW_SECONDS) -> float | None:
        """The next instant after ``now`` the window is open, searching ``horizon`` seconds.

        For the ``budgets`` listing ("in force from ..."); None past the horizon.
        """
        minute = math.floor(now / 60) * 60 + 60
        end = now + horizon
        while minute <= end:
            if self.open_at(minute):
                return float(minute)
            minute += 60
        return None


# -- budgets --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subject:
    """What a scope looks at for one machine: its shape and its cluster."""

    instance_type: str
    capacity_type: str
    resources: frozenset[str]
    cluster_id: str


@dataclass(frozen=True, slots=True)
class Scope:
    """A set of machines: shapes and/or clusters. Every non-empty criterion must match.

    ``instance_types`` and ``clusters`` are shell-style patterns
    (``p4d.*``, ``team-a-*``); ``resources`` matches a shape that offers
    any of the named resources (``nvidia.com/gpu``: every GPU shape);
    ``capacity_types`` names ``on-demand``, ``spot``, ``reserved`` or
    ``bare-metal``. An empty scope is the whole shard.
    """

    instance_types: tuple[str, ...] = ()
    capacity_types: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()

    def shape_matches(self, subject: Subject) -> bool:
        """The shape criteria alone (instance type, capacity type, resources)."""
        if self.instance_types and not any(
            fnmatch.fnmatchcase(subject.instance_type, p) for p in self.instance_types
        ):
            return False
        if self.capacity_types and subject.capacity_type not in self.capacity_types:
            return False
        return not self.resources or any(r in subject.resources for r in self.resources)

    def cluster_matches(self, cluster_id: str) -> bool:
        """The cluster criterion alone."""
        return not self.clusters or any(fnmatch.fnmatchcase(cluster_id, p) for p in self.clusters)

    def matches(self, subject: Subject) -> bool:
        """Is this machine in the scope?"""
        return self.shape_matches(subject) and self.cluster_matches(subject.cluster_id)

    def describe(self) -> str:
        """A short text for listings and reasons (``every machine`` when empty)."""
        parts = [
            f"{label}={','.join(values)}"
            for label, values in (
                ("instance_types", self.instance_types),
                ("capacity_types", self.capacity_types),
                ("resources", self.resources),
                ("clusters", self.clusters),
            )
            if values
        ]
        return " ".join(parts) or "every machine"


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``count`` machines, or ``percent`` of the scope, draining at once (see module)."""

    name: str
    scope: Scope = field(default_factory=Scope)
    reasons: frozenset[DrainReason] = frozenset({DrainReason.RECLAIM})
    count: int | None = None
    percent: float | None = None
    window: Window | None = None

    def __post_init__(self) -> None:
        where = f"budget {self.name!r}"
        if not self.name:
            raise BudgetError("name", "a budget needs a name (listings and holds quote it)")
        if (self.count is None) == (self.percent is None):
            raise BudgetError(f"{where}.nodes", "give exactly one of a count or a percentage")
        if self.count is not None and self.count < 0:
            raise BudgetError(f"{where}.nodes", f"count {self.count} is negative")
        if self.percent is not None and not (0.0 <= self.percent <= 100.0):
            raise BudgetError(f"{where}.nodes", f"percentage {self.percent} is outside 0-100")
        if not self.reasons:
            raise BudgetError(f"{where}.reasons", "name at least one reason")

    def in_force(self, now: float) -> bool:
        """True at ``now`` (always, without a window)."""
        return self.window is None or self.window.open_at(now)

    def cap(self, machines_in_scope: int) -> int:
        """How many of the scope's machines may drain at once (percentages round up)."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return math.ceil(self.percent * machines_in_scope / 100.0 - 1e-9)

    def describe_cap(self) -> str:
        """``3`` or ``10%``."""
        return str(self.count) if self.count is not None else f"{self.percent:g}%"


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """A budget at one instant: in force or not, its cap, what drains under it."""

    budget: Budget
    in_force: bool
    machines_in_scope: int
    cap: int
    draining: int


@dataclass(frozen=True, slots=True)
class Hold:
    """A drain a cycle wanted and did not start, and what held it back.

    ``cause`` is ``budget`` (``budget`` names it, with ``cap`` and
    ``draining`` at that moment) or ``do-not-disrupt`` (``until`` is when
    the protection of the need ``need_key`` ends for this machine). A held
    preemption names the need it would have served (``for_cluster``,
    ``for_need``): that need's why-not quotes :meth:`why_not`.
    """

    machine_id: str
    cluster_id: str
    reason: DrainReason
    cause: str
    budget: str = ""
    cap: int = 0
    draining: int = 0
    need_key: str = ""
    until: float = 0.0
    for_cluster: str = ""
    for_need: str = ""
    #: A fleet-wide count's own cap when ``cap`` is this shard's share of it (else 0).
    fleet_cap: int = 0

    def why_not(self) -> str:
        """What the need a held preemption would have served is told: the budget, k/N."""
        return f"{HELD_PREEMPTION}{self.budget} ({self.draining}/{self.cap} draining)"

    def describe(self) -> str:
        """The reason text a why-not or a decision log shows."""
        if self.cause == "budget":
            share = f", this shard's share of {self.fleet_cap}" if self.fleet_cap else ""
            return (
                f"{self.reason.value} held by disruption budget {self.budget!r} "
                f"({self.draining} of {self.cap} draining{share})"
            )
        return f"{self.reason.value} held by do-not-disrupt of need {self.need_key}"


def admit(
    budgets: Sequence[Budget],
    *,
    now: float,
    requests: Sequence[tuple[Subject, DrainReason]],
    in_scope: Callable[[Budget], int],
    draining: Callable[[Budget], int],
) -> tuple[list[bool], list[tuple[int, BudgetUse]]]:
    """Admit drain requests of one machine each, in order (see :func:`admit_counts`).

    Returns one flag per request and, for each refused request, its index
    and the use of the budget with the least room (the one to name).
    """
    admitted, refused = admit_counts(
        budgets,
        now=now,
        requests=[(subject, reason, 1) for subject, reason in requests],
        in_scope=in_scope,
        draining=draining,
    )
    flags = [n == 1 for n in admitted]
    return flags, [(i, refused[i]) for i, ok in enumerate(flags) if not ok]


def admit_counts(
    budgets: Sequence[Budget],
    *,
    now: float,
    requests: Sequence[tuple[Subject, DrainReason, int]],
    in_scope: Callable[[Budget], int],
    draining: Callable[[Budget], int],
    shares: Mapping[str, int] | None = None,
) -> tuple[list[int], dict[int, BudgetUse]]:
    """Admit drain requests (machines alike to a scope, and how many) in order.

    ``in_scope(b)`` counts the machines of budget ``b``'s scope; ``draining(b)``
    those in its scope already draining for one of its reasons; both are
    asked once per budget that applies. Each request gets as many machines
    as every budget that applies has room for. ``shares`` gives, by name,
    this shard's share of a fleet-wide count budget: it replaces the count
    as the cap (percentages are fleet-wide already). Returns the count
    admitted per request and, for each request cut short, the use of the
    budget with the least room (the one to name).
    """
    live = [b for b in budgets if b.in_force(now)]
    caps: dict[int, int] = {}
    totals: dict[int, int] = {}
    used: dict[int, int] = {}
    admitted: list[int] = []
    refused: dict[int, BudgetUse] = {}
    for index, (subject, reason, count) in enumerate(requests):
        applying = [
            i for i, b in enumerate(live) if reason in b.reasons and b.scope.matches(subject)
        ]
        tightest: int | None = None
        for i in applying:
            if i not in caps:
                totals[i] = in_scope(live[i])
                caps[i] = _cap(live[i], totals[i], shares)
                used[i] = draining(live[i])
            if tightest is None or caps[i] - used[i] < caps[tightest] - used[tightest]:
                tightest = i
        room = count if tightest is None else caps[tightest] - used[tightest]
        taken = max(0, min(count, room))
        for i in applying:
            used[i] += taken
        admitted.append(taken)
        if taken < count and tightest is not None:
            b = live[tightest]
            refused[index] = BudgetUse(b, True, totals[tightest], caps[tightest], used[tightest])
    return admitted, refused


def _cap(budget: Budget, machines_in_scope: int, shares: Mapping[str, int] | None) -> int:
    """A budget's cap on this shard: its share of a count when one is dealt, else its own."""
    if shares is not None and budget.count is not None:
        return max(0, min(budget.count, shares.get(budget.name, 0)))
    return budget.cap(machines_in_scope)


# -- parsing -------------------------------------------------------------------------


def _strings(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BudgetError(where, "must be a list of non-empty strings")
    return tuple(value)


_CAPACITY_TYPES = ("on-demand", "spot", "reserved", "bare-metal")
_KEYS = {"name", "nodes", "reasons", "scope", "schedule", "duration"}
_SCOPE_KEYS = {"instance_types", "capacity_types", "resources", "clusters"}


def _duration(value: object, where: str) -> int:
    """Seconds from ``90``, ``"90s"``, ``"30m"``, ``"10h"``, ``"1h30m"`` or ``"2d"``."""
    if isinstance(value, bool):
        raise BudgetError(where, "must be seconds or a duration like '10h'")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value:
        seconds, number = 0, ""
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        for char in value:
            if char.isdigit():
                number += char
            elif char in units and number:
                seconds += int(number) * units[char]
                number = ""
            else:
                raise BudgetError(where, f"{value!r} is not a duration like '10h' or '1h30m'")
        if number:
            raise BudgetError(where, f"{value!r} ends without a unit (s, m, h, d)")
    else:
        raise BudgetError(where, "must be seconds or a duration like '10h'")
    if not 0 < seconds <= MAX_WINDOW_SECONDS:
        raise BudgetError(where, f"{seconds} s is outside 1 s to 7 days")
    return seconds


def _budget(item: object, where: str) -> Budget:
    if not isinstance(item, Mapping):
        raise BudgetError(where, "must be an object")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise BudgetError(f"{where}.{unknown[0]}", f"unknown field (known: {sorted(_KEYS)})")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise BudgetError(f"{where}.name", "must be a non-empty string")
    nodes = item.get("nodes")
    count: int | None = None
    percent: float | None = None
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        count = nodes
    elif isinstance(nodes, str) and nodes.endswith("%"):
        try:
            percent = float(nodes[:-1])
        except ValueError:
            raise BudgetError(f"{where}.nodes", f"{nodes!r} is not a percentage") from None
        if not math.isfinite(percent):
            raise BudgetError(f"{where}.nodes", f"{nodes!r} is not a percentage")
    elif isinstance(nodes, str) and nodes.isdigit():
        count = int(nodes)
    else:
        raise BudgetError(f"{where}.nodes", "must be a count (3) or a percentage ('10%')")
    reason_names = _strings(item.get("reasons", ["reclaim"]), f"{where}.reasons")
    reasons: set[DrainReason] = set()
    for i, text in enumerate(reason_names):
        try:
            reasons.add(DrainReason(text))
        except ValueError:
            known = [r.value for r in DrainReason]
            raise BudgetError(f"{where}.reasons[{i}]", f"{text!r} is not one of {known}") from None
    raw_scope = item.get("scope", {})
    if not isinstance(raw_scope, Mapping):
        raise BudgetError(f"{where}.scope", "must be an object")
    unknown = sorted(set(raw_scope) - _SCOPE_KEYS)
    if unknown:
        raise BudgetError(
            f"{where}.scope.{unknown[0]}", f"unknown field (known: {sorted(_SCOPE_KEYS)})"
        )
    scope = Scope(
        instance_types=_strings(raw_scope.get("instance_types"), f"{where}.scope.instance_types"),
        capacity_types=_strings(raw_scope.get("capacity_types"), f"{where}.scope.capacity_types"),
        resources=_strings(raw_scope.get("resources"), f"{where}.scope.resources"),
        clusters=_strings(raw_scope.get("clusters"), f"{where}.scope.clusters"),
    )
    for i, kind in enumerate(scope.capacity_types):
        if kind not in _CAPACITY_TYPES:
            raise BudgetError(
                f"{where}.scope.capacity_types[{i}]",
                f"{kind!r} is not one of {list(_CAPACITY_TYPES)}",
            )
    window: Window | None = None
    schedule, duration = item.get("schedule"), item.get("duration")
    if (schedule is None) != (duration is None):
        raise BudgetError(f"{where}.schedule", "a window needs both a schedule and a duration")
    if schedule is not None:
        if not isinstance(schedule, str):
            raise BudgetError(f"{where}.schedule", "must be a cron expression")
        window = Window(
            CronSchedule.parse(schedule, where=f"{where}.schedule"),
            _duration(duration, f"{where}.duration"),
        )
    try:
        return Budget(
            name=name,
            scope=scope,
            reasons=frozenset(reasons),
            count=count,
            percent=percent,
            window=window,
        )
    except BudgetError as error:
        raise BudgetError(f"{where}.{error.field.rpartition('.')[2]}", error.reason) from None


def parse_budgets(data: object) -> tuple[Budget, ...]:
    """Budgets from their JSON form: a list of objects (the format ``docs/budgets.md`` shows).

    ``{"name": "gpu", "nodes": "10%", "reasons": ["reclaim", "preempt"],
    "scope": {"resources": ["nvidia.com/gpu"]}, "schedule": "0 8 * * 1-5",
    "duration": "10h"}``. Raises :class:`BudgetError` naming the field
    (``budgets[2].nodes``) and the reason; names must be unique.
    """
    if not isinstance(data, list):
        raise BudgetError("budgets", "must be a list of budget objects")
    result = tuple(_budget(item, f"budgets[{i}]") for i, item in enumerate(data))
    seen: set[str] = set()
    for i, budget in enumerate(result):
        if budget.name in seen:
            raise BudgetError(f"budgets[{i}].name", f"{budget.name!r} is used twice")
        seen.add(budget.name)
    return result


# -- enforcement on a cycle's actions ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrainGroup:
    """Machines of one drain segment that a scope cannot tell apart (one shape, one cluster).

    ``rows`` are in plan order; ``protected`` maps a row to (until, need key)
    when a need's do-not-disrupt covers it.
    """

    segment: int
    rows: tuple[int, ...]
    subject: Subject
    reason: DrainReason
    protected: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    #: The (cluster, need key) a preemption would have served ("" for other drains).
    served: tuple[str, str] = ("", "")


def drain_reason(kind: int) -> DrainReason | None:
    """The budget reason of an action kind (None for kinds that drain nothing)."""
    if kind == ActionKind.RECLAIM:
        return DrainReason.RECLAIM
    if kind == ActionKind.PREEMPT:
        return DrainReason.PREEMPT
    if kind == ActionKind.INTERRUPT:
        return DrainReason.INTERRUPTION
    return None


def filter_log(log: ActionLog, refused: Mapping[int, frozenset[int]]) -> ActionLog:
    """A copy of ``log`` without the refused rows (segment -> rows to drop).

    Committing relies on a tail segment being exactly the last rows of its
    pool (``ActionLog``). A segment that lost rows, and every later segment
    of the same pool, is therefore marked as picked from inside the pool;
    the engine then commits them machine by machine.
    """
    result = ActionLog()
    disturbed: set[int] = set()
    for s in range(len(log)):
        rows = log.rows[s]
        drop = refused.get(s)
        pool = log.pool[s]
        if drop:
            rows = np.array([r for r in rows.tolist() if r not in drop], dtype=np.int64)
            if pool >= 0:
                disturbed.add(pool)
        tail = log.tail[s] and not drop and pool not in disturbed
        n = log.need[s]
        result.add(
            ActionKind(log.kind[s]),
            rows,
            cluster=log.cluster[s],
            pool=pool,
            tail=tail,
            source=log.source[s],
            need=None if n < 0 else log.needs[n],
            priority=log.priority[s],
            victim_priority=log.victim_priority[s],
            grace=log.grace[s],
            opens=log.opens[s],
        )
    return result


def enforce(
    log: ActionLog,
    *,
    budgets: Sequence[Budget],
    now: float,
    groups: Sequence[DrainGroup],
    machine_id: Callable[[int], str],
    in_scope: Callable[[Budget], int],
    draining: Callable[[Budget], int],
    shares: Mapping[str, int] | None = None,
) -> tuple[ActionLog, tuple[Hold, ...]]:
    """Apply do-not-disrupt, then the budgets, to the drains of ``log``.

    ``groups`` are the log's drain segments split by shape and cluster, in
    plan order. Within a group the first machines are admitted and the
    rest held. Returns the log to commit (``log`` itself when nothing was
    held) and the holds, one per machine held.
    """
    holds: list[Hold] = []
    refused: dict[int, set[int]] = {}
    open_rows: list[list[int]] = []
    for group in groups:
        rows = list(group.rows)
        if group.reason is DrainReason.RECLAIM and group.protected:
            kept = []
            for row in rows:
                guard = group.protected.get(row)
                if guard is not None and guard[0] > now:
                    refused.setdefault(group.segment, set()).add(row)
                    holds.append(
                        Hold(
                            machine_id=machine_id(row),
                            cluster_id=group.subject.cluster_id,
                            reason=group.reason,
                            cause="do-not-disrupt",
                            need_key=guard[1],
                            until=guard[0],
                        )
                    )
                else:
                    kept.append(row)
            rows = kept
        open_rows.append(rows)
    if budgets:
        admitted, cut = admit_counts(
            budgets,
            now=now,
            requests=[
                (g.subject, g.reason, len(rows)) for g, rows in zip(groups, open_rows, strict=True)
            ],
            in_scope=in_scope,
            draining=draining,
            shares=shares,
        )
        for index, use in cut.items():
            group, rows = groups[index], open_rows[index]
            for row in rows[admitted[index] :]:
                refused.setdefault(group.segment, set()).add(row)
                holds.append(
                    Hold(
                        machine_id=machine_id(row),
                        cluster_id=group.subject.cluster_id,
                        reason=group.reason,
                        cause="budget",
                        budget=use.budget.name,
                        cap=use.cap,
                        draining=use.draining,
                        for_cluster=group.served[0],
                        for_need=group.served[1],
                        fleet_cap=(
                            use.budget.count or 0
                            if shares is not None and use.budget.count is not None
                            else 0
                        ),
                    )
                )
    if not refused:
        return log, ()
    return filter_log(log, {s: frozenset(r) for s, r in refused.items()}), tuple(holds)


class _Census:
    """Counts over an inventory for budgets: the machines of a scope, and those draining.

    Machines of one (profile, cluster) are alike to a scope, so both counts
    work over those pairs, each computed once.
    """

    def __init__(
        self,
        inventory: Inventory,
        *,
        catalog: ProfileCatalog,
        names: Callable[[int], str],
        draining: Mapping[int, DrainReason],
    ) -> None:
        self._inventory = inventory
        self._catalog = catalog
        self._names = names
        self._draining = draining
        self._shapes: dict[int, tuple[str, str, frozenset[str]]] = {}
        self._pairs: list[tuple[int, int, int]] | None = None
        self._alike: dict[tuple[int, int, DrainReason], int] | None = None

    def shape(self, profile: int) -> tuple[str, str, frozenset[str]]:
        known = self._shapes.get(profile)
        if known is None:
            p = self._catalog.profile(profile)
            offered = frozenset(name for name, amount in p.allocatable if amount > 0)
            known = (p.instance_type, capacity_type_label(p.capacity_type), offered)
            self._shapes[profile] = known
        return known

    def subject(self, profile: int, cluster: int) -> Subject:
        instance_type, capacity_type, resources = self.shape(profile)
        return Subject(instance_type, capacity_type, resources, self._names(cluster))

    def in_scope(self, budget: Budget) -> int:
        """Machines of the inventory in ``budget``'s scope."""
        if self._pairs is None:
            self._pairs = []
            inventory = self._inventory
            held = inventory.ids.rows
            live = inventory.ids.strings.fmt[:held] != 0  # rows holding a machine
            if live.any():
                profiles = inventory.profile[:held][live].astype(np.int64)
                clusters = inventory.cluster[:held][live].astype(np.int64) + 1
                width = int(clusters.max()) + 1
                counts = np.bincount(profiles * width + clusters)
                keys = np.flatnonzero(counts)
                self._pairs = [(k // width, k % width - 1, int(counts[k])) for k in keys.tolist()]
        return sum(n for p, c, n in self._pairs if budget.scope.matches(self.subject(p, c)))

    def draining(self, budget: Budget) -> int:
        """Machines in ``budget``'s scope draining for one of its reasons."""
        if self._alike is None:
            inventory = self._inventory
            self._alike = {}
            for row, reason in self._draining.items():
                key = (int(inventory.profile[row]), int(inventory.cluster[row]), reason)
                self._alike[key] = self._alike.get(key, 0) + 1
        return sum(
            n
            for (p, c, reason), n in self._alike.items()
            if reason in budget.reasons and budget.scope.matches(self.subject(p, c))
        )


def census(
    budgets: Sequence[Budget],
    inventory: Inventory,
    *,
    catalog: ProfileCatalog,
    names: Callable[[int], str],
    draining: Mapping[int, DrainReason],
) -> list[tuple[Budget, int, int]]:
    """(budget, machines in scope, draining) for each *count* budget, over this shard.

    What a shard tells the coordinator so it can deal each count over the
    fleet (:func:`shard_engine.coordination.deal_count`).
    """
    counts = [b for b in budgets if b.count is not None]
    if not counts:
        return []
    tally = _Census(inventory, catalog=catalog, names=names, draining=draining)
    return [(b, tally.in_scope(b), tally.draining(b)) for b in counts]


def apply(
    sheet: Worksheet,
    *,
    budgets: Sequence[Budget],
    demands: Mapping[int, Demand],
    catalog: ProfileCatalog,
    names: Callable[[int], str],
    draining: Mapping[int, DrainReason],
    shares: Mapping[str, int] | None = None,
) -> tuple[ActionLog, tuple[Hold, ...]]:
    """:func:`enforce` on a worksheet's log, reading machines from its inventory.

    ``demands`` are the cycle's compiled needs per cluster (for
    do-not-disrupt), ``names`` names a cluster index, ``draining`` maps the
    rows already in flight for a drain to its reason, ``shares`` this shard's
    shares of fleet-wide counts (None: each count holds per shard). Costs
    nothing when no budget is configured and no reclaimed machine's cluster
    asks for do-not-disrupt; otherwise it works per drain segment (a
    segment's machines share a pool, so a shape and a cluster), plus one
    count per budget that applies over the inventory's (profile, cluster)
    pairs, and per machine only where do-not-disrupt is asked or a machine
    is held.
    """
    log = sheet.log
    reclaim, preempt = int(ActionKind.RECLAIM), int(ActionKind.PREEMPT)
    interrupt = int(ActionKind.INTERRUPT)
    drains = [s for s, kind in enumerate(log.kind) if kind in (reclaim, preempt, interrupt)]
    if not drains:
        return log, ()
    asks: dict[int, bool] = {}  # per cluster: does any need ask for do-not-disrupt?
    for s in drains:
        cluster = log.cluster[s]
        if log.kind[s] == reclaim and cluster not in asks:
            d = demands.get(cluster)
            asks[cluster] = d is not None and any(n.do_not_disrupt_seconds > 0 for n in d.needs)
    protected = {c for c, asked in asks.items() if asked}
    if not budgets and not protected:
        return log, ()
    inventory = sheet.inventory
    now = sheet.now
    now_s = inventory.seconds(now)
    tally = _Census(inventory, catalog=catalog, names=names, draining=draining)

    def protection(cluster: int, rows: Sequence[int]) -> dict[int, tuple[float, str]]:
        demand = demands[cluster]
        guards: dict[int, tuple[float, str]] = {}
        for row in rows:
            profile = int(inventory.profile[row])
            configured_at = now - (now_s - int(inventory.since[row]))
            for i, need in enumerate(demand.needs):
                seconds = need.do_not_disrupt_seconds
                if seconds <= 0 or profile >= demand.matrix.shape[1]:
                    continue
                if (
                    demand.matrix[i, profile]
                    and configured_at + seconds > guards.get(row, (0.0, ""))[0]
                ):
                    guards[row] = (configured_at + seconds, demand.keys[i])
        return guards

    groups: list[DrainGroup] = []
    for s in drains:
        reason = drain_reason(log.kind[s])
        assert reason is not None
        rows = log.rows[s]
        first = int(rows[0])
        if log.pool[s] >= 0:
            # Taken from one pool: one shape and one cluster (a bound pool's key).
            parts = [(int(inventory.profile[first]), int(inventory.cluster[first]), rows.tolist())]
        else:
            profiles = inventory.profile[rows].astype(np.int64)
            clusters = inventory.cluster[rows].astype(np.int64)
            by_key: dict[tuple[int, int], list[int]] = {}
            for row, p, c in zip(rows.tolist(), profiles.tolist(), clusters.tolist(), strict=True):
                by_key.setdefault((p, c), []).append(row)
            parts = [(p, c, members) for (p, c), members in by_key.items()]
        served = (
            (names(log.cluster[s]), log.need_key(s))
            if reason is DrainReason.PREEMPT and log.need[s] >= 0
            else ("", "")
        )
        for profile, cluster, members in parts:
            guard = protection(log.cluster[s], members) if log.cluster[s] in protected else {}
            groups.append(
                DrainGroup(
                    s, tuple(members), tally.subject(profile, cluster), reason, guard, served
                )
            )

    return enforce(
        log,
        budgets=budgets,
        now=now,
        groups=groups,
        machine_id=inventory.ids.id_of,
        in_scope=tally.in_scope,
        draining=tally.draining,
        shares=shares,
    )


def use_of(
    budgets: Sequence[Budget],
    *,
    now: float,
    machines: Sequence[Subject],
    draining: Sequence[tuple[Subject, DrainReason]],
) -> list[BudgetUse]:
    """Each budget's use at ``now`` over a list of machines and the drains running among them.

    For ``bigfleet budgets``: the same counting :func:`admit` does, read
    from outside (the providers' machines and the running drain workflows).
    """
    result = []
    for budget in budgets:
        total = sum(1 for m in machines if budget.scope.matches(m))
        used = sum(
            1
            for subject, reason in draining
            if reason in budget.reasons and budget.scope.matches(subject)
        )
        result.append(BudgetUse(budget, budget.in_force(now), total, budget.cap(total), used))
    return result
