"""Kubernetes resource quantities ("500m", "4Gi", "1.5", "2e3") as floats.

Canonical units: CPU in cores, memory and storage in bytes, everything else
as a plain count. Parsing is strict: anything Kubernetes would refuse is an
:class:`InvalidQuantity` naming the text and the reason.

Bounds (ADR 0110): a quantity is at most :data:`MAX_QUANTITY_TEXT` characters
long, at most :data:`MAX_QUANTITY` (2^63, the int64 range Kubernetes and the
Go reference hold quantities in) and, unless zero, at least
:data:`MIN_QUANTITY` (``1n``, Kubernetes' smallest unit). ``1e400`` overflows
and ``1e-400`` underflows; both are refused rather than becoming infinity or
a silent zero.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "MAX_QUANTITY",
    "MAX_QUANTITY_TEXT",
    "MIN_QUANTITY",
    "InvalidQuantity",
    "format_quantity",
    "parse_quantity",
    "parse_resources",
    "quantity_problem",
]

MAX_QUANTITY = 2.0**63
"""Largest quantity in canonical units (sums of thousands of them stay finite)."""
MIN_QUANTITY = 1e-9
"""Smallest non-zero quantity: ``1n``."""
MAX_QUANTITY_TEXT = 64
"""Longest quantity string accepted."""


class InvalidQuantity(ValueError):
    """A quantity string that is not a valid Kubernetes quantity."""

    def __init__(self, text: str, reason: str, *, field: str = "") -> None:
        self.text = text
        self.reason = reason
        self.field = field
        where = f"{field}: " if field else ""
        shown = text if len(text) <= 40 else f"{text[:40]}…"
        super().__init__(f"{where}invalid quantity {shown!r}: {reason}")


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


def parse_quantity(text: str, *, field: str = "") -> float:
    """Parse one Kubernetes quantity into a float in canonical units.

    Negative quantities are refused: no resource request or capacity can be
    negative, and a negative value would silently shrink a sum.
    """
    if not isinstance(text, str):
        raise InvalidQuantity(repr(text), "not a string", field=field)
    if len(text) > MAX_QUANTITY_TEXT:
        raise InvalidQuantity(
            text, f"{len(text)} characters; at most {MAX_QUANTITY_TEXT}", field=field
        )
    stripped = text.strip()
    if not stripped:
        raise InvalidQuantity(text, "empty", field=field)
    match = _PATTERN.match(stripped)
    if match is None:
        raise InvalidQuantity(
            text, "not a number with an optional SI or binary suffix", field=field
        )
    if match.group("sign") == "-":
        raise InvalidQuantity(text, "negative quantities are not allowed", field=field)
    number = match.group("num")
    # float() of the whole literal never raises: 1e400 is inf and 1e-400 is 0.0,
    # both caught below (``10.0 ** 400`` would raise OverflowError instead).
    value = float(number + (match.group("exp") or ""))
    suffix = match.group("suffix") or ""
    value *= _BINARY.get(suffix, _DECIMAL.get(suffix, 1.0))
    problem = quantity_problem(value)
    if problem is None and value == 0.0 and number.strip("0.") != "":
        problem = f"underflows: below the smallest quantity 1n ({MIN_QUANTITY:g})"
    if problem is not None:
        raise InvalidQuantity(text, problem, field=field)
    return value


def quantity_problem(value: float) -> str | None:
    """Why ``value`` (canonical units) is out of range, or None."""
    if value != value:  # NaN
        return "not a number"
    if value < 0:
        return "negative quantities are not allowed"
    if value > MAX_QUANTITY:
        return "overflows: larger than the largest quantity 2^63"
    if 0.0 < value < MIN_QUANTITY:
        return f"underflows: below the smallest quantity 1n ({MIN_QUANTITY:g})"
    return None


def parse_resources(resources: Mapping[str, str], *, field: str = "") -> dict[str, float]:
    """Parse a resource map (name -> quantity string), naming the bad key on error."""
    out: dict[str, float] = {}
    for name, text in resources.items():
        if not name:
            raise InvalidQuantity(text, "empty resource name", field=field)
        out[name] = parse_quantity(text, field=f"{field}[{name}]" if field else name)
    return out


def format_quantity(name: str, value: float) -> str:
    """Render a canonical value back into a quantity string (inverse of parsing)."""
    if name == "cpu":
        millis = round(value * 1000)
        return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"
    if value == int(value):
        ivalue = int(value)
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = _BINARY[suffix]
            if ivalue >= unit and ivalue % unit == 0:
                return f"{ivalue // unit}{suffix}"
        return str(ivalue)
    return repr(value)
