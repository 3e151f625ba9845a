"""Golden traces: small traces under version control with their expected summaries.

``python -m simulator.golden`` rewrites the expected summaries after a
deliberate change in behaviour (review the diff: it is the change's effect
on the replay). The tests replay each trace and compare.

The recorded-ops golden (``<trace>.ops.json``) is what the shards' cores
issued while the BigFleet policy replayed the trace: every operation, one
row per machine (:func:`op_rows`), counted by kind, digested, the first rows
kept readable. ``tests/workflows/test_recorded_ops.py`` gives the same plans
to production's core and its Temporal actuator and checks that the workflows
it starts are those operations.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, assert_never

from bigfleet.shard.core import DeleteOp, DrainOp, Operation, ProvisionOp, VerifyOp
from shard_engine.model import Action
from simulator.driver import POLICIES, RunOptions, run_policy, simulate
from simulator.trace import load_trace

__all__ = [
    "GOLDEN",
    "OPS_TRACE",
    "TRACES",
    "CorePlan",
    "OpsRecorder",
    "expected_path",
    "figures",
    "op_rows",
    "ops_expected_path",
    "ops_summary",
    "record_ops",
    "replay",
]

#: The trace whose operations are recorded: its replay provisions, drains and deletes.
OPS_TRACE = "tiers-small"
_FIRST_ROWS = 40

Row = tuple[Any, ...]

TRACES = Path(__file__).resolve().parent / "traces"

#: trace name -> (fleet quota scale, shards)
GOLDEN: dict[str, tuple[float, int]] = {"mixed-small": (1.0, 2), "tiers-small": (0.5, 3)}


def expected_path(name: str) -> Path:
    """Where the expected summary of a golden trace lives."""
    return TRACES / f"{name}.expected.json"


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The part of a summary that must not drift (everything but wall time and speed)."""
    return {
        k: v
        for k, v in summary.items()
        if k not in ("wall_seconds", "speedup", "setup_seconds", "cpu_seconds", "setup_cpu_seconds")
    }


def replay(name: str) -> dict[str, dict[str, Any]]:
    """Replay one golden trace under every policy; policy -> figures."""
    quota_scale, shards = GOLDEN[name]
    trace = load_trace(TRACES / f"{name}.jsonl")
    options = RunOptions(quota_scale=quota_scale, seed=7, shards=shards)
    return {r.policy: figures(r.summary) for r in simulate(trace, options, policies=POLICIES)}


def op_rows(op: Operation) -> list[Row]:
    """An operation as one row per machine: what it asks of that machine, nothing of how."""
    match op:
        case ProvisionOp():
            kind = "provision" if op.create else "configure"
            return [(kind, r.id, op.cluster_id, op.need_key, op.priority) for r in op.machines]
        case DrainOp():
            waiter = (
                None
                if op.preemptor is None
                else (op.preemptor.cluster_id, op.preemptor.need_key, op.preemptor.priority)
            )
            return [
                (
                    "drain",
                    op.machine.id,
                    op.cluster_id,
                    op.grace_seconds,
                    op.reason,
                    op.victim_priority,
                    waiter,
                )
            ]
        case DeleteOp():
            return [("delete", op.machine.id, op.reason)]
        case VerifyOp():
            return [("verify", op.machine.id, op.cluster_id)]
        case _:
            assert_never(op)


@dataclass
class CorePlan:
    """One cycle of one shard: the actions its core was given and the operations it issued."""

    shard_id: str
    now: float
    actions: tuple[Action, ...]
    operations: list[Operation] = field(default_factory=list)


@dataclass
class OpsRecorder:
    """A :class:`~simulator.bigfleet_policy.CoreTap` keeping every plan with its operations."""

    plans: list[CorePlan] = field(default_factory=list)
    _current: dict[str, CorePlan] = field(default_factory=dict)

    def plan(self, shard_id: str, now: float, actions: Sequence[Action]) -> None:
        entry = CorePlan(shard_id, now, tuple(actions))
        self._current[shard_id] = entry
        if actions:
            self.plans.append(entry)

    def operation(self, shard_id: str, op: Operation) -> None:
        self._current[shard_id].operations.append(op)

    def rows(self) -> list[Row]:
        return [row for p in self.plans for op in p.operations for row in op_rows(op)]


def record_ops(name: str = OPS_TRACE) -> OpsRecorder:
    """Replay a golden trace under the BigFleet policy, recording its cores' operations."""
    quota_scale, shards = GOLDEN[name]
    trace = load_trace(TRACES / f"{name}.jsonl")
    recorder = OpsRecorder()
    options = RunOptions(quota_scale=quota_scale, seed=7, shards=shards)
    run_policy(trace, "bigfleet", options, tap=recorder)
    return recorder


def ops_summary(rows: Sequence[Row]) -> dict[str, Any]:
    """What the recorded-ops golden keeps: counts, a digest, the first rows."""
    as_json = [json.loads(json.dumps(row)) for row in rows]
    digest = hashlib.sha256(json.dumps(as_json, sort_keys=True).encode()).hexdigest()
    return {
        "rows": len(rows),
        "by_kind": dict(sorted(Counter(str(r[0]) for r in rows).items())),
        "sha256": digest,
        "first": as_json[:_FIRST_ROWS],
    }


def ops_expected_path(name: str = OPS_TRACE) -> Path:
    """Where the recorded-ops golden of a trace lives."""
    return TRACES / f"{name}.ops.json"


def main() -> int:
    """Rewrite every expected summary and the recorded-ops golden."""
    for name in GOLDEN:
        path = expected_path(name)
        path.write_text(json.dumps(replay(name), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
    path = ops_expected_path()
    path.write_text(json.dumps(ops_summary(record_ops().rows()), indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
