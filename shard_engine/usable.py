"""What a machine holds of a need: whole units, not allocatable.

A need with a ``min_unit`` (its largest pod in every resource) is served by
machines each of which holds a whole number of those units; what is left
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
    A machine holds ``floor(allocatable / unit)`` units in each resource
    the need has a unit in (with 1e-9 of slack for decimal quantities); the
    fewest of those is what it hosts, and each resource that reaches that
    fewest counts ``hosted × unit`` (at most the allocatable). A loop per
    need and profile, compiled (``kernels.usable``, ADR 0162).
    """
    import shard_engine.kernels as kernels  # numba loads with the first cycle, not with the CLI

    result: FloatArray = kernels.usable(
        np.ascontiguousarray(shapes, dtype=np.float64),
        np.ascontiguousarray(units, dtype=np.float64),
    )
    return result


def have_rows(weights: npt.ArrayLike, usable: FloatArray) -> FloatArray:
    """Per need: ``Σ_p weights[n, p] × usable[n, p]``, added in a fixed order.

    The same order of additions as :func:`shard_engine.linear.combine`, so a
    need without a unit gets bit-for-bit what ``combine`` gives.
    """
    import shard_engine.kernels as kernels

    result: FloatArray = kernels.have_rows(
        np.ascontiguousarray(weights, dtype=np.float64),
        np.ascontiguousarray(usable, dtype=np.float64),
    )
    return result
