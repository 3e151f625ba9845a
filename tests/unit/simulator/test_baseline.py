"""The per-cluster baseline's own bookkeeping: it launches once for each pod it provisions."""

from __future__ import annotations

from clusters.pods import PodSpec
from providers.clock import ManualScheduler
from shard_engine.model import MachineState, Operator, Requirement
from simulator.baseline import BaselineOptions, BaselinePolicy
from simulator.cluster import ClusterModel
from simulator.driver import RunOptions
from simulator.fleet import Fleet, FleetOptions

GI = float(2**30)
RACK = "topology.kubernetes.io/rack"
# One on-demand cloud type (15.89 cores): four of the pods below fill a machine.
M6I_4XLARGE = (
    Requirement("node.kubernetes.io/instance-type", Operator.IN, ("m6i.4xlarge",)),
    Requirement("bigfleet.io/capacity-type", Operator.IN, ("on-demand",)),
)


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


def test_a_pod_whose_machine_another_pod_took_waits_for_that_pods_machine() -> None:
    # Batch 1 launches machines for four pods; 10 s later batch 2 launches for four pods of
    # a higher priority. The cluster's scheduler puts the higher-priority pods on the first
    # machine to land. Karpenter counts the room of machines in flight, not which pod each
    # was launched for: the first four pods wait for the second launch, and nothing more
    # is bought.
    scheduler = ManualScheduler()
    fleet = Fleet.build(FleetOptions(quota_scale=1.0, seed=3), scheduler)
    cluster = ClusterModel("web-0000", heuristic=RunOptions().heuristic, gap=False)
    policy = BaselinePolicy(fleet, {"web-0000": cluster}, BaselineOptions())

    def pods(prefix: str, priority: int, now: float) -> None:
        for i in range(4):
            cluster.arrive(
                PodSpec.build(
                    f"{prefix}-{i}",
                    {"cpu": 3.5, "memory": 12 * GI},
                    priority=priority,
                    requirements=M6I_4XLARGE,
                ),
                now,
            )

    try:
        policy.start(0.0)
        fleet.drain_changes()
        pods("low", 1_000, 0.0)
        now = 0.0
        late_taken = False
        while now < 1800.0 and cluster.pending:
            if now == 10.0:
                pods("high", 500_000, now)
            changes = fleet.drain_changes()
            if changes:
                policy.on_changes(changes, now)
            cluster.schedule(now)
            high_ran = now >= 10.0 and any(cluster.pods[f"high-{i}"].node for i in range(4))
            late_taken |= high_ran and any(not cluster.pods[f"low-{i}"].node for i in range(4))
            policy.tick(now)
            if now == 10.0:
                bought = policy.stats["launches"]
            scheduler.advance(1.0)
            now += 1.0
        assert not cluster.pending
        assert late_taken, "the low-priority pods' machine was not taken; the case is not exercised"
        assert policy.stats["launches"] == bought
    finally:
        fleet.close()
