"""Issue 18's hand-made traces replay to the answers worked out on paper beside them.

Each trace in ``simulator/traces`` named here has a ``.md`` file beside it
with the derivation. One shard, the shipped catalogs (``quota_scale`` 1:
GPU racks of 4 servers), seed 7, the real engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shard_engine.model import Action, Provision
from simulator.driver import RunOptions, run_policy
from simulator.golden import TRACES
from simulator.trace import load_trace


class Provisions:
    """Records every Provision the shard's core is given, with its virtual time."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, tuple[str, ...]]] = []

    def plan(self, shard_id: str, now: float, actions: Sequence[Action]) -> None:
        self.seen += [(now, a.machine_ids) for a in actions if isinstance(a, Provision)]

    def operation(self, shard_id: str, op: object) -> None:
        return None


def replay(name: str, tap: Provisions | None = None) -> dict[str, Any]:
    trace = load_trace(TRACES / f"{name}.jsonl")
    options = RunOptions(quota_scale=1.0, seed=7, shards=1, workers=1)
    return run_policy(trace, "bigfleet", options, tap=tap).summary


def test_two_gangs_of_four_run_in_two_racks_of_four() -> None:
    summary = replay("gangs-two-racks")

    tier = summary["time_to_capacity"]["p900000"]
    assert (tier["placed"], tier["never_placed"]) == (8, 0)
    assert summary["nodes_joined"] == 8


def test_nine_pods_of_four_cores_get_three_m6i_4xlarge_in_one_round() -> None:
    tap = Provisions()
    summary = replay("shapes-nine-pods", tap)

    first_time, first = tap.seen[0]
    assert first_time < 30.0  # the first cycles after the pods arrive
    assert len(first) == 3
    assert all("m6i-4xlarge" in machine for machine in first)
    tier = summary["time_to_capacity"]["p100000"]
    assert (tier["placed"], tier["never_placed"]) == (9, 0)
    assert tier["p99_s"] <= 120.0  # one launch round (boot ~60-80 s) plus a roll-up and a cycle


def test_the_anti_correlated_burst_runs_on_the_six_nodes_that_hold_it() -> None:
    summary = replay("burst-anticorrelated")

    tier = summary["time_to_capacity"]["p100000"]
    assert (tier["placed"], tier["never_placed"]) == (24, 0)
    assert summary["nodes_joined"] == 6
    assert summary["fragmentation_pod_minutes"] == 0.0
