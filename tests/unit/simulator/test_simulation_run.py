"""A small multi-shard simulation: the real engines drive the real provider cores coherently."""

from __future__ import annotations

from typing import Any

import numpy as np

from providers.model import State
from simulator.baseline import BaselineOptions, BaselinePolicy
from simulator.bigfleet_policy import BigFleetOptions, BigFleetPolicy
from simulator.cluster import ClusterModel
from simulator.driver import RunOptions, run_policy
from simulator.fleet import Fleet, FleetOptions
from simulator.scenarios import build


def test_three_shards_replay_a_mixed_trace_and_the_report_figures_are_sane() -> None:
    scenario = build("mixed", clusters=6, duration=5400, seed=11)
    options = RunOptions(quota_scale=scenario.quota_scale, seed=3, shards=3)
    result = run_policy(scenario.trace, "bigfleet", options)
    s = result.summary
    assert s["cost_usd"] > 0
    assert 0 < s["utilisation"]["cpu"] <= 1
    assert s["actions"]["rollups"] > 0
    placed = sum(t["placed"] for t in s["time_to_capacity"].values())
    assert placed > 0
    assert len(result.series["t"]) == len(result.series["cost_rate"]) > 10


def test_nodes_match_the_providers_and_no_machine_has_two_owners() -> None:
    scenario = build("bursty-batch", clusters=4, duration=3600, seed=5)
    fleet = Fleet.build(FleetOptions(quota_scale=scenario.quota_scale, seed=2))
    touched: set[str] = set()
    clusters = {
        c: ClusterModel(c, heuristic=RunOptions().heuristic, gap=True, notify=touched)
        for c in scenario.trace.clusters
    }
    policy = BigFleetPolicy(fleet, clusters, BigFleetOptions(shards=3))
    policy.start(0.0)
    fleet.drain_changes()
    events = list(scenario.trace.events)
    now = 0.0
    while now < 1800:
        while events and events[0].t <= now:
            event = events.pop(0)
            cluster = clusters[event.cluster]
            if hasattr(event.pod, "name"):
                cluster.arrive(event.pod, now)  # type: ignore[arg-type]
            else:
                cluster.leave(event.pod, now)
        policy.on_changes(fleet.drain_changes(), now)
        for c in list(touched):
            clusters[c].schedule(now)
        touched.clear()
        policy.tick(now)
        fleet.scheduler.advance(1.0)
        now += 1.0
    owned = [set(s.state.owned) for s in policy.shards.values()]
    assert sum(len(o) for o in owned) == len(set().union(*owned)), "a machine has two owners"
    nodes = 0
    for cluster in clusters.values():
        for mid in cluster.node_ids():
            machine = fleet.providers[policy.shards[policy.owner[mid]].state.owned[mid]].get(mid)
            assert machine.state is State.CONFIGURED
            assert machine.cluster == cluster.cluster_id
            nodes += 1
        alloc, placed, _ = cluster.usage()
        assert np.all(placed <= alloc + 1e-6), "a cluster holds more than its nodes"
    assert nodes > 0, "nothing was provisioned"


def test_the_baseline_and_bigfleet_replay_the_same_trace() -> None:
    scenario = build("spot-tolerant", clusters=3, duration=3600, seed=9)
    options = RunOptions(quota_scale=scenario.quota_scale, seed=1)
    base = run_policy(scenario.trace, "baseline", options).summary
    fleet = run_policy(scenario.trace, "bigfleet", options).summary
    assert base["actions"]["launches"] > 0
    assert fleet["actions"]["rollups"] > 0

    def total(s: dict[str, Any]) -> int:
        return sum(t["placed"] + t["never_placed"] for t in s["time_to_capacity"].values())

    assert total(base) == total(fleet), "both policies saw the same pods"


def test_the_baseline_deals_gpu_racks_only_to_clusters_that_ask_for_gpus() -> None:
    fleet = Fleet.build(FleetOptions(quota_scale=1.0, seed=2))
    names = ("gpu-gangs-0002", "bursty-batch-0001", "diurnal-web-0000", "spot-tolerant-0003")
    clusters = {c: ClusterModel(c, heuristic=RunOptions().heuristic, gap=True) for c in names}
    policy = BaselinePolicy(
        fleet, clusters, BaselineOptions(), gpu_clusters=frozenset({"gpu-gangs-0002"})
    )
    policy.start(0.0)
    gpus = {
        name: sum(
            1
            for m in share.machines
            if policy.records[m].allocatable.get("nvidia.com/gpu", 0) > 0
            and policy.records[m].labels.get("topology.kubernetes.io/rack")
        )
        for name, share in policy.shares.items()
    }
    assert gpus["gpu-gangs-0002"] > 0
    assert all(count == 0 for name, count in gpus.items() if name != "gpu-gangs-0002")
    fleet.close()


def test_the_cost_by_category_adds_up_to_the_cost() -> None:
    scenario = build("mixed", clusters=5, duration=3600, seed=4)
    options = RunOptions(quota_scale=scenario.quota_scale, seed=3, shards=2)
    s = run_policy(scenario.trace, "bigfleet", options).summary
    by_category = s["cost_by_category_usd"]
    assert by_category, "nothing was billed"
    assert all(k.endswith(("/serving", "/idle")) for k in by_category)
    assert abs(sum(by_category.values()) - s["cost_usd"]) < 0.05
