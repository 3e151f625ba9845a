"""The per-cluster baseline's own bookkeeping: it launches once for each pod it provisions."""

from __future__ import annotations

from clusters.pods import PodSpec
from providers.clock import ManualScheduler
from shard_engine.model import MachineState
from simulator.baseline import BaselineOptions, BaselinePolicy
from simulator.cluster import ClusterModel
from simulator.driver import RunOptions
from simulator.fleet import Fleet, FleetOptions

GI = float(2**30)
RACK = "topology.kubernetes.io/rack"


def test_a_gangs_pods_stay_nominated_until_its_last_machine_lands() -> None:
    # A gang scheduler binds none of a gang's pods before every machine launched for the
    # gang is ready. The first machine to land must not leave its pod un-nominated, or the
    # next batch launches again for a pod whose machine is a few seconds behind.
    scheduler = ManualScheduler()
    fleet = Fleet.build(FleetOptions(quota_scale=1.0, seed=3), scheduler)
    cluster = ClusterModel("train-0000", heuristic=RunOptions().heuristic, gap=False)
    policy = BaselinePolicy(
        fleet, {"train-0000": cluster}, BaselineOptions(), gpu_clusters=frozenset({"train-0000"})
    )
    try:
        policy.start(0.0)
        fleet.drain_changes()
        for member in range(2):
            cluster.arrive(
                PodSpec.build(
                    f"train-a-{member}",
                    {"cpu": 88.0, "memory": 900 * GI, "nvidia.com/gpu": 8.0},
                    priority=900_000,
                    colocation="train-a",
                    colocation_key=RACK,
                ),
                0.0,
            )
        policy.tick(0.0)
        assert policy.stats["launches"] == 2
        launched = set(policy.shares["train-0000"].launching)
        landed_apart = False
        now = 0.0
        while now < 1800.0 and not all(cluster.has_node(m) for m in launched):
            scheduler.advance(1.0)
            now += 1.0
            changes = fleet.drain_changes()
            if changes:
                policy.on_changes(changes, now)
            ready = sum(policy.state_of[m] is MachineState.CONFIGURED for m in launched)
            landed_apart |= ready == 1
            if ready == len(launched):
                assert cluster.schedule(now) == 2  # the gang binds once all are ready
            policy.tick(now)
        assert all(cluster.has_node(m) for m in launched)
        assert landed_apart, "the two machines landed together; the case is not exercised"
        assert policy.stats["launches"] == 2
        # Once both have landed the pods are no longer waiting for a launch.
        assert not policy.shares["train-0000"].nominated
    finally:
        fleet.close()
