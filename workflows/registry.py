"""Every workflow BigFleet's workers serve, by task queue (wiring in one place).

ALL_WORKFLOWS          task queue shard-<id>: the machine workflows
COORDINATOR_WORKFLOWS  task queue bigfleet-coordinator: the coordinator, its
                       transfers, decommissions and membership moves
"""

from __future__ import annotations

from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from workflows.coordinator import CoordinatorWorkflow, DecommissionWorkflow, TransferWorkflow
from workflows.delete import DeleteWorkflow
from workflows.drain import DrainWorkflow
from workflows.membership import ClusterMoveWorkflow, HandoverWorkflow
from workflows.provision import ProvisionWorkflow
from workflows.recover import RecoverWorkflow
from workflows.verify import VerifyWorkflow

ALL_WORKFLOWS: tuple[type, ...] = (
    ProvisionWorkflow,
    DrainWorkflow,
    DeleteWorkflow,
    RecoverWorkflow,
    VerifyWorkflow,
)

COORDINATOR_WORKFLOWS: tuple[type, ...] = (
    CoordinatorWorkflow,
    TransferWorkflow,
    DecommissionWorkflow,
    ClusterMoveWorkflow,
    HandoverWorkflow,
)


def workflow_runner() -> WorkflowRunner:
    """The sandbox the shard's worker runs workflows in.

    The default sandbox re-imports every workflow module for every workflow
    run; on two cores that first task costs a per-machine drain about half
    its throughput (bench lifecycle). Our workflow modules hold no mutable
    module state, so they are imported once and passed through; everything
    else stays sandboxed. Tests and the replay check keep the full sandbox,
    so a non-deterministic call in a workflow still fails there (ADR 0031).
    """
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows")
    )


__all__ = [
    "ALL_WORKFLOWS",
    "COORDINATOR_WORKFLOWS",
    "DeleteWorkflow",
    "DrainWorkflow",
    "ProvisionWorkflow",
    "RecoverWorkflow",
    "VerifyWorkflow",
    "workflow_runner",
]
