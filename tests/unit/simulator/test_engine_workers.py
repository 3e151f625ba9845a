"""The shards' engines in worker processes decide exactly as in this process."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Sequence
from functools import partial

import pytest

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import CapacityType, MachineRecord, MachineState
from simulator import engines as ops
from simulator.driver import RunOptions, run_policy, simulate
from simulator.engines import LocalEngines, Result, WorkerEngines, WorkerFailed
from simulator.golden import GOLDEN, TRACES, expected_path, figures
from simulator.trace import load_trace


def _record(machine_id: str, state: MachineState = MachineState.IDLE) -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=state,
        provider="sim",
        instance_type="m.large",
        zone="z1",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=1.0,
        interruption_probability=0.0,
        allocatable={"cpu": 4.0, "memory": 16.0},
        labels={},
        cluster="",
        host_ref="h" if state is not MachineState.SPECULATIVE else "",
    )


def _load(shard_ids: Sequence[str]) -> dict[str, ShardEngine]:
    engines = {}
    for sid in shard_ids:
        engine = ShardEngine(EngineConfig())
        engine.upsert_machine(_record(f"{sid}-m0"), now=0.0)
        engines[sid] = engine
    return engines


def _machine_ids(engine: ShardEngine) -> list[str]:
    return sorted(r.id for r in engine.machines())


def _note(seen: list[str], shard_id: str, result: Result) -> None:
    seen.append(shard_id)


def _explode(engine: ShardEngine) -> None:
    raise ValueError("boom")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_golden_trace_replays_to_its_expected_summary_with_engines_in_two_workers(
    name: str,
) -> None:
    quota_scale, shards = GOLDEN[name]
    expected = json.loads(expected_path(name).read_text())
    options = RunOptions(quota_scale=quota_scale, seed=7, shards=shards, workers=2)
    policies = ["bigfleet", "bigfleet-no-gap"]
    results = simulate(load_trace(TRACES / f"{name}.jsonl"), options, policies=policies)
    assert {r.policy: figures(r.summary) for r in results} == {p: expected[p] for p in policies}
    assert multiprocessing.active_children() == []


def test_a_cross_shard_preemption_decides_the_same_with_engines_in_two_workers() -> None:
    # The donor's victim choice carries the engine config to the worker (ADR 0177's
    # trace: two preemptions across the shard border); it must pickle.
    trace = load_trace(TRACES / "oldest-first-two-shards.jsonl")
    summaries = [
        run_policy(
            trace, "bigfleet", RunOptions(quota_scale=1.0, seed=7, shards=2, workers=workers)
        ).summary
        for workers in (1, 2)
    ]
    local, remote = (figures(s) for s in summaries)
    assert summaries[1]["actions"]["transfer:preempt"] == 2
    assert remote == local
    assert multiprocessing.active_children() == []


def test_workers_answer_in_shard_order_and_run_each_engines_calls_in_order() -> None:
    shards = ["s0", "s1", "s2"]
    engines = WorkerEngines(shards, _load, workers=2)
    try:
        seen: list[str] = []
        for sid in shards:
            engines.post(sid, ops.upsert, _record(f"{sid}-m1"), 1.0)
            engines.post(sid, ops.remove, f"{sid}-m0", then=partial(_note, seen, sid))
        busy = list(engines.call_each(shards, ops.busy))
        assert busy == [frozenset(), frozenset(), frozenset()]
        assert sorted(seen) == shards  # every earlier answer landed before the call returned
        assert engines.cpu_seconds() > 0
        remote_ids = list(engines.call_each(shards, _machine_ids))
    finally:
        engines.close()
    local = LocalEngines(_load(shards))
    for sid in shards:
        local.post(sid, ops.upsert, _record(f"{sid}-m1"), 1.0)
        local.post(sid, ops.remove, f"{sid}-m0")
    assert remote_ids == list(local.call_each(shards, _machine_ids))
    assert remote_ids == [["s0-m1"], ["s1-m1"], ["s2-m1"]]


def test_a_failing_operation_surfaces_with_its_shard_and_the_workers_stop() -> None:
    engines = WorkerEngines(["s0", "s1"], _load, workers=2)
    try:
        engines.post("s1", _explode)  # fire and forget: surfaces at the next answer
        with pytest.raises(WorkerFailed, match=r"(?s)shard s1, _explode:.*boom"):
            list(engines.call_each(["s0", "s1"], ops.shortfalls))
    finally:
        engines.close()
    assert multiprocessing.active_children() == []


def test_closing_twice_is_harmless_and_answers_land_before_close_returns() -> None:
    engines = WorkerEngines(["s0"], _load, workers=1)
    answers: list[Result] = []
    engines.post("s0", ops.shortfalls, then=answers.append)
    engines.close()
    engines.close()
    assert answers == [Result(())]
    assert multiprocessing.active_children() == []
