"""Durations typed by an operator (``10s``, ``1h30m``) and ages and instants printed back."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import typer

__all__ = ["age", "parse_duration", "utc"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``10s``, ``30m``, ``2h``, ``1h30m`` -> seconds."""
    cleaned = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise typer.BadParameter(f"{text!r} is not a duration like 90, 10s, 30m or 1h30m")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def age(seconds: float) -> str:
    """A short age for a table column: ``45s``, ``12m``, ``3h05m``."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def utc(unix: float) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM:SSZ``."""
    return datetime.fromtimestamp(float(unix), tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
