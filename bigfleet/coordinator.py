"""The coordinator process: takes a new term, serves the coordinator's task queue,
and (re)starts the singleton ``CoordinatorWorkflow``.

Starting a coordinator always begins a new term (PostgreSQL CAS) and
replaces any running coordinator workflow, so a zombie coordinator's
instructions carry a lower term and are refused by every shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.context import ProviderCalls
from activities.registry import coordinator_activities
from bigfleet.metrics import COORDINATOR_TERM
from bigfleet.store import Store
from bigfleet.temporal import stop_worker
from workflows import coordinator as co
from workflows.registry import COORDINATOR_WORKFLOWS

log = logging.getLogger(__name__)

__all__ = ["CoordinatorProcess"]


class CoordinatorProcess:
    """Runs the coordinator's worker and owns the singleton workflow's lifetime."""

    def __init__(
        self,
        *,
        store: Store,
        temporal: Client,
        providers: Mapping[str, ProviderCalls],
        interval_s: float = 30.0,
        max_share: float = 0.05,
    ) -> None:
        self.store = store
        self.temporal = temporal
        self.providers = providers
        self.interval_s = interval_s
        self.max_share = max_share
        self.term = 0
        self._worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.term = await self.store.take_term()
        COORDINATOR_TERM.set(self.term)
        self._worker = Worker(
            self.temporal,
            task_queue=co.COORDINATOR_QUEUE,
            workflows=list(COORDINATOR_WORKFLOWS),
            activities=coordinator_activities(
                self.store, self.providers, rebalance_share=self.max_share
            ),
            graceful_shutdown_timeout=timedelta(seconds=5),
        )
        self._task = asyncio.create_task(self._worker.run(), name="coordinator-worker")
        await self.temporal.start_workflow(
            co.CoordinatorWorkflow.run,
            co.CoordinatorInput(
                term=self.term, interval_s=self.interval_s, max_share=self.max_share
            ),
            id=co.COORDINATOR_ID,
            task_queue=co.COORDINATOR_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        )
        log.info("coordinator running at term %d", self.term)

    async def decommission(self, inp: co.DecommissionInput) -> co.DecommissionResult:
        """Retire machines of a domain evenly from all shards; waits for the result."""
        return await self.temporal.execute_workflow(
            co.DecommissionWorkflow.run,
            inp,
            id=f"{co.COORDINATOR_ID}/decommission/{inp.provider}/{inp.label}={inp.value}/{self.term}",
            task_queue=co.COORDINATOR_QUEUE,
        )

    def handle(self) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(co.COORDINATOR_ID)

    async def status(self) -> dict[str, Any]:
        """The coordinator workflow's ``status`` query, as plain JSON values."""
        # By name: the method's ``dict[str, object]`` hint cannot convert nested values.
        result: dict[str, Any] = await self.handle().query("status")
        return result

    async def stop(self) -> None:
        """Stop serving; the workflow stays open and idle until a coordinator returns."""
        await stop_worker(self._worker, self._task, name="coordinator")
