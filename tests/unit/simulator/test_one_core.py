"""The simulator carries plans out with production's shard core, not a copy of it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import simulator
from simulator.golden import ops_expected_path, ops_summary, record_ops

# The engine's action types: dispatching on them is the shard core's job (bigfleet.shard.core).
_ACTIONS = {"AssignIdle", "Provision", "Preempt", "Reclaim", "Release", "Verify"}


def test_the_golden_trace_issues_its_recorded_operations() -> None:
    expected = json.loads(ops_expected_path().read_text())
    assert ops_summary(record_ops().rows()) == expected


def test_no_simulator_module_dispatches_on_the_engines_action_types() -> None:
    package = Path(simulator.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "shard_engine.model":
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name in _ACTIONS]
    assert offenders == [], "action types belong to the shard core: " + ", ".join(offenders)


# ShardState's methods by which a machine leaves a shard or comes back: carrying out a
# coordinator instruction is bigfleet.shard.transfers' job, which the simulator runs too.
_DEPARTURES = {"give_away", "take_back", "mark_leaving", "stay"}


def test_no_simulator_module_moves_machines_between_shards_itself() -> None:
    package = Path(simulator.__file__).parent
    offenders = [
        f"{path.name}:{node.lineno}: {node.func.attr}"
        for path in sorted(package.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _DEPARTURES
    ]
    assert offenders == [], "transfers belong to CrossShardTransfers: " + ", ".join(offenders)
