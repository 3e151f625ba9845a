"""The cluster model: fragmentation is counted for every pod it strands, and asked for;
best-effort pods are asked for only when the gap cannot hold them."""

from __future__ import annotations

from bigfleet.v1alpha1 import capacity_pb2
from clusters.packing import Heuristic
from clusters.pods import PodSpec
from shard_engine.model import AppClass
from simulator.cluster import ClusterModel

GI = float(2**30)


def _cluster_with_two_half_full_nodes() -> ClusterModel:
    """Two 8-core nodes, 5 cores used on each: 6 cores free in total, 3 on each."""
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=True)
    for node in ("n1", "n2"):
        cluster.add_node(node, {"cpu": 8.0, "memory": 64 * GI}, {}, 0.0)
    for i in range(2):
        cluster.arrive(PodSpec.build(f"filler-{i}", {"cpu": 5.0, "memory": 1 * GI}), 0.0)
    assert cluster.schedule(0.0) == 2
    return cluster


def test_every_identical_pod_that_no_node_fits_counts_as_fragmented() -> None:
    cluster = _cluster_with_two_half_full_nodes()
    for i in range(3):
        cluster.arrive(PodSpec.build(f"wide-{i}", {"cpu": 4.0, "memory": 1 * GI}), 1.0)
    assert cluster.schedule(1.0) == 0
    waiting, fragmented = cluster.pending_counts()
    # Each 4-core pod fits the 6 cores free in total but no single node: all three are
    # fragmented, including the two the pass skipped after the first one failed.
    assert (waiting, fragmented) == (3, 3)


def test_the_rollup_asks_once_more_for_each_fragmented_pod() -> None:
    cluster = _cluster_with_two_half_full_nodes()
    for i in range(3):
        cluster.arrive(PodSpec.build(f"wide-{i}", {"cpu": 4.0, "memory": 1 * GI}), 1.0)
    cluster.schedule(1.0)
    msg = cluster.rollup(1)
    cpu = {n.aggregate_resources["cpu"] for n in msg.needs}
    # 2 fillers × 5 + 3 wide × 4 = 22 cores, plus 4 for each of the three fragmented pods.
    assert cpu == {"34"}


def _best_effort(name: str) -> PodSpec:
    return PodSpec.build(name, {"cpu": 4.0, "memory": 16 * GI}, app_class=AppClass.BEST_EFFORT)


def _best_effort_cpu(msg: capacity_pb2.ClusterCapacityNeeds) -> float:
    return sum(float(n.aggregate_resources.get("cpu", "0")) for n in msg.needs if n.priority == 0)


def test_best_effort_pods_in_the_gap_are_not_asked_for() -> None:
    # One 16-core node, a 4-core batch pod on it: 12 cores of gap hold three 4-core
    # best-effort pods, so the roll-up asks for the batch pod alone.
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=True)
    cluster.add_node("n1", {"cpu": 16.0, "memory": 128 * GI}, {}, 0.0)
    cluster.arrive(PodSpec.build("batch", {"cpu": 4.0, "memory": 16 * GI}, priority=100_000), 0.0)
    for i in range(3):
        cluster.arrive(_best_effort(f"be-{i}"), 0.0)
    assert cluster.schedule(0.0) == 4
    assert _best_effort_cpu(cluster.rollup(1)) == 0.0


def test_a_full_gap_asks_for_its_best_effort_pods_whole() -> None:
    # As above, with two more best-effort pods: the gap is full (three borrow 12 of the
    # 12 cores), so the two cannot run. Asking for only those two (8 cores) against a
    # node the shard sees as 12 cores spare buys nothing, and they waited for as long as
    # the batch pod ran. Asked for whole — 5 × 4 = 20 cores beside the batch pod's 4 on
    # a 16-core node — the need is short by 8 cores, which a new node covers.
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=True)
    cluster.add_node("n1", {"cpu": 16.0, "memory": 128 * GI}, {}, 0.0)
    cluster.arrive(PodSpec.build("batch", {"cpu": 4.0, "memory": 16 * GI}, priority=100_000), 0.0)
    for i in range(5):
        cluster.arrive(_best_effort(f"be-{i}"), 0.0)
    assert cluster.schedule(0.0) == 4
    assert _best_effort_cpu(cluster.rollup(1)) == 20.0
    # Once a node holds them all, the borrowers are left out again.
    cluster.add_node("n2", {"cpu": 16.0, "memory": 128 * GI}, {}, 1.0)
    assert cluster.schedule(1.0) == 2
    assert _best_effort_cpu(cluster.rollup(2)) == 0.0
