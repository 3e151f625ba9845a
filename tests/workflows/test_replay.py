"""Replay every recorded history against today's workflow code: a non-deterministic change fails.

Histories live in ``tests/workflows/histories``; refresh them after an
intentional change with ``python -m tests.workflows.histories.record`` (see
that module, and ``workflows/README.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.workflows.changed_drain import DrainWithAnExtraTimer
from workflows.registry import ALL_WORKFLOWS, COORDINATOR_WORKFLOWS

HISTORIES = Path(__file__).resolve().parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))
EVERY_WORKFLOW = [*ALL_WORKFLOWS, *COORDINATOR_WORKFLOWS]


def _history(path: Path) -> WorkflowHistory:
    raw = path.read_text()
    started = json.loads(raw)["events"][0]
    workflow_id = started.get("workflowExecutionStartedEventAttributes", {}).get(
        "workflowId", path.stem
    )
    return WorkflowHistory.from_json(workflow_id or path.stem, raw)


def test_there_is_a_recorded_history_of_every_workflow_type() -> None:
    recorded = {
        json.loads(p.read_text())["events"][0]["workflowExecutionStartedEventAttributes"][
            "workflowType"
        ]["name"]
        for p in FILES
    }
    assert recorded == {cls.__temporal_workflow_definition.name for cls in EVERY_WORKFLOW}  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_a_recorded_history_replays_on_todays_code(path: Path) -> None:
    await Replayer(workflows=EVERY_WORKFLOW).replay_workflow(_history(path))


def test_the_coordinators_history_covers_a_continue_as_new_and_every_child_kind() -> None:
    events = json.loads((HISTORIES / "coordinator_rounds.json").read_text())["events"]
    assert events[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
    children = {
        e["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowType"]["name"]
        for e in events
        if "startChildWorkflowExecutionInitiatedEventAttributes" in e
    }
    assert children == {"TransferWorkflow", "ClusterMoveWorkflow", "HandoverWorkflow"}


async def test_replay_catches_a_non_deterministic_change() -> None:
    history = _history(HISTORIES / "drain_preempt_blocked.json")
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[DrainWithAnExtraTimer]).replay_workflow(history)
