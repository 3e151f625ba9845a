"""The cluster model: fragmentation is counted for every pod it strands, and asked for."""

from __future__ import annotations

from clusters.packing import Heuristic
from clusters.pods import PodSpec
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
