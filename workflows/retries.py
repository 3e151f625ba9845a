"""Activity timeouts and retry policies the workflows share (one definition each).

    PROVIDER_RETRY      provider calls and shard-side machine activities: quick and
                        cheap to retry; the error types of ``errors.NON_RETRYABLE`` are final
    RECORD_RETRY        recording an outcome: retried until it lands (ADR 0101); only a
                        malformed request stops it
    INSTRUCTION_RETRY   the coordinator's and membership workflows' activities: a few
                        attempts, then the instruction's outcome says it failed
    LEASE_WAIT_*        how long a workflow waits before asking a shard that is not
                        acting again (doubling up to the maximum)

Changing a value changes the commands a workflow issues: recorded histories
still replay (a retry policy is not part of the command's identity), but
running workflows keep the policy they scheduled with.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from workflows.errors import INVALID_ARGUMENT, NON_RETRYABLE

__all__ = [
    "CALL_TIMEOUT",
    "INSTRUCTION_RETRY",
    "LEASE_WAIT_INITIAL_S",
    "LEASE_WAIT_MAX_S",
    "PROVIDER_RETRY",
    "QUICK",
    "RECORD_RETRY",
]

# A provider call only asks for a transition: it answers quickly.
CALL_TIMEOUT = timedelta(seconds=30)
# A coordinator bookkeeping activity (record, finish, plan) answers quickly too.
QUICK = timedelta(seconds=30)

PROVIDER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=list(NON_RETRYABLE),
)

RECORD_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
    non_retryable_error_types=[INVALID_ARGUMENT],
)

INSTRUCTION_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10))

LEASE_WAIT_INITIAL_S = 5.0
LEASE_WAIT_MAX_S = 300.0
