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


RACK = "topology.kubernetes.io/rack"
_GPU_SERVER = {"cpu": 96.0, "memory": 1024 * GI, "nvidia.com/gpu": 8.0}


def _gang_pod(gang: str, member: int) -> PodSpec:
    return PodSpec.build(
        f"{gang}-{member}",
        {"cpu": 88.0, "memory": 900 * GI, "nvidia.com/gpu": 8.0},
        priority=900_000,
        colocation=gang,
        colocation_key=RACK,
    )


def _older_three_younger_two(cluster: ClusterModel) -> None:
    """Gang ``train-a`` of three arrives at 1 s, gang ``train-b`` of two at 2 s."""
    for gang, size, at in (("train-a", 3, 1.0), ("train-b", 2, 2.0)):
        for member in range(size):
            cluster.arrive(_gang_pod(gang, member), at)


def _gpu_cluster(racks: dict[str, int]) -> ClusterModel:
    """A cluster with ``racks[name]`` empty 8-GPU servers in each rack."""
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=False)
    for rack, servers in racks.items():
        for i in range(servers):
            cluster.add_node(f"{rack}-{i}", _GPU_SERVER, {RACK: rack}, 0.0)
    return cluster


def test_a_gang_no_rack_holds_whole_waits_whole_and_is_not_fragmented() -> None:
    # Three servers free, but two in one rack and one in the other: a gang of three
    # binds none of its pods (a pod-by-pod scheduler put two in r1 and pinned the gang).
    cluster = _gpu_cluster({"r1": 2, "r2": 1})
    for member in range(3):
        cluster.arrive(_gang_pod("train-a", member), 1.0)
    assert cluster.schedule(1.0) == 0
    assert cluster.pending_counts() == (3, 0)
    assert cluster.counters.gangs["train-a"] == [3, 0]
    # Nothing runs, so nothing pins the gang: its need asks for any one rack.
    (need,) = cluster.rollup(0).needs
    assert need.aggregate_resources["nvidia.com/gpu"] == "24"
    assert [(r.key, r.operator, list(r.values)) for r in need.requirements] == [
        (RACK, capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME, [])
    ]
    # Two more servers join r1: the gang lands there, whole, a pod on each of three.
    cluster.add_node("r1-2", _GPU_SERVER, {RACK: "r1"}, 2.0)
    cluster.add_node("r1-3", _GPU_SERVER, {RACK: "r1"}, 2.0)
    assert cluster.schedule(2.0) == 3
    nodes = {cluster.pods[f"train-a-{m}"].node for m in range(3)}
    assert len(nodes) == 3 and all(n.startswith("r1-") for n in nodes)
    assert sum(cluster.pods_on(n) for n in cluster.node_ids()) == 3
    # Each pod is on the books of its one node: they all leave, and every node is empty.
    for m in range(3):
        cluster.leave(f"train-a-{m}", 3.0)
    assert [cluster.pods_on(n) for n in cluster.node_ids()] == [0] * 5


def test_two_gangs_each_take_the_rack_that_holds_it() -> None:
    cluster = _gpu_cluster({"r1": 2, "r2": 3})
    _older_three_younger_two(cluster)
    assert cluster.schedule(2.0) == 5
    where = {
        gang: {cluster.pods[f"{gang}-{m}"].node.split("-")[0] for m in range(n)}
        for gang, n in (("train-a", 3), ("train-b", 2))
    }
    assert where == {"train-a": {"r2"}, "train-b": {"r1"}}
    assert [cluster.pods_on(n) for n in cluster.node_ids()] == [1] * 5


def test_a_running_gangs_evicted_pod_comes_back_alone_to_its_rack() -> None:
    cluster = _gpu_cluster({"r1": 2, "r2": 1})
    for member in range(2):
        cluster.arrive(_gang_pod("train-a", member), 1.0)
    assert cluster.schedule(1.0) == 2
    lost = cluster.pods["train-a-0"].node
    cluster.remove_node(lost, 5.0, reason="interrupt")
    # The other rack has a free server, but the gang runs in r1: the pod waits for r1.
    assert cluster.schedule(5.0) == 0
    cluster.add_node("r1-9", _GPU_SERVER, {RACK: "r1"}, 6.0)
    assert cluster.schedule(6.0) == 1
    assert cluster.pods["train-a-0"].node == "r1-9"


def test_a_younger_gang_does_not_take_the_rack_an_older_one_is_completed_in() -> None:
    # An older gang of three waits for r1, which has two servers and a third on its way;
    # a younger gang of two that the two servers would hold arrives. As coscheduling's
    # Permit stage does, the older gang's pods wait on the servers they were assumed on.
    cluster = _gpu_cluster({"r1": 2})
    _older_three_younger_two(cluster)
    assert cluster.schedule(2.0) == 0
    cluster.add_node("r1-2", _GPU_SERVER, {RACK: "r1"}, 3.0)
    assert cluster.schedule(3.0) == 3
    assert {cluster.pods[f"train-a-{m}"].node for m in range(3)} == {"r1-0", "r1-1", "r1-2"}
    assert all(not cluster.pods[f"train-b-{m}"].node for m in range(2))


def test_a_younger_gang_takes_a_rack_the_older_one_does_not_wait_on() -> None:
    # The older gang holds room in one rack only (the one where most of it fits): a
    # younger gang still runs in another.
    cluster = _gpu_cluster({"r1": 2, "r2": 2})
    _older_three_younger_two(cluster)
    assert cluster.schedule(2.0) == 2
    assert {cluster.pods[f"train-b-{m}"].node for m in range(2)} == {"r2-0", "r2-1"}
