"""The provider error vocabulary.

Every refusal a capacity provider can give has a name here, and each name has
exactly one gRPC status code on the wire (`providers.wire` holds the mapping).
`FAILED_PRECONDITION` belongs to `Fenced` alone: the wire contract reserves it
for fencing so a shard can alert on zombie-shard incidents mechanically. An
out-of-position transition is `InvalidTransition`, which travels as `ABORTED`
(see docs/adr/0010-provider-error-codes.md).
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base class of every provider refusal.

    ``retryable`` says whether the same call may succeed if simply sent again
    (with a fresh fencing sequence number). Only transport trouble is.
    """

    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Fenced(ProviderError):
    """The fencing token was not strictly newer than the provider's mark for
    this (shard_id, machine_id). Nothing was applied. Wire: FAILED_PRECONDITION."""


class InvalidArgument(ProviderError):
    """The request is malformed: empty id, negative grace, epoch or sequence,
    or a payload beyond a documented cap. Wire: INVALID_ARGUMENT."""


class NotFound(ProviderError):
    """No machine with this id exists at this provider. Wire: NOT_FOUND."""


class InvalidTransition(ProviderError):
    """The machine is not in a state the requested transition can start from
    (including FAILED, which refuses every mutation). Nothing was applied
    beyond advancing the fencing mark. Wire: ABORTED."""


class Unimplemented(ProviderError):
    """The provider does not offer this operation at all (Delete on bare
    metal). Wire: UNIMPLEMENTED."""


class ProviderUnavailable(ProviderError):
    """The provider could not be reached or did not answer in time. The
    outcome of a mutation is unknown; retry it with a fresh sequence number
    (idempotency makes that safe). Wire: UNAVAILABLE or DEADLINE_EXCEEDED."""

    retryable = True


__all__ = [
    "Fenced",
    "InvalidArgument",
    "InvalidTransition",
    "NotFound",
    "ProviderError",
    "ProviderUnavailable",
    "Unimplemented",
]
