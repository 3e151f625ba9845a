"""Machine identifiers <-> dense row numbers.

Every column of the inventory is indexed by a small integer *row*; providers
and callers speak machine IDs. This table is the only place the two meet.
Rows of removed machines are reused so the columns do not grow without bound
as machines come and go.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

__all__ = ["IdTable"]


class IdTable:
    """Bidirectional map between machine IDs and reusable row numbers."""

    def __init__(self) -> None:
        self._row_of: dict[str, int] = {}
        self._id_of: list[str] = []
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._row_of)

    @property
    def rows(self) -> int:
        """One past the highest row ever handed out (the column length needed)."""
        return len(self._id_of)

    def get(self, machine_id: str) -> int | None:
        """Row of ``machine_id`` or None when unknown."""
        return self._row_of.get(machine_id)

    def add(self, machine_id: str) -> int:
        """Give ``machine_id`` a row (reusing a freed one first)."""
        row = self._row_of.get(machine_id)
        if row is not None:
            return row
        if self._free:
            row = self._free.pop()
            self._id_of[row] = machine_id
        else:
            row = len(self._id_of)
            self._id_of.append(machine_id)
        self._row_of[machine_id] = row
        return row

    def discard(self, row: int) -> None:
        """Forget the machine on ``row``; the row may be handed out again."""
        machine_id = self._id_of[row]
        if self._row_of.get(machine_id) == row:
            del self._row_of[machine_id]
            self._id_of[row] = ""
            self._free.append(row)

    def id_of(self, row: int) -> str:
        """Machine ID on ``row``."""
        return self._id_of[row]

    def ids_of(self, rows: Iterable[int] | npt.NDArray[np.int32]) -> list[str]:
        """Machine IDs on ``rows``, in order."""
        table = self._id_of
        return [table[r] for r in np.asarray(rows).tolist()]

    def live_rows(self) -> list[int]:
        """Rows currently holding a machine, ascending."""
        return sorted(self._row_of.values())
