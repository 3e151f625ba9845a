"""What a machine holds of a need: whole units, not allocatable.

A need with a ``min_unit`` (its largest pod in every resource) is served by
machines each of which holds ``units_hosted`` of those units; what is left
over on a machine is stranded for that need. Counting a machine's whole
allocatable as "have" made a need look covered while its pods could not be
placed: 4-core, 16 GiB pods on machines of 7.9, 15.9 and 31.8 allocatable
cores hold 1, 3 and 7 of them, so sixteen such machines counted 254 cores
against 208 asked while they held 192 — production pods waited until other
pods finished (issue 18). Buying already counts units
(:func:`shard_engine.selection.cover_by_units`); this module makes "have"
count them the same way, so Phase 1 never calls a need covered by capacity
it cannot use, and Phase 3 never sees it as excess.

In every resource that binds (where the machine runs out of room for
another unit first), one machine is worth ``hosted × unit``; every other
resource counts at its allocatable, and so does every resource of a need
without a unit, as before. Only the binding resources are discounted
because only they say something true of every mix of pods: ``min_unit`` is
the largest pod in each resource *separately*, so a need of 4 one-core
pods and 8 GiB whose largest pod asks 1 GiB is made of smaller pods than
(1 core, 1 GiB) × 8 suggests. Counting ``hosted × unit`` in memory there
(1 GiB a machine) made it want eight machines for four cores, and a
high-priority need of that shape preempted a whole pool it did not need.
For a need whose pods are all the same size, every resource the pods fill
at the same count binds, and the count is exact.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["have_rows", "usable_shapes"]

FloatArray = npt.NDArray[np.float64]


def usable_shapes(shapes: FloatArray, units: FloatArray) -> FloatArray:
    """Per need (rows of ``units``) and shape (rows of ``shapes``): what one machine holds of it.

    ``shapes`` is (profiles, resources), ``units`` (needs, resources) with
    zeros where a need has no unit; returns (needs, profiles, resources).
    """
    shapes = np.asarray(shapes, dtype=np.float64)
    units = np.asarray(units, dtype=np.float64)
    needs, width = units.shape[0], min(units.shape[1], shapes.shape[1])
    out = np.broadcast_to(shapes, (needs, *shapes.shape)).copy()
    if needs == 0 or shapes.shape[0] == 0:
        return out
    unit = units[:, :width]
    asked = unit > 0
    if not asked.any():
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(
            asked[:, None, :],
            np.floor(shapes[None, :, :width] / np.where(asked, unit, 1.0)[:, None, :] + 1e-9),
            np.inf,
        )
    has_unit: npt.NDArray[np.bool_] = np.asarray(asked.any(axis=1))
    # (needs, profiles): units one machine holds; 0 for a need without a unit
    fewest = ratio.min(axis=2)
    hosted = np.where(has_unit[:, None], np.maximum(fewest, 0.0), 0.0)
    worth = hosted[:, :, None] * unit[:, None, :]
    # (needs, profiles, resources): the resources that run out first
    binding = has_unit[:, None, None] & asked[:, None, :] & (ratio <= fewest[:, :, None])
    out[:, :, :width] = np.where(
        binding, np.minimum(worth, shapes[None, :, :width]), out[:, :, :width]
    )
    return out


def have_rows(weights: npt.ArrayLike, usable: FloatArray) -> FloatArray:
    """Per need: ``Σ_p weights[n, p] × usable[n, p]``, added in a fixed order.

    The same order of additions as :func:`shard_engine.linear.combine`, so a
    need without a unit gets bit-for-bit what ``combine`` gives.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[1] == 0:
        return np.zeros((w.shape[0], usable.shape[2]))
    rows: FloatArray = np.add.accumulate(w[:, :, None] * usable, axis=1)[:, -1, :]
    return rows
