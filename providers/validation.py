"""Request validation at the provider boundary, with the documented caps.

Every check here raises `InvalidArgument` and runs before fencing, so a
malformed request never moves a fencing mark. The caps are part of our
provider contract and are listed in providers/README.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from providers.errors import InvalidArgument
from providers.model import FencingToken, State

#: Longest machine, cluster or shard id accepted (a DNS subdomain's limit,
#: since a machine id becomes a Kubernetes node name).
MAX_ID_LENGTH = 253
#: Largest bootstrap blob accepted by Configure, in bytes.
MAX_BOOTSTRAP_BYTES = 1024 * 1024
#: Most shard_metadata entries accepted by Configure.
MAX_METADATA_ENTRIES = 256
#: Largest shard_metadata accepted, counted as UTF-8 bytes of keys plus values.
MAX_METADATA_BYTES = 64 * 1024


def machine_id(value: str) -> str:
    """A machine id must be non-empty and at most `MAX_ID_LENGTH` characters."""
    if not value:
        raise InvalidArgument("machine_id is required")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"machine_id longer than {MAX_ID_LENGTH} characters")
    return value


def token(value: FencingToken | None) -> FencingToken | None:
    """Epoch and sequence must be non-negative; the shard id is bounded."""
    if value is None:
        return None
    if value.epoch < 0 or value.sequence < 0:
        raise InvalidArgument(
            f"fencing token epoch and sequence must be >= 0, got ({value.epoch}, {value.sequence})"
        )
    if len(value.shard_id) > MAX_ID_LENGTH:
        raise InvalidArgument(f"shard_id longer than {MAX_ID_LENGTH} characters")
    return value


def cluster_id(value: str) -> str:
    """Configure needs a non-empty cluster id of bounded length."""
    if not value:
        raise InvalidArgument("cluster_id is required")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"cluster_id longer than {MAX_ID_LENGTH} characters")
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
