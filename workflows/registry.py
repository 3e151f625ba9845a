"""Every workflow a shard's worker serves, in one list (wiring in one place)."""

from __future__ import annotations

from workflows.delete import DeleteWorkflow
from workflows.drain import DrainWorkflow
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

__all__ = [
    "ALL_WORKFLOWS",
    "DeleteWorkflow",
    "DrainWorkflow",
    "ProvisionWorkflow",
    "RecoverWorkflow",
    "VerifyWorkflow",
]
