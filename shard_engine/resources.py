"""Resource vectors: the small exact algebra every capacity decision rests on.

A :class:`ResourceVec` maps resource names (``cpu``, ``memory``,
``ephemeral-storage``, ``nvidia.com/gpu`` and any other extended resource) to
non-negative amounts. Amounts are held as integer *milli-units* of the
canonical unit (millicores, milli-bytes, milli-GPUs), so the laws that tests
rely on hold exactly instead of approximately: ``(a + b) - a == b`` is an
identity on integers, never on floats. The hot path (``inventory``,
``phase1``) works on float64 numpy columns; this type is the reference it is
tested against and the form in which vectors cross the engine's edge.

``covers`` is the partial order "has at least as much of every resource";
subtraction saturates at zero because a negative amount of memory would
silently shrink a sum. The envelope from "Reclaiming the Gap" splits a limit
into a reservation and the reclaimable gap between them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from shard_engine.model import AppClass

__all__ = [
    "ACCELERATOR_HINTS",
    "APP_CLASS_VICTIM_RANK",
    "MILLI",
    "InvalidResource",
    "ResourceEnvelope",
    "ResourceVec",
    "is_accelerator",
]

MILLI = 1000
"""Milli-units per canonical unit: the exact resolution of :class:`ResourceVec`."""

ACCELERATOR_HINTS = ("gpu", "tpu", "neuron", "accelerator")
"""Substrings that mark a resource name as an accelerator (dominant when requested)."""


def is_accelerator(name: str) -> bool:
    """True when a resource name denotes an accelerator such as ``nvidia.com/gpu``.

    Accelerators are the scarcest dimension whenever a need asks for one, so
    machine-count and cost-per-unit decisions use them as the dominant unit.
    """
    lowered = name.lower()
    return any(hint in lowered for hint in ACCELERATOR_HINTS)


class InvalidResource(ValueError):
    """A resource amount that is not a finite, non-negative number."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def _to_milli(name: str, value: float, *, field: str) -> int:
    """Convert one canonical amount to integer milli-units, rounding up.

    Rounding up mirrors Kubernetes (a request of 0.1m CPU is 1m) and keeps a
    demand from shrinking through conversion. Non-finite or negative values
    are refused: they would poison every total they enter.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidResource(f"{field}[{name}]", f"not a number: {value!r}")
    if not math.isfinite(value):
        raise InvalidResource(f"{field}[{name}]", f"not finite: {value!r}")
    if value < 0:
        raise InvalidResource(f"{field}[{name}]", f"negative: {value!r}")
    if isinstance(value, int):
        return value * MILLI
    return math.ceil(round(value * MILLI, 6))


@dataclass(frozen=True, slots=True)
class ResourceVec:
    """An immutable, exact vector of resource amounts in milli-units.

    Zero entries are never stored, so two vectors that differ only by
    explicit zeros are equal and hash alike. Build one from canonical floats
    with :meth:`of` / :meth:`from_mapping`; read canonical floats back with
    :meth:`to_mapping`.
    """

    _items: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for name, amount in self._items:
            if not name:
                raise InvalidResource("resources", "empty resource name")
            if amount < 0:
                raise InvalidResource(f"resources[{name}]", "negative")

    # -- construction -----------------------------------------------------
    @staticmethod
    def _build(items: Iterable[tuple[str, int]]) -> ResourceVec:
        return ResourceVec(tuple(sorted((k, v) for k, v in items if v != 0)))

    @classmethod
    def of(cls, **amounts: float) -> ResourceVec:
        """Shorthand for tests and examples: ``ResourceVec.of(cpu=2, memory=4 * 2**30)``."""
        return cls.from_mapping(amounts)

    @classmethod
    def from_mapping(cls, amounts: Mapping[str, float], *, field: str = "resources") -> ResourceVec:
        """Build from canonical units (cores, bytes, counts), refusing NaN and negatives."""
        items: list[tuple[str, int]] = []
        for name, value in amounts.items():
            if not isinstance(name, str) or not name:
                raise InvalidResource(field, "empty resource name")
            items.append((name, _to_milli(name, value, field=field)))
        return cls._build(items)

    @classmethod
    def from_milli(cls, amounts: Mapping[str, int]) -> ResourceVec:
        """Build from integer milli-units (exact; used by the property tests)."""
        return cls._build(amounts.items())

    # -- reading ------------------------------------------------------------
    def milli(self, name: str) -> int:
        """The amount of ``name`` in milli-units (0 when absent)."""
        for key, amount in self._items:
            if key == name:
                return amount
        return 0

    def get(self, name: str) -> float:
        """The amount of ``name`` in canonical units (0.0 when absent)."""
        return self.milli(name) / MILLI

    def names(self) -> tuple[str, ...]:
        """Names with a non-zero amount, sorted."""
        return tuple(k for k, _ in self._items)

    def to_mapping(self) -> dict[str, float]:
        """Canonical-unit floats, for the façade's plain mappings."""
        return {k: v / MILLI for k, v in self._items}

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def is_zero(self) -> bool:
        """True when every amount is zero."""
        return not self._items

    # -- algebra -------------------------------------------------------------
    def covers(self, other: ResourceVec) -> bool:
        """Partial order: ``self`` holds at least as much of every resource as ``other``."""
        mine = dict(self._items)
        return all(mine.get(name, 0) >= amount for name, amount in other._items)

    def __add__(self, other: ResourceVec) -> ResourceVec:
        out = dict(self._items)
        for name, amount in other._items:
            out[name] = out.get(name, 0) + amount
        return ResourceVec._build(out.items())

    def saturating_sub(self, other: ResourceVec) -> ResourceVec:
        """``self - other`` per resource, floored at zero (never a negative amount)."""
        out = dict(self._items)
        for name, amount in other._items:
            out[name] = max(0, out.get(name, 0) - amount)
        return ResourceVec._build(out.items())

    def __sub__(self, other: ResourceVec) -> ResourceVec:
        return self.saturating_sub(other)

    def scale(self, factor: int) -> ResourceVec:
        """Multiply by a non-negative integer count (``n`` machines of one shape)."""
        if factor < 0:
            raise InvalidResource("factor", "negative")
        return ResourceVec._build((k, v * factor) for k, v in self._items)

    def dominant_share(self, capacity: ResourceVec) -> float:
        """Largest fraction of ``capacity`` this vector takes in any one resource.

        A resource the capacity lacks entirely makes the share infinite: the
        demand cannot be held at all. The zero vector has share 0.
        """
        share = 0.0
        cap = dict(capacity._items)
        for name, amount in self._items:
            available = cap.get(name, 0)
            if available == 0:
                return math.inf
            share = max(share, amount / available)
        return share

    def dominant_resource(self, capacity: ResourceVec) -> str | None:
        """Name of the resource that sets :meth:`dominant_share`, accelerators first."""
        accelerators = [k for k, _ in self._items if is_accelerator(k)]
        if accelerators:
            return accelerators[0]
        best: str | None = None
        best_share = -1.0
        cap = dict(capacity._items)
        for name, amount in self._items:
            available = cap.get(name, 0)
            share = math.inf if available == 0 else amount / available
            if share > best_share:
                best, best_share = name, share
        return best

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v / MILLI:g}" for k, v in self._items)
        return f"ResourceVec({inner})"


@dataclass(frozen=True, slots=True)
class ResourceEnvelope:
    """A limit split into a reservation and the reclaimable gap ("Reclaiming the Gap").

    The limit is the ceiling a workload may consume; the reservation is what
    we expect it to use. The difference is capacity that best-effort work may
    borrow. A valid envelope's limit covers its reservation, so
    ``reservation + reclaimable() == limit`` exactly.
    """

    limit: ResourceVec
    reservation: ResourceVec

    def __post_init__(self) -> None:
        if not self.limit.covers(self.reservation):
            raise InvalidResource("reservation", "exceeds the limit")

    def reclaimable(self) -> ResourceVec:
        """Capacity reserved in the limit but not expected to be used."""
        return self.limit.saturating_sub(self.reservation)

    @classmethod
    def guaranteed(cls, limit: ResourceVec) -> ResourceEnvelope:
        """Reservation equals the limit: nothing to reclaim."""
        return cls(limit=limit, reservation=limit)

    @classmethod
    def best_effort(cls, limit: ResourceVec) -> ResourceEnvelope:
        """Zero reservation: the workload lives entirely in the reclaimable gap."""
        return cls(limit=limit, reservation=ResourceVec())

    @classmethod
    def for_workload(cls, limit: ResourceVec, app_class: AppClass) -> ResourceEnvelope:
        """The envelope a workload of ``app_class`` gets: best-effort reserves nothing."""
        if app_class is AppClass.BEST_EFFORT:
            return cls.best_effort(limit)
        return cls.guaranteed(limit)


APP_CLASS_VICTIM_RANK: Mapping[AppClass, int] = {
    AppClass.BEST_EFFORT: 0,
    AppClass.BATCH: 1,
    AppClass.LATENCY_SENSITIVE: 2,
}
"""Order in which victims of equal priority are taken: best-effort first."""
