"""Request validation at the provider boundary, with the documented caps.

Every check here raises `InvalidArgument` and runs before fencing, so a
malformed request never moves a fencing mark. The caps are part of our
provider contract and are listed in providers/README.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from providers.errors import InvalidArgument
from providers.model import FencingToken, State

#: Longest machine, cluster or shard id accepted (a DNS subdomain's limit,
#: since a machine id becomes a Kubernetes node name).
MAX_ID_LENGTH = 253

# The same naming rules the shard applies (``shard_engine.names``; providers
# are deployed on their own and import only the wire, so the rules are
# restated here and a test checks that both agree):
# machine and shard ids are printable ASCII without whitespace, cluster ids
# are DNS-1123 subdomains.
_PRINTABLE = re.compile(r"[!-~]+\Z")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}… ({len(value)} characters)"


def _bounded(field: str, value: str) -> None:
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(
            f"{field} is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed"
        )


#: Largest bootstrap blob accepted by Configure, in bytes.
MAX_BOOTSTRAP_BYTES = 1024 * 1024
#: Most shard_metadata entries accepted by Configure.
MAX_METADATA_ENTRIES = 256
#: Largest shard_metadata accepted, counted as UTF-8 bytes of keys plus values.
MAX_METADATA_BYTES = 64 * 1024


def machine_id(value: str) -> str:
    """A machine id: 1 to `MAX_ID_LENGTH` printable ASCII characters, no whitespace."""
    if not value:
        raise InvalidArgument("machine_id is required")
    _bounded("machine_id", value)
    if _PRINTABLE.match(value) is None:
        raise InvalidArgument(
            f"machine_id {_shown(value)} must be printable ASCII without whitespace"
        )
    return value


def token(value: FencingToken | None) -> FencingToken | None:
    """Epoch and sequence must be non-negative; the shard id is bounded."""
    if value is None:
        return None
    if value.epoch < 0 or value.sequence < 0:
        raise InvalidArgument(
            f"fencing token epoch and sequence must be >= 0, got ({value.epoch}, {value.sequence})"
        )
    _bounded("shard_id", value.shard_id)
    if value.shard_id and _PRINTABLE.match(value.shard_id) is None:
        raise InvalidArgument(
            f"shard_id {_shown(value.shard_id)} must be printable ASCII without whitespace"
        )
    return value


def cluster_id(value: str) -> str:
    """Configure needs a cluster id that is a DNS-1123 subdomain (at most 253 characters)."""
    if not value:
        raise InvalidArgument("cluster_id is required")
    _bounded("cluster_id", value)
    if _SUBDOMAIN.match(value) is None:
        raise InvalidArgument(
            f"cluster_id {_shown(value)} is not a DNS-1123 subdomain (lowercase letters, "
            "digits, '-' and '.', starting and ending with a letter or digit)"
        )
    return value


def bootstrap_blob(value: bytes) -> bytes:
    """The blob is opaque but bounded by `MAX_BOOTSTRAP_BYTES`."""
    if len(value) > MAX_BOOTSTRAP_BYTES:
        raise InvalidArgument(
            f"bootstrap_blob is {len(value)} bytes; the cap is {MAX_BOOTSTRAP_BYTES}"
        )
    return value


def shard_metadata(value: Mapping[str, str]) -> dict[str, str]:
    """Metadata is stored verbatim; only its size is checked. Returns a copy so
    later changes to the caller's mapping cannot reach the stored one."""
    if len(value) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(
            f"shard_metadata has {len(value)} entries; the cap is {MAX_METADATA_ENTRIES}"
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in value.items())
    if size > MAX_METADATA_BYTES:
        raise InvalidArgument(f"shard_metadata is {size} bytes; the cap is {MAX_METADATA_BYTES}")
    return dict(value)


def grace_seconds(value: int) -> int:
    """A drain grace period cannot be negative."""
    if value < 0:
        raise InvalidArgument(f"grace_period_seconds must be >= 0, got {value}")
    return value


def max_results(value: int) -> int:
    """Zero means no limit; negative is meaningless."""
    if value < 0:
        raise InvalidArgument(f"max_results must be >= 0, got {value}")
    return value


def states(values: Iterable[int]) -> frozenset[State]:
    """Every state in a List filter must be one of the eight real states."""
    out: set[State] = set()
    for raw in values:
        try:
            out.add(State(raw))
        except ValueError:
            raise InvalidArgument(f"unknown machine state {raw} in filter") from None
    return frozenset(out)
