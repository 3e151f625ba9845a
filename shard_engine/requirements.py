"""Node-selector requirements compiled once into boolean masks over profiles.

A need's requirements (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``,
``Same``) and its ``min_unit`` decide which machine *shapes* may serve it.
They are evaluated against the profile catalog, never against machines: one
``isin`` over a label column per requirement, cached by the requirement set
and extended only for profiles added since. Masks are shared by every need
with the same requirement set and ``min_unit``.

``Same`` contributes "the label exists (and is one of ``values`` when given)"
to the mask; choosing the one shared value is the topology stage's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shard_engine.catalog import ProfileCatalog
from shard_engine.model import Operator, Requirement
from shard_engine.names import label_key_problem, selector_value_problem

__all__ = ["MaskKey", "RequirementMasks", "mask_key", "validate_requirements"]

BoolArray = npt.NDArray[np.bool_]

RELATIVE_TOLERANCE = 1e-9
"""Floats that differ by less than this fraction are equal (sums of many machines drift)."""


@dataclass(frozen=True, slots=True)
class MaskKey:
    """What a mask depends on: the requirement set and the indivisible unit."""

    requirements: tuple[tuple[str, int, tuple[str, ...]], ...]
    min_unit: tuple[tuple[str, float], ...]


def mask_key(requirements: tuple[Requirement, ...], min_unit: Mapping[str, float]) -> MaskKey:
    """Normalise requirements and ``min_unit`` so equal constraints share one mask."""
    reqs = tuple(sorted((r.key, int(r.operator), tuple(sorted(r.values))) for r in requirements))
    unit = tuple(sorted((k, float(v)) for k, v in min_unit.items() if v > 0))
    return MaskKey(reqs, unit)


def validate_requirements(requirements: tuple[Requirement, ...], *, field: str) -> None:
    """Refuse requirements Kubernetes would refuse, naming the offending one.

    ``In``/``NotIn`` need values; ``Exists``/``DoesNotExist`` take none. An
    unknown operator is refused rather than guessed at.
    """
    for i, req in enumerate(requirements):
        where = f"{field}[{i}]"
        if not isinstance(req.key, str) or not req.key:
            raise ValueError(f"{where}.key: empty label key")
        problem = label_key_problem(req.key)
        if problem is not None:
            raise ValueError(f"{where}.key: {problem}")
        try:
            op = Operator(req.operator)
        except ValueError:
            raise ValueError(f"{where}.operator: unknown operator {req.operator!r}") from None
        if op in (Operator.IN, Operator.NOT_IN) and not req.values:
            raise ValueError(f"{where}.values: {op.name} needs at least one value")
        if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and req.values:
            raise ValueError(f"{where}.values: {op.name} takes no values")
        for j, value in enumerate(req.values):
            if not isinstance(value, str):
                raise ValueError(f"{where}.values[{j}]: not a string")
            problem = selector_value_problem(value)
            if problem is not None:
                raise ValueError(f"{where}.values[{j}]: {problem}")


class RequirementMasks:
    """Cache of profile masks keyed by :class:`MaskKey`, kept in step with the catalog."""

    def __init__(self, catalog: ProfileCatalog) -> None:
        self._catalog = catalog
        self._masks: dict[MaskKey, BoolArray] = {}

    def __len__(self) -> int:
        return len(self._masks)

    def mask(self, key: MaskKey) -> BoolArray:
        """Boolean mask over every current profile: may this shape serve the need?"""
        total = len(self._catalog)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._evaluate(key, 0, total)
            self._masks[key] = mask
        elif len(mask) < total:
            mask = np.concatenate([mask, self._evaluate(key, len(mask), total)])
            self._masks[key] = mask
        return mask

    def retain(self, keys: set[MaskKey]) -> None:
        """Forget masks no current need uses (bounds the cache by the needs table)."""
        for key in [k for k in self._masks if k not in keys]:
            del self._masks[key]

    def _evaluate(self, key: MaskKey, start: int, stop: int) -> BoolArray:
        catalog = self._catalog
        out = np.ones(stop - start, dtype=np.bool_)
        for label, op_value, values in key.requirements:
            op = Operator(op_value)
            codes = catalog.label_column(label).codes[start:stop]
            column = catalog.label_column(label)
            wanted = np.array(
                [column.code_of[v] for v in values if v in column.code_of], dtype=np.int32
            )
            if op is Operator.IN:
                out &= np.isin(codes, wanted)
            elif op is Operator.NOT_IN:
                out &= ~np.isin(codes, wanted)
            elif op is Operator.EXISTS:
                out &= codes >= 0
            elif op is Operator.DOES_NOT_EXIST:
                out &= codes < 0
            elif op is Operator.SAME:
                out &= codes >= 0
                if values:
                    out &= np.isin(codes, wanted)
        if key.min_unit:
            for name, _ in key.min_unit:
                catalog.dims.index_of(name)
            alloc = catalog.alloc[start:stop]
            for name, amount in key.min_unit:
                column_index = catalog.dims.index_of(name)
                out &= alloc[:, column_index] >= amount * (1.0 - RELATIVE_TOLERANCE)
        return out
