"""Pods as the cluster side sees them: a resource envelope, an app class, and constraints.

A pod carries a **limit** (the ceiling it may use) and a **reservation**
(what it is expected to use) — seed 001's envelope — and an app class that
decides which of the two the cluster must hold for it:

| app class | reservation (default) | placement size (what a node must hold) |
|---|---|---|
| latency-sensitive | = limit | the limit: it never depends on reclaimed capacity |
| batch | = limit | the reservation: it may slot into the gap |
| best-effort | 0 | nothing: it lives in the reclaimable gap (its limit must fit there) |

With gap reclamation switched off a best-effort pod is placed like batch
work at its limit — what a cluster without Orbit's envelope does.

Resources are vectors over :data:`DIMENSIONS` in the engine's canonical
units (cores, bytes, devices).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shard_engine.model import AppClass, Requirement, TopologySpread
from shard_engine.resources import ResourceEnvelope, ResourceVec

__all__ = ["DIMENSIONS", "PodSpec", "Vector"]

DIMENSIONS: tuple[str, ...] = ("cpu", "memory", "nvidia.com/gpu")
"""The resource dimensions the cluster model packs, in vector order."""

Vector = tuple[float, float, float]


def _vector(raw: Mapping[str, float], field: str) -> Vector:
    unknown = sorted(set(raw) - set(DIMENSIONS))
    if unknown:
        raise ValueError(
            f"{field}: unknown resource {unknown[0]!r}; known: {', '.join(DIMENSIONS)}"
        )
    values = []
    for name in DIMENSIONS:
        value = raw.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{field}[{name}]: not a number: {value!r}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{field}[{name}]: must be finite and >= 0, got {value!r}")
        values.append(float(value))
    return (values[0], values[1], values[2])


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod's demand and constraints (immutable; identity is ``name`` within a cluster).

    ``colocation`` names a co-location group: pods of one group must share
    one value of ``colocation_key`` (a gang in one rack). Penalties are
    dollars, bucketed on the wire.
    """

    name: str
    limit: Vector
    reservation: Vector
    app_class: AppClass = AppClass.BATCH
    priority: int = 0
    requirements: tuple[Requirement, ...] = ()
    spread: tuple[TopologySpread, ...] = ()
    interruption_penalty: float = 0.0
    reclamation_penalty: float = 0.0
    colocation: str = ""
    colocation_key: str = ""

    @classmethod
    def build(
        cls,
        name: str,
        limit: Mapping[str, float],
        *,
        reservation: Mapping[str, float] | None = None,
        app_class: AppClass = AppClass.BATCH,
        priority: int = 0,
        requirements: tuple[Requirement, ...] = (),
        spread: tuple[TopologySpread, ...] = (),
        interruption_penalty: float = 0.0,
        reclamation_penalty: float = 0.0,
        colocation: str = "",
        colocation_key: str = "",
    ) -> PodSpec:
        """Validate and build a pod; the reservation defaults by app class.

        Raises ``ValueError`` naming the field: an unknown resource, a
        negative or non-finite amount, a reservation above the limit, a
        best-effort pod with a reservation, a negative penalty, or a
        co-location group without a key.
        """
        if not name:
            raise ValueError("name: must not be empty")
        lim = _vector(limit, "limit")
        if not any(lim):
            raise ValueError("limit: must request at least one resource")
        if app_class is AppClass.BEST_EFFORT:
            if reservation and any(v > 0 for v in reservation.values()):
                raise ValueError("reservation: a best-effort pod reserves nothing")
            res: Vector = (0.0, 0.0, 0.0)
        elif reservation is None:
            res = lim
        else:
            res = _vector(reservation, "reservation")
        envelope = ResourceEnvelope(
            limit=ResourceVec.from_mapping(dict(zip(DIMENSIONS, lim, strict=True))),
            reservation=ResourceVec.from_mapping(dict(zip(DIMENSIONS, res, strict=True))),
        )
        del envelope  # constructing it checks reservation <= limit (InvalidResource)
        for field, penalty in (
            ("interruption_penalty", interruption_penalty),
            ("reclamation_penalty", reclamation_penalty),
        ):
            if not math.isfinite(penalty) or penalty < 0:
                raise ValueError(f"{field}: must be finite and >= 0, got {penalty!r}")
        if colocation and not colocation_key:
            raise ValueError("colocation_key: a co-location group needs a topology key")
        return cls(
            name=name,
            limit=lim,
            reservation=res,
            app_class=app_class,
            priority=priority,
            requirements=requirements,
            spread=spread,
            interruption_penalty=float(interruption_penalty),
            reclamation_penalty=float(reclamation_penalty),
            colocation=colocation,
            colocation_key=colocation_key,
        )

    def placement(self, *, gap: bool = True) -> Vector:
        """What a node must hold for this pod (see the module table)."""
        if self.app_class is AppClass.LATENCY_SENSITIVE:
            return self.limit
        if self.app_class is AppClass.BEST_EFFORT:
            return (0.0, 0.0, 0.0) if gap else self.limit
        return self.reservation

    @property
    def in_gap(self) -> bool:
        """True for best-effort work (it lives in the reclaimable gap when reclamation is on)."""
        return self.app_class is AppClass.BEST_EFFORT
