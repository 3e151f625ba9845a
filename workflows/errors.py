"""Error types that cross the activity boundary as ``ApplicationError.type``.

Activities raise ``ApplicationError(type=<one of these>)`` deliberately; the
workflows branch on the type. Anything in ``NON_RETRYABLE`` is final.
"""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError

# A provider refused our fencing token: this shard process is a zombie.
FENCED = "Fenced"
# The cluster's operator answered a bootstrap request with an error or not at all.
BOOTSTRAP_UNAVAILABLE = "BootstrapUnavailable"
# A request the provider says is malformed; retrying cannot help.
INVALID_ARGUMENT = "InvalidArgument"
# The shard process lost its lease; it must not record or act.
LEASE_LOST = "LeaseLost"
# Recording an outcome reached a process that cannot act for the shard now (or
# the store refused its epoch). Retryable: the next attempt may reach the
# process that holds the lease, which records it (ADR 0101).
NOT_LEASE_HOLDER = "NotLeaseHolder"

NON_RETRYABLE = (FENCED, BOOTSTRAP_UNAVAILABLE, INVALID_ARGUMENT, LEASE_LOST)

# Per-machine refusals a provider can give, returned as data (TransitionAnswer.refusal)
# rather than raised: the workflow decides what each means for its machine.
INVALID_TRANSITION = "InvalidTransition"
NOT_FOUND = "NotFound"
UNIMPLEMENTED = "Unimplemented"


def error_type(err: ActivityError) -> str | None:
    """The ``ApplicationError.type`` an activity failed with, if any."""
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def error_message(err: ActivityError) -> str:
    """The message an activity failed with."""
    cause = err.cause
    return cause.message if isinstance(cause, ApplicationError) else str(err)
