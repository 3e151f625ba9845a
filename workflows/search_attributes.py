"""Custom search attributes set by every machine workflow.

They make the Temporal UI the fleet's inspection console: "stuck drains" is
``WorkflowType='DrainWorkflow' AND ExecutionStatus='Running' AND
BigFleetPhase='DRAINING' AND StartTime < '<30 minutes ago>'``.
"""

from __future__ import annotations

from typing import Any

from temporalio.common import SearchAttributeKey

MACHINE_ID = SearchAttributeKey.for_keyword("BigFleetMachineId")
MACHINE_IDS = SearchAttributeKey.for_keyword_list("BigFleetMachineIds")
CLUSTER_ID = SearchAttributeKey.for_keyword("BigFleetClusterId")
SHARD_ID = SearchAttributeKey.for_keyword("BigFleetShardId")
OPERATION = SearchAttributeKey.for_keyword("BigFleetOperation")
PHASE = SearchAttributeKey.for_keyword("BigFleetPhase")
PRIORITY = SearchAttributeKey.for_int("BigFleetPriority")
GRACE_SECONDS = SearchAttributeKey.for_int("BigFleetGraceSeconds")

ALL: tuple[SearchAttributeKey[Any], ...] = (
    MACHINE_ID,
    MACHINE_IDS,
    CLUSTER_ID,
    SHARD_ID,
    OPERATION,
    PHASE,
    PRIORITY,
    GRACE_SECONDS,
)

# Phase value for a workflow parked until an operator acts on it.
AWAITING_OPERATOR = "AwaitingOperator"
# Phase value for a workflow stopped because a provider fenced its shard.
FENCED_PHASE = "Fenced"
