"""The naming rules every identifier from outside must follow, and why a name broke them.

Operators send cluster ids, resource names and label selectors; providers
send machine ids and labels. All of them end up as dictionary keys, array
labels, log lines, database rows and Kubernetes objects, so each kind of
name has one documented rule, the one Kubernetes applies to the same thing:

=====================  ============================================================
cluster id             DNS-1123 subdomain: at most 253 characters of ``a-z``,
                       ``0-9``, ``-`` and ``.``, starting and ending with a letter
                       or digit (what Kubernetes requires of an object name)
label key, resource    qualified name: an optional DNS-1123 subdomain prefix and
name, topology key     ``/``, then at most 63 characters of ``A-Za-z0-9``, ``-``,
                       ``_`` and ``.``, starting and ending with a letter or digit
label value            empty, or at most 63 characters as the name part above
selector value         a value in a node-selector requirement: at most 253
                       characters, no control characters (Kubernetes itself
                       checks only the key of a node-selector requirement, so a
                       value that no label could hold is allowed; it matches
                       nothing)
machine id             1 to 253 printable ASCII characters, no whitespace (it
                       becomes a node name and a database key; providers' own
                       formats such as ``i-0a1b2c…`` or ``SN-3F2A…`` all fit)
=====================  ============================================================

Each check returns ``None`` for a good name or a short reason for a bad one;
callers attach the field path. Reasons never echo a long or binary value in
full (:func:`shown`), so a 10,000-character id makes a short error. Verdicts on
names short enough to be valid are remembered (at most 4,096 of each kind),
because the same few resource names and label keys arrive in every roll-up.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "KNOWN_LABEL_KEYS",
    "MAX_LABEL_VALUE",
    "MAX_NAME",
    "MAX_SUBDOMAIN",
    "cluster_id_problem",
    "label_key_problem",
    "label_value_problem",
    "machine_id_problem",
    "selector_value_problem",
    "shown",
]

MAX_SUBDOMAIN = 253
"""Longest DNS-1123 subdomain (and longest machine id)."""
MAX_NAME = 63
"""Longest name part of a qualified name."""
MAX_LABEL_VALUE = 63
"""Longest label value."""

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_PRINTABLE = re.compile(r"[!-~]+\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SPACE = re.compile(r"\s")


def shown(value: str, limit: int = 40) -> str:
    """``repr`` of ``value`` cut to about ``limit`` characters (for error messages)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


def _character_problem(value: str) -> str | None:
    """The first unprintable or space character, named, or None."""
    bad = _CONTROL.search(value)
    if bad is not None:
        return f"contains the control character {bad.group()!r} at position {bad.start()}"
    space = _SPACE.search(value)
    if space is not None:
        if not value.strip():
            return "is only whitespace"
        return f"contains whitespace at position {space.start()}"
    return None


def cluster_id_problem(value: str) -> str | None:
    """Why ``value`` is not a usable cluster id (a DNS-1123 subdomain), or None."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_SUBDOMAIN:
        return f"is {len(value)} characters long; at most {MAX_SUBDOMAIN} are allowed"
    return _cluster_id_problem(value)


@lru_cache(maxsize=4096)
def _cluster_id_problem(value: str) -> str | None:
    found = _character_problem(value)
    if found is not None:
        return found
    if _SUBDOMAIN.match(value) is None:
        return (
            f"{shown(value)} is not a DNS-1123 subdomain (lowercase letters, digits, '-' "
            "and '.', starting and ending with a letter or digit)"
        )
    return None


KNOWN_LABEL_KEYS: set[str] = set()
"""Qualified names that passed :func:`label_key_problem` (at most 4,096 remembered).

Read-only for callers: a hot loop may test membership here first and call
the check only for names it has not seen (resource names in every roll-up).
"""


def label_key_problem(value: str) -> str | None:
    """Why ``value`` is not a qualified name (label key, resource name), or None."""
    if value in KNOWN_LABEL_KEYS:
        return None
    if not value:
        return "must not be empty"
    if len(value) > MAX_SUBDOMAIN + 1 + MAX_NAME:
        return f"is {len(value)} characters long; at most {MAX_SUBDOMAIN + 1 + MAX_NAME}"
    problem = _label_key_problem(value)
    if problem is None and len(KNOWN_LABEL_KEYS) < 4096:
        KNOWN_LABEL_KEYS.add(value)
    return problem


@lru_cache(maxsize=4096)
def _label_key_problem(value: str) -> str | None:
    found = _character_problem(value)
    if found is not None:
        return found
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > MAX_SUBDOMAIN or _SUBDOMAIN.match(prefix) is None):
        return f"{shown(value)} has a prefix that is not a DNS-1123 subdomain"
    if not name:
        return f"{shown(value)} has an empty name after the prefix"
    if len(name) > MAX_NAME:
        return f"{shown(value)} has a name part of {len(name)} characters; at most {MAX_NAME}"
    if _NAME.match(name) is None:
        return (
            f"{shown(value)} is not a qualified name (letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit, after an optional 'prefix/')"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a label value, or None (the empty value is allowed)."""
    if not value:
        return None
    if len(value) > MAX_LABEL_VALUE:
        return f"is {len(value)} characters long; at most {MAX_LABEL_VALUE}"
    return _label_value_problem(value)


@lru_cache(maxsize=4096)
def _label_value_problem(value: str) -> str | None:
    found = _character_problem(value)
    if found is not None:
        return found
    if _NAME.match(value) is None:
        return (
            f"{shown(value)} is not a label value (letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit)"
        )
    return None


def selector_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a node-selector value, or None."""
    if len(value) > MAX_SUBDOMAIN:
        return f"is {len(value)} characters long; at most {MAX_SUBDOMAIN}"
    bad = _CONTROL.search(value)
    if bad is not None:
        return f"contains the control character {bad.group()!r} at position {bad.start()}"
    return None


def machine_id_problem(value: str) -> str | None:
    """Why ``value`` is not a usable machine id, or None."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_SUBDOMAIN:
        return f"is {len(value)} characters long; at most {MAX_SUBDOMAIN} are allowed"
    if _PRINTABLE.match(value) is None:
        return _character_problem(value) or "must be printable ASCII"
    return None
