"""Custom search attributes set by every machine workflow.

They make the Temporal UI the fleet's inspection console. "Stuck drains" is
one query, :func:`stuck_drains_query`, used by ``bigfleet drains --stuck``
and shown, word for word, in the README and the workflows README (a test
keeps them equal).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from workflows.contracts import SHARD_MODES, ShardModeSignal

MACHINE_ID = SearchAttributeKey.for_keyword("BigFleetMachineId")
MACHINE_IDS = SearchAttributeKey.for_keyword_list("BigFleetMachineIds")
CLUSTER_ID = SearchAttributeKey.for_keyword("BigFleetClusterId")
SHARD_ID = SearchAttributeKey.for_keyword("BigFleetShardId")
OPERATION = SearchAttributeKey.for_keyword("BigFleetOperation")
PHASE = SearchAttributeKey.for_keyword("BigFleetPhase")
PRIORITY = SearchAttributeKey.for_int("BigFleetPriority")
GRACE_SECONDS = SearchAttributeKey.for_int("BigFleetGraceSeconds")
# Why a drain, delete or recovery runs (workflows.contracts.REASONS).
REASON = SearchAttributeKey.for_keyword("BigFleetReason")
# What the starting shard may do: set at start ("active", or "paused"/"dry-run" for
# an operator's command during one) and upserted when a pause, dry run or resume
# lands, so `BigFleetShardMode = 'paused'` lists the work still finishing (ADR 0153).
SHARD_MODE = SearchAttributeKey.for_keyword("BigFleetShardMode")

ALL: tuple[SearchAttributeKey[Any], ...] = (
    MACHINE_ID,
    MACHINE_IDS,
    CLUSTER_ID,
    SHARD_ID,
    OPERATION,
    PHASE,
    PRIORITY,
    GRACE_SECONDS,
    REASON,
    SHARD_MODE,
)


def stuck_drains_query(started_before: str | None = None) -> str:
    """The visibility query for running drains, started before ``started_before``.

    ``started_before`` is an RFC 3339 UTC instant (``2026-11-29T12:00:00Z``);
    None lists every running drain.
    """
    query = "WorkflowType = 'DrainWorkflow' AND ExecutionStatus = 'Running'"
    if started_before:
        query += f" AND StartTime < '{started_before}'"
    return query


def in_flight_query(shard_id: str, *, not_mode: str | None = None) -> str:
    """The visibility query for the running workflows a shard started.

    ``not_mode`` leaves out those already marked with that BigFleetShardMode.
    """
    query = f"BigFleetShardId = '{shard_id}' AND ExecutionStatus = 'Running'"
    if not_mode is not None:
        query += f" AND (BigFleetShardMode IS NULL OR BigFleetShardMode != '{not_mode}')"
    return query


def upsert_shard_mode(sig: ShardModeSignal) -> bool:
    """In a workflow's signal handler: mark the workflow with its shard's new mode.

    A mode outside ``SHARD_MODES`` is ignored (a signal cannot be refused, and
    a value nobody queries for would only hide the workflow). Returns whether
    the attribute was set.
    """
    if sig.mode not in SHARD_MODES:
        workflow.logger.warning("ignoring shard mode %r (not one of %s)", sig.mode, SHARD_MODES)
        return False
    workflow.upsert_search_attributes([SHARD_MODE.value_set(sig.mode)])
    return True


def paused_work_query(shard_id: str | None = None) -> str:
    """Work still finishing while its shard is paused (what ``bigfleet shards`` quotes)."""
    query = "BigFleetShardMode = 'paused' AND ExecutionStatus = 'Running'"
    if shard_id:
        query += f" AND BigFleetShardId = '{shard_id}'"
    return query


# Phase value for a workflow parked until an operator acts on it.
AWAITING_OPERATOR = "AwaitingOperator"
# Phase value for a workflow stopped because a provider fenced its shard.
FENCED_PHASE = "Fenced"

# Temporal refuses (and the dev server terminates a workflow for) a search
# attribute value larger than 2 KiB by default. A KeywordList is measured as
# its JSON encoding, so a batch lists at most ~40 machines of 45-character ids.
MAX_VALUE_BYTES = 2048
_BUDGET = MAX_VALUE_BYTES - 48


def keyword_list_bytes(values: Sequence[str]) -> int:
    """The size Temporal counts for a KeywordList value (its JSON encoding)."""
    return len(json.dumps(list(values), separators=(",", ":")).encode())


def fits(values: Sequence[str]) -> bool:
    """Whether ``values`` fit in one KeywordList search attribute, with a margin."""
    return keyword_list_bytes(values) <= _BUDGET


def fitting_prefix(values: Sequence[str]) -> list[str]:
    """The longest prefix of ``values`` that fits in one KeywordList search attribute."""
    out: list[str] = []
    for value in values:
        if not fits([*out, value]):
            break
        out.append(value)
    return out


def chunks_that_fit(values: Sequence[str], *, at_most: int) -> list[list[str]]:
    """Split ``values`` into runs of at most ``at_most`` that each fit one KeywordList."""
    out: list[list[str]] = []
    current: list[str] = []
    for value in values:
        if current and (len(current) >= at_most or not fits([*current, value])):
            out.append(current)
            current = []
        current.append(value)
    if current:
        out.append(current)
    return out
