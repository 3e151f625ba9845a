"""The profile catalog: every distinct machine shape the shard has seen, interned.

Half a million machines come in a few thousand shapes (instance type × zone ×
capacity type × labels × price). Storing the shape once and giving each
machine a small integer ``profile`` is what keeps the inventory near thirty
bytes a machine and lets every phase reason about *groups* of identical
machines instead of individual ones: requirement masks, costs, domains and
allocatable vectors are all per profile.

Columns are numpy arrays indexed by profile id; they only grow. A profile
whose machines have all gone stays in the catalog (ids are never reused), so
masks and tables computed against it stay valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shard_engine.model import CapacityType, MachineRecord

__all__ = [
    "LABEL_CAPACITY_TYPE",
    "LABEL_INSTANCE_TYPE",
    "LABEL_PROVIDER",
    "LABEL_ZONE",
    "Dimensions",
    "LabelColumn",
    "Profile",
    "ProfileCatalog",
    "capacity_type_label",
]

LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_RACK = "topology.kubernetes.io/rack"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_CAPACITY_TYPE = "bigfleet.io/capacity-type"
LABEL_PROVIDER = "bigfleet.io/provider"

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int32]


def capacity_type_label(capacity_type: CapacityType) -> str:
    """The label value requirements match a capacity type with (``on-demand``, ``spot`` ...)."""
    return capacity_type.name.lower().replace("_", "-")


class Dimensions:
    """Resource names in column order; a name gets a column the first time it is seen.

    Every vector in the engine (allocatable, aggregate, min_unit, deficit)
    uses these columns, so adding ``nvidia.com/gpu`` later only widens arrays.
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._names)

    @property
    def names(self) -> tuple[str, ...]:
        """Column names in order."""
        return tuple(self._names)

    def index_of(self, name: str) -> int:
        """Column of ``name``, creating it when new."""
        found = self._index.get(name)
        if found is None:
            found = len(self._names)
            self._names.append(name)
            self._index[name] = found
        return found

    def find(self, name: str) -> int | None:
        """Column of ``name`` or None when no vector has mentioned it."""
        return self._index.get(name)

    def vector(self, amounts: Mapping[str, float]) -> FloatArray:
        """A dense float vector over the current columns (adds columns for new names)."""
        for name in amounts:
            self.index_of(name)
        out = np.zeros(len(self._names), dtype=np.float64)
        for name, value in amounts.items():
            out[self._index[name]] = value
        return out

    def mapping(self, vector: FloatArray, *, tolerance: float = 0.0) -> dict[str, float]:
        """The non-zero entries of a dense vector as a name -> amount mapping."""
        return {
            self._names[i]: float(vector[i])
            for i in range(min(len(vector), len(self._names)))
            if vector[i] > tolerance
        }


@dataclass(frozen=True, slots=True)
class Profile:
    """One machine shape: everything about a machine that is not its identity or state."""

    provider: str
    instance_type: str
    zone: str
    capacity_type: CapacityType
    price_per_hour: float
    interruption_probability: float
    labels: tuple[tuple[str, str], ...]
    allocatable: tuple[tuple[str, float], ...]


class LabelColumn:
    """One label key encoded per profile: value code, or -1 where the label is absent.

    Requirement masks and topology domains are numpy comparisons on these
    codes, so compiling ``zone In (a, b)`` costs one ``isin`` over profiles.
    """

    def __init__(self) -> None:
        self.codes: IntArray = np.empty(0, dtype=np.int32)
        self.values: list[str] = []
        self.code_of: dict[str, int] = {}

    def code(self, value: str) -> int:
        """Code of ``value``, creating one when new."""
        found = self.code_of.get(value)
        if found is None:
            found = len(self.values)
            self.values.append(value)
            self.code_of[value] = found
        return found


class ProfileCatalog:
    """Interned machine profiles with per-profile numpy columns."""

    def __init__(self) -> None:
        self.dims = Dimensions()
        self._profiles: list[Profile] = []
        self._labels: list[dict[str, str]] = []
        self._by_key: dict[Profile, int] = {}
        self._capacity = 0
        self._alloc: FloatArray = np.zeros((0, 0), dtype=np.float64)
        self._price: FloatArray = np.zeros(0, dtype=np.float64)
        self._prob: FloatArray = np.zeros(0, dtype=np.float64)
        self._ctype: npt.NDArray[np.int8] = np.zeros(0, dtype=np.int8)
        self._label_columns: dict[str, LabelColumn] = {}
        self._domains: dict[tuple[str, ...], npt.NDArray[np.int64]] = {}

    # -- size and columns ---------------------------------------------------
    def __len__(self) -> int:
        return len(self._profiles)

    @property
    def alloc(self) -> FloatArray:
        """Allocatable per profile, shape ``(profiles, dimensions)``."""
        if len(self.dims) > self._alloc.shape[1]:
            self._grow(len(self._profiles))
        return self._alloc[: len(self._profiles), : len(self.dims)]

    @property
    def price(self) -> FloatArray:
        """Price per hour per profile."""
        return self._price[: len(self._profiles)]

    @property
    def interruption_probability(self) -> FloatArray:
        """Hourly interruption probability per profile."""
        return self._prob[: len(self._profiles)]

    @property
    def capacity_type(self) -> npt.NDArray[np.int8]:
        """``CapacityType`` value per profile."""
        return self._ctype[: len(self._profiles)]

    def profile(self, index: int) -> Profile:
        """The interned profile ``index``."""
        return self._profiles[index]

    def labels(self, index: int) -> Mapping[str, str]:
        """Effective labels of profile ``index``, well-known ones included."""
        return self._labels[index]

    # -- interning ------------------------------------------------------------
    @staticmethod
    def key_of(record: MachineRecord) -> Profile:
        """The profile a machine record belongs to (its shape, not its identity)."""
        return Profile(
            provider=record.provider,
            instance_type=record.instance_type,
            zone=record.zone,
            capacity_type=CapacityType(record.capacity_type),
            price_per_hour=float(record.price_per_hour),
            interruption_probability=float(record.interruption_probability),
            labels=tuple(sorted(record.labels.items())),
            allocatable=tuple(sorted((k, float(v)) for k, v in record.allocatable.items())),
        )

    def intern(self, key: Profile) -> int:
        """Profile id of ``key``, adding it (and its columns) when new."""
        found = self._by_key.get(key)
        if found is not None:
            return found
        index = len(self._profiles)
        for name, _ in key.allocatable:
            self.dims.index_of(name)
        self._grow(index + 1)
        self._profiles.append(key)
        self._by_key[key] = index
        labels = dict(key.labels)
        labels.setdefault(LABEL_ZONE, key.zone)
        labels.setdefault(LABEL_INSTANCE_TYPE, key.instance_type)
        labels.setdefault(LABEL_CAPACITY_TYPE, capacity_type_label(key.capacity_type))
        labels.setdefault(LABEL_PROVIDER, key.provider)
        self._labels.append(labels)
        for name, value in key.allocatable:
            self._alloc[index, self.dims.index_of(name)] = value
        self._price[index] = key.price_per_hour
        self._prob[index] = key.interruption_probability
        self._ctype[index] = int(key.capacity_type)
        return index

    def _grow(self, rows: int) -> None:
        """Make room for ``rows`` profiles and every known dimension (amortised doubling)."""
        width = len(self.dims)
        more_rows = rows > self._capacity
        more_cols = width > self._alloc.shape[1]
        if not (more_rows or more_cols):
            return
        capacity = max(rows, self._capacity * 2, 64) if more_rows else self._capacity
        cols = max(width, self._alloc.shape[1] * 2, 8) if more_cols else self._alloc.shape[1]
        alloc = np.zeros((capacity, cols), dtype=np.float64)
        old = self._alloc
        alloc[: old.shape[0], : old.shape[1]] = old
        self._alloc = alloc
        if more_rows:
            self._price = np.resize(self._price, capacity)
            self._prob = np.resize(self._prob, capacity)
            self._ctype = np.resize(self._ctype, capacity)
            self._capacity = capacity

    def ensure_dimensions(self) -> None:
        """Widen the allocatable matrix after needs introduced new resource names."""
        self._grow(len(self._profiles))

    # -- labels -----------------------------------------------------------------
    def label_column(self, key: str) -> LabelColumn:
        """The encoded column of label ``key``, brought up to date with new profiles."""
        column = self._label_columns.get(key)
        if column is None:
            column = LabelColumn()
            self._label_columns[key] = column
        done = len(column.codes)
        total = len(self._profiles)
        if done < total:
            fresh = np.empty(total - done, dtype=np.int32)
            for offset, labels in enumerate(self._labels[done:total]):
                value = labels.get(key)
                fresh[offset] = -1 if value is None else column.code(value)
            column.codes = np.concatenate([column.codes, fresh])
        return column

    def domain_codes(self, keys: tuple[str, ...]) -> npt.NDArray[np.int64]:
        """One domain code per profile for the combination of label ``keys``; -1 where absent.

        Several keys (rack and zone, say) combine into one code in mixed
        radix, so "the same rack and the same zone" is one domain. Cached
        until the catalog grows.
        """
        total = len(self._profiles)
        cached = self._domains.get(keys)
        if cached is not None and len(cached) == total:
            return cached
        out = np.zeros(total, dtype=np.int64)
        absent = np.zeros(total, dtype=np.bool_)
        for key in keys:
            column = self.label_column(key)
            codes = column.codes[:total].astype(np.int64)
            absent |= codes < 0
            out = out * (len(column.values) + 1) + codes + 1
        out[absent] = -1
        self._domains[keys] = out
        return out
