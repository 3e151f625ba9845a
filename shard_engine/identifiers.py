"""Machine identifiers and host references, stored compactly, and ID <-> row lookup.

Half a million Python strings and a dict over them would cost more than the
whole rest of the inventory. Provider identifiers are nearly always a
shared prefix and a number — ``sim-use1-m5.large-od-000123``,
``i-0a1b2c3d4e5f60718``, ``SN-3F2A9C11B7E0`` — so a string is split into a
*format* (prefix, digit count, decimal/lower-hex/upper-hex), interned once,
and the number, kept in integer columns: about ten bytes a string.

Anything decodes back to exactly the text that went in; a string with no
numeric tail is simply a format of its own (correct, just not compact).
:class:`IdTable` adds an open-addressing hash table over the encoded
columns for lookup by ID.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["CompactStrings", "IdTable", "StringsSnapshot"]

_LOWER = frozenset("0123456789abcdef")
_UPPER = frozenset("0123456789ABCDEF")
_MAX_DEC = 19  # 10**19 - 1 < 2**64
_MAX_HEX = 18  # 72 bits: 64 in ``lo`` and 8 in ``hi``
_M64 = (1 << 64) - 1
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xC2B2AE3D27D4EB4F
_K3 = 0x165667B19E3779F9
_K4 = 0x94D049BB133111EB

Format = tuple[str, int, str]
"""(prefix, digits, kind) where kind is "" (no number), "d", "x" or "X"."""


_DEC_TAIL = re.compile(r"[0-9]*\Z")
_LOWER_TAIL = re.compile(r"[0-9a-f]*\Z")
_UPPER_TAIL = re.compile(r"[0-9A-F]*\Z")


def split(text: str) -> tuple[Format, int]:
    """Split ``text`` into a format and the number its tail encodes.

    The longest numeric tail wins (decimal on a tie), so the prefix that
    remains is the part machines share. Tails longer than the integer
    columns hold keep their leading digits in the prefix.
    """
    end = len(text)
    start = _DEC_TAIL.search(text).start()  # type: ignore[union-attr]
    kind, width = "d", end - start
    if start > 0:
        before = text[start - 1]
        if before in _LOWER:
            kind, width = "x", end - _LOWER_TAIL.search(text).start()  # type: ignore[union-attr]
        elif before in _UPPER:
            kind, width = "X", end - _UPPER_TAIL.search(text).start()  # type: ignore[union-attr]
    if width == 0:
        return (text, 0, ""), 0
    width = min(width, _MAX_DEC if kind == "d" else _MAX_HEX)
    digits = text[len(text) - width :]
    return (text[: len(text) - width], width, kind), int(digits, 10 if kind == "d" else 16)


def _mix(fmt: int, number: int) -> int:
    """64-bit hash of an encoded string (same function as :func:`_mix_array`)."""
    lo = number & _M64
    hi = number >> 64
    h = ((fmt * _K1) ^ (lo * _K2) ^ (hi * _K3)) & _M64
    h ^= h >> 31
    h = (h * _K4) & _M64
    h ^= h >> 29
    return h


def _mix_array(
    fmt: npt.NDArray[np.uint64], lo: npt.NDArray[np.uint64], hi: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        h = (fmt * np.uint64(_K1)) ^ (lo * np.uint64(_K2)) ^ (hi * np.uint64(_K3))
        h ^= h >> np.uint64(31)
        h = h * np.uint64(_K4)
        h ^= h >> np.uint64(29)
    result: npt.NDArray[np.uint64] = h
    return result


class CompactStrings:
    """A column of strings, one per row, stored as format code + number.

    The number column starts as ``uint32`` and widens to ``uint64`` (and
    grows an extra high byte for 72-bit hex tails) only when a value needs
    it, so short serial numbers cost four bytes. Row content ``""`` is format
    code 0.
    """

    def __init__(self) -> None:
        self._formats: list[Format] = [("", 0, "")]
        self._format_code: dict[Format, int] = {("", 0, ""): 0}
        self.fmt: npt.NDArray[np.integer[Any]] = np.zeros(0, dtype=np.uint16)
        self.lo: npt.NDArray[np.integer[Any]] = np.zeros(0, dtype=np.uint32)
        self.hi: npt.NDArray[np.uint8] | None = None
        self._lo_max = int(np.iinfo(np.uint32).max)

    def __len__(self) -> int:
        return len(self.fmt)

    def ensure_rows(self, rows: int) -> None:
        """Make the columns at least ``rows`` long (new rows hold "")."""
        if rows <= len(self.fmt):
            return
        capacity = max(rows, 2 * len(self.fmt), 1024)
        self.fmt = _grown(self.fmt, capacity)
        self.lo = _grown(self.lo, capacity)
        if self.hi is not None:
            self.hi = _grown(self.hi, capacity)

    def encode(self, text: str, *, create: bool = True) -> tuple[int, int] | None:
        """(format code, number) of ``text``; None when the format is unknown and not created."""
        fmt, number = split(text)
        code = self._format_code.get(fmt)
        if code is None:
            if not create:
                return None
            code = len(self._formats)
            self._formats.append(fmt)
            self._format_code[fmt] = code
            if code >= np.iinfo(self.fmt.dtype).max:
                self.fmt = self.fmt.astype(np.int32)
        return code, number

    def store(self, row: int, code: int, number: int) -> None:
        """Put an encoded string on ``row``."""
        self.fmt[row] = code
        low = number & _M64
        if low > self._lo_max:
            self.lo = self.lo.astype(np.uint64)
            self._lo_max = _M64
        self.lo[row] = low
        high = number >> 64
        if high and self.hi is None:
            self.hi = np.zeros(len(self.fmt), dtype=np.uint8)
        if self.hi is not None:
            self.hi[row] = high

    def set(self, row: int, text: str) -> None:
        """Store ``text`` on ``row``."""
        encoded = self.encode(text)
        assert encoded is not None
        self.store(row, *encoded)

    def number(self, row: int) -> int:
        """The integer part stored on ``row``."""
        value = int(self.lo[row])
        if self.hi is not None:
            value |= int(self.hi[row]) << 64
        return value

    def get(self, row: int) -> str:
        """The string on ``row``."""
        prefix, width, kind = self._formats[int(self.fmt[row])]
        if not kind:
            return prefix
        return prefix + format(self.number(row), f"0{width}{kind}")

    def matches(self, row: int, code: int, number: int) -> bool:
        """True when ``row`` holds exactly the encoded string."""
        return int(self.fmt[row]) == code and self.number(row) == number

    def snapshot(self, rows: npt.NDArray[np.int64]) -> StringsSnapshot:
        """The strings on ``rows`` as they are now, decodable later (copies two small columns).

        Formats are only ever appended, so the snapshot keeps decoding to
        the same text however the rows change afterwards.
        """
        return StringsSnapshot(
            self._formats,
            self.fmt[rows].astype(np.int64),
            self.lo[rows].astype(np.uint64),
            None if self.hi is None else self.hi[rows].astype(np.uint64),
        )

    def hashes(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """:func:`_mix` of the strings on ``rows``, vectorised."""
        fmt = self.fmt[rows].astype(np.uint64)
        lo = self.lo[rows].astype(np.uint64)
        hi = (
            self.hi[rows].astype(np.uint64)
            if self.hi is not None
            else np.zeros(len(rows), dtype=np.uint64)
        )
        return _mix_array(fmt, lo, hi)


class StringsSnapshot:
    """Encoded strings copied out of a :class:`CompactStrings`, decoded on demand.

    A plan names its machines this way: taking the snapshot costs two
    fancy-indexing copies in the cycle, and only a consumer that wants the
    text pays for building it.
    """

    __slots__ = ("_formats", "_hi", "_lo", "code")

    def __init__(
        self,
        formats: list[Format],
        code: npt.NDArray[np.int64],
        lo: npt.NDArray[np.uint64],
        hi: npt.NDArray[np.uint64] | None,
    ) -> None:
        self._formats = formats
        self.code = code
        self._lo = lo
        self._hi = hi

    def __len__(self) -> int:
        return len(self.code)

    def number(self, index: int) -> int:
        """The integer part of string ``index``."""
        value = int(self._lo[index])
        if self._hi is not None:
            value |= int(self._hi[index]) << 64
        return value

    def get(self, index: int) -> str:
        """String ``index``."""
        prefix, width, kind = self._formats[int(self.code[index])]
        if not kind:
            return prefix
        return prefix + format(self.number(index), f"0{width}{kind}")

    def decode(self, start: int = 0, stop: int | None = None) -> list[str]:
        """Strings ``start`` to ``stop``, in order (one format lookup per distinct format)."""
        stop = len(self.code) if stop is None else stop
        codes = self.code[start:stop].tolist()
        numbers = self._lo[start:stop].tolist()
        if self._hi is not None:
            numbers = [
                n | (h << 64) for n, h in zip(numbers, self._hi[start:stop].tolist(), strict=True)
            ]
        specs: dict[int, tuple[str, str]] = {}
        out: list[str] = []
        for code, number in zip(codes, numbers, strict=True):
            spec = specs.get(code)
            if spec is None:
                prefix, width, kind = self._formats[code]
                spec = specs[code] = (prefix, f"0{width}{kind}" if kind else "")
            out.append(spec[0] + format(number, spec[1]) if spec[1] else spec[0])
        return out


_A = TypeVar("_A", bound=np.generic)


def _grown(array: npt.NDArray[_A], capacity: int) -> npt.NDArray[_A]:
    out: npt.NDArray[_A] = np.zeros(capacity, dtype=array.dtype)
    out[: len(array)] = array
    return out


class IdTable:
    """Machine IDs <-> reusable row numbers, over :class:`CompactStrings`.

    A row is live while its format code is non-zero (machine IDs are never
    empty). Rows of removed machines are reused so the columns do not grow
    without bound. The hash table (``int32`` rows, -1 empty, -2 removed)
    keeps its load between 3/8 and 3/4 and is rebuilt, vectorised and in
    chunks, when it passes 3/4.
    """

    _CHUNK = 1 << 16

    def __init__(self) -> None:
        self.strings = CompactStrings()
        self._rows = 0
        self._count = 0
        self._free: list[int] = []
        self._table: npt.NDArray[np.int32] = np.full(8, -1, dtype=np.int32)
        self._used = 0  # live entries plus tombstones

    def __len__(self) -> int:
        return self._count

    @property
    def rows(self) -> int:
        """One past the highest row ever handed out (the column length needed)."""
        return self._rows

    # -- lookup -------------------------------------------------------------------
    def _find(self, code: int, number: int) -> tuple[int, int]:
        """(row or -1, slot where it is or could be inserted)."""
        table = self._table
        size = len(table)
        slot = _mix(code, number) % size
        insert = -1
        while True:
            row = int(table[slot])
            if row == -1:
                return -1, insert if insert >= 0 else slot
            if row == -2:
                if insert < 0:
                    insert = slot
            elif self.strings.matches(row, code, number):
                return row, slot
            slot += 1
            if slot == size:
                slot = 0

    def get(self, machine_id: str) -> int | None:
        """Row of ``machine_id`` or None when unknown."""
        encoded = self.strings.encode(machine_id, create=False)
        if encoded is None:
            return None
        row, _ = self._find(*encoded)
        return None if row < 0 else row

    def add(self, machine_id: str) -> int:
        """Give ``machine_id`` a row (reusing a freed one first)."""
        return self.ensure(machine_id)[0]

    def ensure(self, machine_id: str) -> tuple[int, bool]:
        """Row of ``machine_id``, adding it when unknown; the flag says whether it was added."""
        if not machine_id:
            raise ValueError("machine id: empty")
        encoded = self.strings.encode(machine_id)
        assert encoded is not None
        row, slot = self._find(*encoded)
        if row >= 0:
            return row, False
        if self._free:
            row = self._free.pop()
        else:
            row = self._rows
            self._rows += 1
            self.strings.ensure_rows(self._rows)
        self.strings.store(row, *encoded)
        if int(self._table[slot]) == -1:
            self._used += 1
        self._table[slot] = row
        self._count += 1
        if 4 * self._used > 3 * len(self._table):
            self._rebuild()
        return row, True

    def discard(self, row: int) -> None:
        """Forget the machine on ``row``; the row may be handed out again."""
        if row >= self._rows or int(self.strings.fmt[row]) == 0:
            return
        code = int(self.strings.fmt[row])
        found, slot = self._find(code, self.strings.number(row))
        if found == row:
            self._table[slot] = -2
        self.strings.store(row, 0, 0)
        self._count -= 1
        self._free.append(row)

    def reserve(self, machines: int) -> None:
        """Size the columns and the hash table for ``machines`` IDs without regrowing."""
        self.strings.ensure_rows(machines)
        if 4 * machines > 3 * len(self._table):
            self._rebuild(minimum=machines)

    def _rebuild(self, minimum: int = 0) -> None:
        live = np.flatnonzero(self.strings.fmt[: self._rows])
        size = max(8, 2 * max(len(live), minimum) + 1)
        table = np.full(size, -1, dtype=np.int32)
        for start in range(0, len(live), self._CHUNK):
            rows = live[start : start + self._CHUNK].astype(np.int64)
            slots = (self.strings.hashes(rows) % np.uint64(size)).astype(np.int64)
            # Place in rounds: every pending entry tries its slot, one winner per
            # slot, the others move one slot on (linear probing, as in ``_find``).
            pending = np.arange(len(rows))
            while len(pending):
                want = slots[pending]
                open_ = table[want] == -1
                candidates = pending[open_]
                _, first = np.unique(want[open_], return_index=True)
                winners = candidates[first]
                table[slots[winners]] = rows[winners]
                placed = np.zeros(len(rows), dtype=np.bool_)
                placed[winners] = True
                pending = pending[~placed[pending]]
                slots[pending] = (slots[pending] + 1) % size
        self._table = table
        self._used = len(live)

    # -- reading --------------------------------------------------------------------
    def id_of(self, row: int) -> str:
        """Machine ID on ``row``."""
        return self.strings.get(row)

    def ids_of(self, rows: Iterable[int] | npt.NDArray[np.int32]) -> list[str]:
        """Machine IDs on ``rows``, in order."""
        get = self.strings.get
        return [get(r) for r in np.asarray(rows, dtype=np.int64).tolist()]

    def live_rows(self) -> list[int]:
        """Rows currently holding a machine, ascending."""
        rows: list[int] = np.flatnonzero(self.strings.fmt[: self._rows]).tolist()
        return rows
