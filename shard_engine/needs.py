"""The needs table: every cluster's latest demand, validated, ordered and compiled.

Roll-ups only *update* this table; the cycle alone acts (declarative, §8 of
the paper). A roll-up replaces everything its cluster asked for before. One
older than the newest seen for its cluster is stale and ignored; one that
drops nearly every row is quarantined (see ``quarantine``); one with a
semantic problem is rejected whole with the field named, and the previous
needs stay in force.

Needs are ordered by priority (descending), then by arrival: the first time
a need key was seen from its cluster. A need that survives many roll-ups
keeps its place in the queue.

Per cluster, the needs compile lazily into numpy arrays (:class:`Demand`):
aggregate and ``min_unit`` vectors, penalties, and a boolean matrix saying
which profiles may serve which need. The matrix is what turns "how much does
this need already have" into one small matrix product per cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.clusters import ClusterIndex
from shard_engine.model import (
    AppClass,
    Need,
    Rollup,
    TopologySpread,
    WhenUnsatisfiable,
)
from shard_engine.names import KNOWN_LABEL_KEYS, label_key_problem, machine_id_problem
from shard_engine.quantity import MAX_QUANTITY, MIN_QUANTITY, quantity_problem
from shard_engine.quarantine import QuarantineRule
from shard_engine.requirements import MaskKey, RequirementMasks, mask_key, validate_requirements
from shard_engine.resources import APP_CLASS_VICTIM_RANK, InvalidResource, ResourceVec
from shard_engine.topology import domain_codes, is_pinned, same_keys

__all__ = [
    "MAX_NEEDS",
    "ClusterNeeds",
    "Demand",
    "NeedsTable",
    "RollupOutcome",
    "RollupRejected",
    "Validated",
    "ValidatedRollup",
    "check_clock",
    "validate_rollup",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

PINNED_DOLLARS = 1e12
"""Penalties above this (or infinite) are clamped to it so arithmetic stays finite."""

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

MAX_NEEDS = 10_000
"""Most need rows one roll-up may carry."""


def _widened(rows: FloatArray, width: int) -> FloatArray:
    """A copy of ``rows`` with zero columns added up to ``width``."""
    if rows.shape[1] >= width:
        return rows.copy()
    return np.pad(rows, ((0, 0), (0, width - rows.shape[1])))


class RollupRejected(ValueError):
    """A roll-up with a semantic problem; nothing of it was applied."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True)
class RollupOutcome:
    """What :meth:`NeedsTable.apply` did with a roll-up."""

    status: Literal["applied", "stale", "quarantined"]
    detail: str = ""


def _penalty(value: float, *, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise RollupRejected(field, f"not a number: {value!r}")
    if value < 0:
        raise RollupRejected(field, f"negative: {value!r}")
    return float(min(value, PINNED_DOLLARS))


def _resources(amounts: Mapping[str, float], *, field: str) -> dict[str, float]:
    out: dict[str, float] = {}
    known = KNOWN_LABEL_KEYS
    for name, value in amounts.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0.0 <= value <= MAX_QUANTITY  # NaN, infinities, negatives, overflow
            or 0.0 < value < MIN_QUANTITY  # underflow
            or name not in known
        ):
            _check_resource(name, value, field=field)
        if value > 0:
            out[name] = float(value)
    return out


def _validate_release(release: frozenset[str] | None) -> None:
    if release is None:
        return
    if not isinstance(release, frozenset):
        raise RollupRejected("release", f"not a set of machine ids: {type(release).__name__}")
    for machine_id in release:
        if not isinstance(machine_id, str):
            raise RollupRejected("release", f"machine ids must be strings: {machine_id!r}")
        problem = machine_id_problem(machine_id)
        if problem is not None:
            raise RollupRejected("release", f"machine id {problem}")


def _check_resource(name: str, value: float, *, field: str) -> None:
    """Raise :class:`RollupRejected` naming what is wrong with one resource amount."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or not isinstance(name, str)
        or not name
    ):
        try:  # the resource algebra says precisely what is wrong
            ResourceVec.from_mapping({name: value}, field=field)
        except InvalidResource as exc:
            raise RollupRejected(exc.field, exc.reason) from None
        raise RollupRejected(f"{field}[{name}]", f"invalid amount {value!r}")
    problem = label_key_problem(name)
    if problem is not None:
        raise RollupRejected(field, f"resource name {problem}")
    problem = quantity_problem(value)
    if problem is not None:
        raise RollupRejected(f"{field}[{name}]", problem)


def _sizes(need: Need, *, field: str) -> tuple[dict[str, float], dict[str, float]]:
    """A need's aggregate and ``min_unit``, checked and without zero amounts."""
    return (
        _resources(need.aggregate, field=f"{field}.aggregate"),
        _resources(need.min_unit, field=f"{field}.min_unit"),
    )


Validated = tuple[Need, Need, str]
"""A need as received, as normalised, and its key: reused while a cluster re-sends it."""


def _same_identity(a: Need, b: Need) -> bool:
    """True when two needs differ at most in size (aggregate, ``min_unit``): every other field
    a row carries is compared, so a resized row keeps them all (``_resized``)."""
    return (
        a.requirements == b.requirements
        and a.priority == b.priority
        and a.spread == b.spread
        and a.interruption_penalty == b.interruption_penalty
        and a.reclamation_penalty == b.reclamation_penalty
        and a.app_class == b.app_class
        and a.do_not_disrupt_seconds == b.do_not_disrupt_seconds
        and a.gang_name == b.gang_name
    )


def _resized(need: Need, aggregate: dict[str, float], unit: dict[str, float]) -> Need:
    """``need`` with a new aggregate and ``min_unit``: ``dataclasses.replace``, spelled out.

    A size change is the usual edit of a roll-up, and ``replace`` costs
    several times a direct construction; a unit test holds this to every
    field of :class:`Need`.
    """
    return Need(
        requirements=need.requirements,
        aggregate=aggregate,
        priority=need.priority,
        min_unit=unit,
        spread=need.spread,
        interruption_penalty=need.interruption_penalty,
        reclamation_penalty=need.reclamation_penalty,
        app_class=need.app_class,
        do_not_disrupt_seconds=need.do_not_disrupt_seconds,
        gang=need.gang,
        gang_name=need.gang_name,
    )


def _merged(earlier: Need, need: Need) -> Need:
    """Two rows with one key as one need: aggregates summed, the larger ``min_unit`` per
    resource, the most protective app class; every other field is ``earlier``'s."""
    aggregate = dict(earlier.aggregate)
    for name, value in need.aggregate.items():
        aggregate[name] = aggregate.get(name, 0.0) + value
    unit = dict(earlier.min_unit)
    for name, value in need.min_unit.items():
        unit[name] = max(unit.get(name, 0.0), value)
    app = max((earlier.app_class, need.app_class), key=APP_CLASS_VICTIM_RANK.__getitem__)
    return replace(earlier, aggregate=aggregate, min_unit=unit, app_class=app)


Merge = tuple[int, int]
"""What a merge was made of: the ids of the need so far and the row merged into it, or, for
an unnamed gang numbered ``k``, the row's id and ``-k``."""

Merged = tuple[Need, Need, Need | None]
"""A merge's parts (kept, so the ids stay theirs) and what it made: the merged need, the
numbered gang, or None when the row turned out to be a gang of its own."""


#: Longest ``gang_name`` (a Kubernetes object name's limit).
MAX_GANG_NAME = 253


def _validate_gang_name(need: Need, *, field: str) -> None:
    name = need.gang_name
    if not isinstance(name, str):
        raise RollupRejected(field, f"not a string: {name!r}")
    if len(name) > MAX_GANG_NAME:
        raise RollupRejected(field, f"{len(name)} characters; at most {MAX_GANG_NAME}")
    if not name.isprintable():
        raise RollupRejected(field, f"contains control characters: {name!r}")
    if not same_keys(need):
        raise RollupRejected(
            field, "given on a need without a SAME requirement (only a gang has a name)"
        )


def _validate_need(need: Need, *, field: str) -> Need:
    if isinstance(need.priority, bool) or not isinstance(need.priority, int):
        raise RollupRejected(f"{field}.priority", f"not an integer: {need.priority!r}")
    if not _INT32_MIN <= need.priority <= _INT32_MAX:
        raise RollupRejected(f"{field}.priority", f"outside int32: {need.priority}")
    try:
        validate_requirements(need.requirements, field=f"{field}.requirements")
    except ValueError as exc:
        where, _, why = str(exc).partition(": ")
        raise RollupRejected(where, why) from None
    for j, spread in enumerate(need.spread):
        where = f"{field}.spread[{j}]"
        if not isinstance(spread.topology_key, str) or not spread.topology_key:
            raise RollupRejected(f"{where}.topology_key", "empty")
        problem = label_key_problem(spread.topology_key)
        if problem is not None:
            raise RollupRejected(f"{where}.topology_key", problem)
        if isinstance(spread.max_skew, bool) or not isinstance(spread.max_skew, int):
            raise RollupRejected(f"{where}.max_skew", "not an integer")
        if spread.max_skew < 1:
            raise RollupRejected(f"{where}.max_skew", f"must be at least 1, got {spread.max_skew}")
    if not isinstance(need.app_class, AppClass):
        raise RollupRejected(f"{field}.app_class", f"unknown app class {need.app_class!r}")
    if need.gang_name:
        _validate_gang_name(need, field=f"{field}.gang_name")
    spreads = tuple(
        s
        if s.when_unsatisfiable != WhenUnsatisfiable.UNSPECIFIED
        else TopologySpread(s.topology_key, s.max_skew, WhenUnsatisfiable.DO_NOT_SCHEDULE)
        for s in need.spread
    )
    aggregate, unit = _sizes(need, field=field)
    return replace(
        need,
        aggregate=aggregate,
        min_unit=unit,
        interruption_penalty=_penalty(
            need.interruption_penalty, field=f"{field}.interruption_penalty"
        ),
        reclamation_penalty=_penalty(
            need.reclamation_penalty, field=f"{field}.reclamation_penalty"
        ),
        spread=spreads,
    )


def check_clock(stamp_ns: object, *, now: float, max_skew_seconds: float | None) -> None:
    """Refuse a stamp more than ``max_skew_seconds`` ahead of ``now`` (seconds since the epoch).

    One operator with a clock a year ahead must not make every later roll-up
    of its cluster stale: its roll-up is refused (and so not remembered)
    instead. ``None`` accepts any stamp.
    """
    if max_skew_seconds is None or type(stamp_ns) is not int:
        return
    ahead_ns = stamp_ns - int(now * 1e9)
    if ahead_ns > max_skew_seconds * 1e9:
        raise RollupRejected(
            "timestamp_ns",
            f"{ahead_ns // 10**9} s ahead of the shard's clock; "
            f"at most {max_skew_seconds:g} s of clock skew is accepted",
        )


def _equal_prefix(needs: Sequence[Need], before: Sequence[Need]) -> int:
    """How many leading rows of ``needs`` equal ``before``'s, row for row."""
    count = 0
    for now, then in zip(needs, before, strict=False):
        if now is not then and now != then:
            break
        count += 1
    return count


def _validate_fields(rollup: Rollup) -> None:
    """The roll-up's own fields (not its need rows): checked on every roll-up, even unchanged."""
    if not isinstance(rollup.cluster_id, str) or not rollup.cluster_id:
        raise RollupRejected("cluster_id", "empty")
    if isinstance(rollup.timestamp_ns, bool) or not isinstance(rollup.timestamp_ns, int):
        raise RollupRejected("timestamp_ns", f"not an integer: {rollup.timestamp_ns!r}")
    if rollup.timestamp_ns < 0:
        raise RollupRejected("timestamp_ns", f"negative: {rollup.timestamp_ns}")
    if len(rollup.needs) > MAX_NEEDS:
        raise RollupRejected("needs", f"{len(rollup.needs)} needs; at most {MAX_NEEDS}")
    if rollup.reported_nodes is not None and any(
        not isinstance(n, str) for n in rollup.reported_nodes
    ):
        raise RollupRejected("reported_nodes", "node names must be strings")
    _validate_release(rollup.release)


def validate_rollup(
    rollup: Rollup,
    previous: Sequence[Validated] = (),
    *,
    equal: int = 0,
    merges: Mapping[Merge, Merged] | None = None,
    keep: dict[Merge, Merged] | None = None,
) -> tuple[dict[str, Need], tuple[Validated, ...]]:
    """Check a roll-up and return its needs by key, normalised, one per need key.

    Two rows with the same key (same requirements, priority, spread and
    penalties) are one need on the wire's own terms: their aggregates are
    summed, the larger ``min_unit`` per resource kept, and the most
    protective app class wins. A row with a Same requirement is a gang and
    is never merged: a gang with a name (``Need.gang_name``) is told apart by
    it, and the second and later unnamed gangs with one key are numbered
    (``Need.gang``, ADR 0126, 0161). Infinite penalties become ``PINNED_DOLLARS``.

    ``previous`` is what the cluster's last roll-up validated to, row by
    row: a row equal to its predecessor is reused, and one that differs only
    in size keeps its key and requirement checks (operators re-send their
    needs in a stable order, and a size change is the common edit).
    ``equal`` says the first that many rows are already known to equal
    ``previous``'s (the caller compared them), so they are not compared again.
    ``merges`` is what merging the last roll-up's rows made (see :data:`Merge`):
    two reused rows merged again give the very need they gave then. The
    merges this roll-up makes are recorded in ``keep`` for the next one.
    """
    _validate_fields(rollup)
    merged: dict[str, Need] = {}
    gangs: dict[str, int] = {}
    validated: list[Validated] = []
    made = {} if merges is None else merges
    reused = len(previous)
    for i, raw in enumerate(rollup.needs):
        before = previous[i] if i < reused else None
        if before is not None and raw is before[0]:
            row = before
        elif before is not None and (i < equal or raw == before[0]):
            row = (raw, before[1], before[2])
        elif before is not None and _same_identity(raw, before[0]):
            aggregate, unit = _sizes(raw, field=f"needs[{i}]")
            row = (raw, _resized(before[1], aggregate, unit), before[2])
        else:
            need = _validate_need(raw, field=f"needs[{i}]")
            row = (raw, need, need.key)
        validated.append(row)
        _, need, key = row
        earlier = merged.get(key)
        if earlier is None:
            merged[key] = need
            continue
        if need.gang_name:  # the key holds the name: a second row names the gang again
            raise RollupRejected(
                f"needs[{i}].gang_name",
                f"names gang {need.gang_name!r} a second time (one row per gang)",
            )
        pair = (id(earlier), id(need))
        known = made.get(pair)
        if known is None or known[0] is not earlier or known[1] is not need:
            # None: a gang of its own, in the order the roll-up lists them.
            known = (earlier, need, None if same_keys(need) else _merged(earlier, need))
        if keep is not None:
            keep[pair] = known
        if known[2] is not None:
            merged[key] = known[2]
            continue
        ordinal = gangs[key] = gangs.get(key, 0) + 1
        numbering = (id(need), -ordinal)
        known = made.get(numbering)
        if known is None or known[0] is not need:
            known = (need, need, replace(need, gang=ordinal))
        if keep is not None:
            keep[numbering] = known
        numbered = known[2]
        assert numbered is not None
        merged[numbered.key] = numbered
    return merged, tuple(validated)


_ADMIT = object()
"""Held only by :meth:`ValidatedRollup.check`: no other code builds the type."""


@dataclass(frozen=True, slots=True, eq=False)
class ValidatedRollup:
    """A roll-up the engine's rules accepted: the only thing :meth:`NeedsTable.apply` takes.

    Validation (the rules of :func:`validate_rollup` and the clock-skew bound
    of :func:`check_clock`) runs once, where the roll-up enters — the
    Session port's thread in a shard process, the caller in the simulator
    and the tests — and the table trusts the result. Before this type a
    roll-up was judged on the sessions thread and again on the shard's
    loop, each with its own cache (ADR 0145).

    The one cache is this value itself: :meth:`check` is given the
    cluster's previous ``ValidatedRollup`` and reuses its rows — a row that
    is, or equals, its predecessor at the same index costs nothing, one
    that differs only in size keeps its key and requirement checks. An
    unchanged re-send shares the previous value's ``rows`` and ``merged``
    objects, which is how the table recognises it at once.

    ``rollup`` is the roll-up as received; ``merged`` its needs by key as
    :func:`validate_rollup` returns them, which must not be changed: later
    values share it.
    """

    rollup: Rollup
    rows: tuple[Validated, ...]
    merged: Mapping[str, Need]
    token: object = field(default=None, repr=False)
    # What merging the rows made (validate_rollup's ``keep``): the next roll-up reuses it.
    merges: Mapping[Merge, Merged] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.token is not _ADMIT:
            raise TypeError("a ValidatedRollup is made by ValidatedRollup.check, not by hand")

    @property
    def cluster_id(self) -> str:
        return self.rollup.cluster_id

    @property
    def timestamp_ns(self) -> int:
        return self.rollup.timestamp_ns

    @classmethod
    def check(
        cls,
        rollup: Rollup,
        previous: ValidatedRollup | None = None,
        *,
        now: float | None = None,
        max_skew_seconds: float | None = None,
    ) -> ValidatedRollup:
        """Judge ``rollup`` by the engine's rules; raise :class:`RollupRejected` naming the field.

        ``previous`` is the cluster's last accepted value (any earlier one is
        as sound: reuse is exact, it only saves work). With ``now`` (seconds
        since the epoch, the clock the stamps share) a stamp more than
        ``max_skew_seconds`` ahead is refused too.
        """
        if now is not None:
            check_clock(rollup.timestamp_ns, now=now, max_skew_seconds=max_skew_seconds)
        if previous is not None and previous.rollup.cluster_id != rollup.cluster_id:
            previous = None
        merged: Mapping[str, Need]
        merges: dict[Merge, Merged] = {}
        if previous is None:
            merged, rows = validate_rollup(rollup, keep=merges)
        elif rollup.needs == previous.rollup.needs:
            # The usual re-send: one C-level comparison (identity first, and the
            # Session port hands back the very objects for needs re-sent unchanged).
            _validate_fields(rollup)
            return cls(rollup, previous.rows, previous.merged, _ADMIT, previous.merges)
        else:
            equal = _equal_prefix(rollup.needs, previous.rollup.needs)
            merged, rows = validate_rollup(
                rollup, previous.rows, equal=equal, merges=previous.merges, keep=merges
            )
        return cls(rollup, rows, merged, _ADMIT, merges)

    @classmethod
    def relayed(cls, rollup: Rollup, merged: Mapping[str, Need]) -> ValidatedRollup:
        """A roll-up :meth:`check` accepted in another process of the same shard, rebuilt here.

        Reserved for the relay from a shard's edge processes to its engine
        process (``bigfleet.edge``, ADR 0147): the edge judged the roll-up
        and sent ``merged`` as :meth:`check` returned it; nothing is judged
        again. ``rollup.needs`` should be ``merged``'s values. The value has
        no rows, so a :meth:`check` given it as ``previous`` reuses nothing
        (it is as sound, only slower).
        """
        return cls(rollup, (), merged, _ADMIT)


@dataclass(slots=True)
class Demand:
    """One cluster's needs compiled against the current catalog (see module docstring).

    Rows are the cluster's needs in cycle order (priority descending, then
    arrival). ``matrix[i, p]`` says profile ``p`` may serve need ``i``;
    ``serving[p]`` is the first (highest-priority) need profile ``p`` serves
    or -1, which is how Phase 2 and Phase 3 know what a configured machine
    is worth to its cluster.
    """

    cluster: int
    needs: tuple[Need, ...]
    keys: tuple[str, ...]
    priority: npt.NDArray[np.int64]
    arrival: npt.NDArray[np.int64]
    aggregate: FloatArray
    min_unit: FloatArray
    interruption_penalty: FloatArray
    reclamation_penalty: FloatArray
    app_rank: npt.NDArray[np.int8]
    mask_keys: tuple[MaskKey, ...]
    matrix: BoolArray
    serving: npt.NDArray[np.int32]
    gang_keys: tuple[tuple[str, ...], ...]
    # Per need: a gang whose running pods pin it to the domain its Same names (ADR 0160).
    pinned: tuple[bool, ...]
    topological: BoolArray
    profiles: int
    dims: int
    version: int
    gang_domain: Mapping[str, int] = field(default_factory=dict)
    slack_rows: FloatArray | None = None
    slack_tolerance: float = 0.0

    def widen(self, dims: int) -> None:
        """Pad the vectors with zero columns for resources named after compilation."""
        if dims > self.dims:
            pad = dims - self.dims
            self.aggregate = np.pad(self.aggregate, ((0, 0), (0, pad)))
            self.min_unit = np.pad(self.min_unit, ((0, 0), (0, pad)))
            self.dims = dims
            self.slack_rows = None

    def slack(self, tolerance: float) -> FloatArray:
        """``tolerance × max(aggregate, 1)`` per need and resource: the rounding a deficit may keep.

        Every phase asks for it for every short need; it only changes with the
        aggregate, so it is computed once per compiled form.
        """
        rows = self.slack_rows
        if rows is None or self.slack_tolerance != tolerance:
            rows = tolerance * np.maximum(self.aggregate, 1.0)
            self.slack_rows, self.slack_tolerance = rows, tolerance
        return rows


@dataclass(slots=True)
class ClusterNeeds:
    """Everything the table holds for one cluster."""

    index: int
    cluster_id: str
    needs: tuple[Need, ...] = ()
    keys: tuple[str, ...] = ()
    # The last applied roll-up: a re-send sharing its needs is unchanged, and a
    # caller without a cache of its own validates against it (ShardEngine).
    accepted: ValidatedRollup | None = None
    applied_ns: int | None = None
    seen_ns: int | None = None
    arrival: dict[str, int] = field(default_factory=dict)
    held: Mapping[str, Need] | None = None
    held_confirmations: int = 0
    reported_nodes: frozenset[str] | None = None
    # Machines the cluster's last applied roll-up offered for release (``Rollup.release``).
    release: frozenset[str] | None = None
    gang_domain: dict[str, int] = field(default_factory=dict)
    version: int = 0
    compiled: Demand | None = None
    # The last compiled form, kept after a change: what a size-only change reuses.
    superseded: Demand | None = None

    @property
    def quarantined(self) -> bool:
        """True while a suspicious roll-up waits for confirmation."""
        return self.held is not None


class NeedsTable:
    """All clusters' needs, with staleness, quarantine and lazy compilation."""

    def __init__(
        self,
        *,
        clusters: ClusterIndex,
        catalog: ProfileCatalog,
        masks: RequirementMasks,
        quarantine: QuarantineRule,
    ) -> None:
        self._clusters = clusters
        self._catalog = catalog
        self._masks = masks
        self._rule = quarantine
        self._entries: dict[int, ClusterNeeds] = {}
        self._arrivals = 0
        self._rows = 0
        self._releases: dict[int, frozenset[str]] = {}
        self.version = 0

    # -- roll-ups -----------------------------------------------------------------
    def apply(self, validated: ValidatedRollup) -> tuple[RollupOutcome, ClusterNeeds | None]:
        """Apply a validated roll-up (full replacement): the outcome and, when applied, the entry.

        Only a :class:`ValidatedRollup` is accepted: the rules were checked
        where the roll-up entered, once, and are not checked again here.

        A roll-up that shares its needs with the last applied one (the usual
        re-send every ten seconds, see :meth:`ValidatedRollup.check`) is
        recognised by identity and costs nothing more.
        """
        if not isinstance(validated, ValidatedRollup):
            raise TypeError(f"apply takes a ValidatedRollup, not {type(validated).__name__}")
        rollup, needs = validated.rollup, validated.merged
        found = self._clusters.find(rollup.cluster_id)
        same = self._entries.get(found) if found is not None else None
        if (
            same is not None
            and same.applied_ns is not None
            and same.held is None
            and same.accepted is not None
            and same.accepted.merged is needs
            and same.seen_ns is not None
            and rollup.timestamp_ns >= same.seen_ns
        ):
            same.seen_ns = same.applied_ns = rollup.timestamp_ns
            same.reported_nodes = rollup.reported_nodes
            self._set_release(same, rollup.release)
            return RollupOutcome("applied", f"{len(same.needs)} needs, unchanged"), same
        index = self._clusters.index_of(rollup.cluster_id)
        entry = self._entries.get(index)
        if entry is None:
            entry = ClusterNeeds(index=index, cluster_id=rollup.cluster_id)
            self._entries[index] = entry
        if entry.seen_ns is not None and rollup.timestamp_ns < entry.seen_ns:
            return (
                RollupOutcome(
                    "stale", f"timestamp {rollup.timestamp_ns} older than {entry.seen_ns}"
                ),
                None,
            )
        newer = entry.seen_ns is None or rollup.timestamp_ns > entry.seen_ns
        entry.seen_ns = rollup.timestamp_ns
        previous = set(entry.keys)
        incoming = set(needs)
        if entry.applied_ns is not None and self._rule.suspicious(previous, incoming):
            if entry.held is None:
                entry.held = needs
                entry.held_confirmations = 0
                return (
                    RollupOutcome(
                        "quarantined",
                        f"keeps {len(previous & incoming)} of {len(previous)} need rows; "
                        f"waiting for {self._rule.confirmations} confirmations",
                    ),
                    None,
                )
            if newer:
                entry.held_confirmations += 1
            entry.held = needs
            if entry.held_confirmations < self._rule.confirmations:
                return (
                    RollupOutcome(
                        "quarantined",
                        f"confirmation {entry.held_confirmations} of {self._rule.confirmations}",
                    ),
                    None,
                )
        entry.held = None
        entry.held_confirmations = 0
        entry.accepted = validated
        if (
            entry.applied_ns is not None
            and incoming == previous
            and all(
                needs[k] is n or needs[k] == n for k, n in zip(entry.keys, entry.needs, strict=True)
            )
        ):
            # Same demand re-sent (the usual case every ten seconds): nothing to recompile.
            entry.applied_ns = rollup.timestamp_ns
            entry.reported_nodes = rollup.reported_nodes
            self._set_release(entry, rollup.release)
            return RollupOutcome("applied", f"{len(needs)} needs, unchanged"), entry
        self._replace(entry, needs, rollup, same_keys=incoming == previous)
        return RollupOutcome("applied", f"{len(needs)} needs"), entry

    def _replace(
        self,
        entry: ClusterNeeds,
        needs: Mapping[str, Need],
        rollup: Rollup,
        *,
        same_keys: bool,
    ) -> None:
        if (
            same_keys
            and len(entry.keys) == len(needs)
            and all(
                needs[k].priority == n.priority
                for k, n in zip(entry.keys, entry.needs, strict=True)
            )
        ):
            # The usual edit (sizes changed, the same needs): every key keeps its
            # arrival and priority, and (priority, arrival) is unique per key, so
            # the order is the one already in force.
            entry.needs = tuple(needs[k] for k in entry.keys)
        else:
            arrival: dict[str, int] = {}
            for key in needs:
                seq = entry.arrival.get(key)
                if seq is None:
                    seq = self._arrivals
                    self._arrivals += 1
                arrival[key] = seq
            entry.arrival = arrival
            self._rows += len(needs) - len(entry.needs)
            ordered = sorted(needs.items(), key=lambda kv: (-kv[1].priority, arrival[kv[0]]))
            entry.keys = tuple(k for k, _ in ordered)
            entry.needs = tuple(n for _, n in ordered)
        entry.applied_ns = rollup.timestamp_ns
        entry.reported_nodes = rollup.reported_nodes
        self._set_release(entry, rollup.release)
        entry.gang_domain = {k: v for k, v in entry.gang_domain.items() if k in entry.arrival}
        self.touch(entry)

    def _set_release(self, entry: ClusterNeeds, release: frozenset[str] | None) -> None:
        entry.release = release
        if release is not None:
            self._releases[entry.index] = release
        else:
            self._releases.pop(entry.index, None)

    def touch(self, entry: ClusterNeeds) -> None:
        """Invalidate the entry's compiled form (its needs or gang domains changed)."""
        entry.version += 1
        if entry.compiled is not None:
            entry.superseded = entry.compiled
        entry.compiled = None
        self.version += 1

    def forget(self, cluster: int) -> bool:
        """Drop a cluster's needs entirely (it moved to another shard). True if it had any.

        Unlike an empty roll-up this is not a demand drop: nothing is reclaimed,
        because a cluster without an entry has never "applied" a roll-up here.
        """
        entry = self._entries.pop(cluster, None)
        self._releases.pop(cluster, None)
        if entry is None:
            return False
        self._rows -= len(entry.needs)
        self.version += 1
        self.retain_masks()
        return True

    # -- reading --------------------------------------------------------------------
    def accepted(self, cluster_id: str) -> ValidatedRollup | None:
        """The cluster's last applied roll-up: what validating its next one may reuse."""
        found = self._clusters.find(cluster_id)
        entry = self._entries.get(found) if found is not None else None
        return entry.accepted if entry is not None else None

    def entry(self, cluster: int) -> ClusterNeeds | None:
        """The table's entry for cluster index ``cluster``."""
        return self._entries.get(cluster)

    def entries(self) -> list[ClusterNeeds]:
        """Every cluster that has sent a roll-up."""
        return list(self._entries.values())

    def releases(self) -> Mapping[int, frozenset[str]]:
        """Cluster index -> machine ids its applied roll-up offered for release (when given)."""
        return self._releases

    def applied(self, cluster: int) -> bool:
        """True once a roll-up of ``cluster`` has been applied (only then may it lose machines)."""
        entry = self._entries.get(cluster)
        return entry is not None and entry.applied_ns is not None

    def count(self) -> int:
        """Number of need rows in force (kept as a running total)."""
        return self._rows

    def retain_masks(self) -> None:
        """Drop cached masks no need uses any more, once they clearly outnumber the used ones.

        Pruning walks every need, so it runs only when the cache has grown
        past twice the number of need rows (plus slack), not per roll-up.
        """
        if len(self._masks) <= 64 or len(self._masks) <= 2 * self.count() + 64:
            return
        keys: set[MaskKey] = set()
        for entry in self._entries.values():
            if entry.compiled is not None:
                keys.update(entry.compiled.mask_keys)
            else:
                keys.update(mask_key(n.requirements, n.min_unit) for n in entry.needs)
        self._masks.retain(keys)

    # -- compilation ----------------------------------------------------------------
    def demand(self, entry: ClusterNeeds) -> Demand:
        """The entry compiled against the current catalog (cached until something changes)."""
        compiled = entry.compiled
        profiles = len(self._catalog)
        if compiled is not None and compiled.profiles == profiles:
            compiled.widen(len(self._catalog.dims))
            return compiled
        compiled = self._resize(entry)
        if compiled is None:
            compiled = self._compile(entry)
        entry.compiled = compiled
        entry.superseded = None
        return compiled

    def _resize(self, entry: ClusterNeeds) -> Demand | None:
        """The entry compiled by reusing its last form, when only the needs' sizes changed.

        The usual change to a roll-up is an aggregate that grew or shrank.
        Masks, the need-by-profile matrix and ``serving`` depend only on the
        needs' keys, order, requirements, ``min_unit``, gang domains and the
        catalog, so when all of those are as they were the old arrays are
        reused and only the size vectors are rebuilt. Returns None when
        anything else changed (then everything is compiled afresh).
        """
        old = entry.superseded
        catalog = self._catalog
        if (
            old is None
            or old.keys != entry.keys
            or old.profiles != len(catalog)
            or old.gang_domain != entry.gang_domain
        ):
            return None
        needs = entry.needs
        # Rows whose aggregate is as before keep their compiled row; the others
        # are filled afresh (a new resource name widens every row with zeros).
        # A row that is the very object it was needs no comparison at all.
        resized: list[int] = []
        differ: list[int] = []
        for i, (before, now) in enumerate(zip(old.needs, needs, strict=True)):
            if before is now:
                continue
            if before.requirements != now.requirements or before.min_unit != now.min_unit:
                return None
            differ.append(i)
            if before.aggregate != now.aggregate:
                resized.append(i)
        dims = catalog.dims
        column = dims.index_of
        amounts = {
            i: [(column(name), value) for name, value in needs[i].aggregate.items()]
            for i in resized
        }
        width = len(dims)
        aggregate = _widened(old.aggregate, width)
        for i, pairs in amounts.items():
            aggregate[i] = 0.0
            if pairs:
                at, values = zip(*pairs, strict=True)
                aggregate[i, list(at)] = values
        # Compiled arrays are never written in place, so unchanged ones are shared.
        unit = old.min_unit if old.min_unit.shape[1] == width else _widened(old.min_unit, width)
        app_rank = old.app_rank
        if any(old.needs[i].app_class != needs[i].app_class for i in differ):
            app_rank = np.array([APP_CLASS_VICTIM_RANK[n.app_class] for n in needs], dtype=np.int8)
        return Demand(
            cluster=old.cluster,
            needs=needs,
            keys=old.keys,
            priority=old.priority,
            arrival=old.arrival,
            aggregate=aggregate,
            min_unit=unit,
            interruption_penalty=old.interruption_penalty,
            reclamation_penalty=old.reclamation_penalty,
            app_rank=app_rank,
            mask_keys=old.mask_keys,
            matrix=old.matrix,
            serving=old.serving,
            gang_keys=old.gang_keys,
            pinned=old.pinned,
            topological=old.topological,
            profiles=old.profiles,
            dims=width,
            version=entry.version,
            gang_domain=old.gang_domain,
            slack_rows=None,
            slack_tolerance=old.slack_tolerance,
        )

    def _compile(self, entry: ClusterNeeds) -> Demand:
        catalog = self._catalog
        needs = entry.needs
        count = len(needs)
        dims = catalog.dims
        for need in needs:
            for name in need.aggregate:
                dims.index_of(name)
            for name in need.min_unit:
                dims.index_of(name)
        width = len(dims)
        profiles = len(catalog)
        aggregate = np.zeros((count, width))
        unit = np.zeros((count, width))
        matrix = np.zeros((count, profiles), dtype=np.bool_)
        keys: list[MaskKey] = []
        gangs: list[tuple[str, ...]] = []
        for i, need in enumerate(needs):
            for name, value in need.aggregate.items():
                aggregate[i, dims.index_of(name)] = value
            for name, value in need.min_unit.items():
                unit[i, dims.index_of(name)] = value
            key = mask_key(need.requirements, need.min_unit)
            keys.append(key)
            row = self._masks.mask(key)
            gang = same_keys(need)
            gangs.append(gang)
            chosen = entry.gang_domain.get(entry.keys[i])
            if gang and chosen is not None:
                row = row & (domain_codes(catalog, gang) == chosen)
            matrix[i] = row
        # The first (highest-priority) need each profile serves: rows written from
        # the last to the first, so the first row matching a profile writes last.
        serving = np.full(profiles, -1, dtype=np.int32)
        for i in range(count - 1, -1, -1):
            serving[matrix[i]] = i
        return Demand(
            cluster=entry.index,
            needs=needs,
            keys=entry.keys,
            priority=np.array([n.priority for n in needs], dtype=np.int64),
            arrival=np.array([entry.arrival[k] for k in entry.keys], dtype=np.int64),
            aggregate=aggregate,
            min_unit=unit,
            interruption_penalty=np.array([n.interruption_penalty for n in needs]),
            reclamation_penalty=np.array([n.reclamation_penalty for n in needs]),
            app_rank=np.array([APP_CLASS_VICTIM_RANK[n.app_class] for n in needs], dtype=np.int8),
            mask_keys=tuple(keys),
            matrix=matrix,
            serving=serving,
            gang_keys=tuple(gangs),
            pinned=tuple(bool(g) and is_pinned(n) for g, n in zip(gangs, needs, strict=True)),
            topological=np.array(
                [bool(g) or bool(n.spread) for g, n in zip(gangs, needs, strict=True)]
            ),
            profiles=profiles,
            dims=width,
            version=entry.version,
            gang_domain=dict(entry.gang_domain),
        )
