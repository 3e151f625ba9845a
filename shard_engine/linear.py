"""Weighted sums of machine shapes that come out the same on every machine.

Most of the engine's arithmetic is "so many machines of each profile times
each profile's allocatable": a vector (or a matrix of needs) times the
(profiles × resources) shape matrix. Written as ``@`` that is a BLAS call,
and BLAS picks its kernel by CPU: the bundled OpenBLAS sums in a different
order on an AVX-512 machine than on an AVX2 one, so the last bit of a
"have" differs. Where two choices tie in exact arithmetic the engine
breaks the tie on that bit, and the same inputs then decide differently on
two machines (a recorded plan history did; so would a simulation rerun
elsewhere, or two shards' decisions compared by the coordinator).

:func:`combine` multiplies element by element (one rounding each) and
adds the products left to right in profile order: a running sum
(``np.add.accumulate``), whose every prefix is defined as the previous
prefix plus the next term, so no reduction tree or vector width can
regroup it. It costs two temporaries of (rows × profiles × resources)
floats; every caller passes a cluster's or a need's profiles, or the
catalog once per placement, so that stays small.
``tests/unit/engine/test_linear.py`` checks it against a plain Python
left-to-right sum.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["combine"]

FloatArray = npt.NDArray[np.float64]


def combine(weights: npt.ArrayLike, shapes: FloatArray) -> FloatArray:
    """``weights @ shapes`` with a fixed order of additions (see module docstring).

    ``weights`` is (profiles,) or (rows, profiles); ``shapes`` is
    (profiles, resources). Returns (resources,) or (rows, resources).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 1:
        if w.shape[0] == 0:
            return np.zeros(shapes.shape[1])
        summed: FloatArray = np.add.accumulate(w[:, None] * shapes, axis=0)[-1]
        return summed
    if w.shape[1] == 0:
        return np.zeros((w.shape[0], shapes.shape[1]))
    rows: FloatArray = np.add.accumulate(w[:, :, None] * shapes[None, :, :], axis=1)[:, -1, :]
    return rows
