"""The replay's end censors waits (ADR 0175): a pod it finds waiting is not a pod never placed.

A pod a cluster deletes before it ran was never placed. A pod the trace
still runs when the replay ends leaves then because the replay stops, not
because anyone gave up: all the run knows is that it has waited this long
so far. It is counted as waiting at the end. The waits of both enter the
time-to-capacity percentiles, as long as they had lasted (lower bounds):
every pod that arrived counts there.
"""

from __future__ import annotations

from clusters.packing import Heuristic
from clusters.pods import PodSpec
from shard_engine.model import Operator, Requirement
from simulator.cluster import ClusterModel
from simulator.driver import RunOptions, run_policy
from simulator.metrics import Recorder
from simulator.trace import Arrive, Leave, Trace

END = 1_000.0


def _arch(arch: str) -> Requirement:
    return Requirement("kubernetes.io/arch", Operator.IN, (arch,))


def _pod(name: str) -> PodSpec:
    return PodSpec.build(name, {"cpu": 4.0, "memory": 2.0**30}, priority=100)


def _summary() -> dict[str, float]:
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=True, ends_at=END)
    cluster.arrive(_pod("ran"), 0.0)
    cluster.add_node("n1", {"cpu": 4.0, "memory": 4 * 2.0**30}, {}, 30.0)
    assert cluster.schedule(30.0) == 1  # waited 30 s
    cluster.arrive(_pod("deleted"), 100.0)
    cluster.leave("deleted", 400.0)  # gone while the replay went on: never placed
    cluster.arrive(_pod("cut"), END - 900.0)
    cluster.leave("cut", END)  # the trace's end: waited 900 s so far
    cluster.arrive(_pod("outlives"), END - 60.0)  # no leave in the trace at all
    summary = Recorder(sample_s=60.0).summary(
        cost=0.0, clusters={"c": cluster}, stats={}, ended_at=END
    )
    tier: dict[str, float] = summary["time_to_capacity"]["p100"]
    return tier


def test_a_pod_the_end_finds_waiting_is_counted_apart_from_the_pods_never_placed() -> None:
    tier = _summary()
    assert (tier["placed"], tier["never_placed"], tier["waiting_at_end"]) == (1, 1, 2)


def test_every_pod_that_arrived_counts_in_the_percentiles() -> None:
    # Waits 30 (placed), 300 (deleted unplaced), 900 and 60 (cut off): the p99 is near
    # the longest, which a count of placed pods alone (30 s) would have left out.
    tier = _summary()
    assert tier["p50_s"] == 180.0  # between 60 and 300
    assert 880.0 < tier["p99_s"] <= 900.0


def test_a_run_counts_a_pod_arriving_just_before_its_end_as_waiting_there() -> None:
    """End to end, both policies: no machine comes up in the last 20 s of a replay."""
    # The late pod runs on arm64 only, the early one on amd64 only: the early pod's
    # machine cannot hold the late one, whatever shape it is.
    early = PodSpec.build("early", {"cpu": 4.0, "memory": 2.0**30}, requirements=(_arch("amd64"),))
    late = PodSpec.build("late", {"cpu": 4.0, "memory": 2.0**30}, requirements=(_arch("arm64"),))
    trace = Trace(
        events=(
            Arrive(0.0, "c", early),
            Arrive(580.0, "c", late),
            Leave(600.0, "c", early.name),
            Leave(600.0, "c", late.name),
        ),
        duration=600.0,
    )
    for policy in ("bigfleet", "baseline"):
        summary = run_policy(trace, policy, RunOptions(workers=1)).summary
        tiers = summary["time_to_capacity"]
        placed = sum(t["placed"] for t in tiers.values())
        never = sum(t["never_placed"] for t in tiers.values())
        waiting = sum(t["waiting_at_end"] for t in tiers.values())
        assert (placed, never, waiting) == (1, 0, 1), (policy, tiers)


def _gang_pod(name: str, gang: str) -> PodSpec:
    return PodSpec.build(
        name,
        {"cpu": 4.0, "memory": 2.0**30},
        priority=100,
        colocation=gang,
        colocation_key="topology.kubernetes.io/zone",
    )


def test_a_gang_records_how_long_it_took_or_how_long_the_end_found_it_waiting() -> None:
    """ADR 0182: a gang placed whole took its first arrival to its last first placement."""
    cluster = ClusterModel("c", heuristic=Heuristic.DOT_PRODUCT, gap=True, ends_at=END)
    cluster.arrive(_gang_pod("a-0", "a"), 100.0)
    cluster.arrive(_gang_pod("a-1", "a"), 110.0)
    zone = {"topology.kubernetes.io/zone": "z1"}
    cluster.add_node("n1", {"cpu": 4.0, "memory": 4 * 2.0**30}, zone, 150.0)
    assert cluster.schedule(150.0) == 0  # a gang runs whole or not at all
    cluster.add_node("n2", {"cpu": 4.0, "memory": 4 * 2.0**30}, zone, 190.0)
    assert cluster.schedule(190.0) == 2
    cluster.arrive(_gang_pod("b-0", "b"), END - 80.0)
    cluster.arrive(_gang_pod("b-1", "b"), END - 80.0)
    cluster.leave("b-0", END)
    cluster.leave("b-1", END)
    cluster.arrive(_gang_pod("c-0", "c"), 200.0)
    cluster.leave("c-0", 500.0)  # deleted unplaced: a miss, not cut off
    summary = Recorder(sample_s=60.0).summary(
        cost=0.0, clusters={"c": cluster}, stats={}, ended_at=END
    )
    gangs = summary["gangs"]
    assert gangs["whole"] == ["c/a"]
    assert gangs["whole_s"] == {"c/a": 90.0}
    assert gangs["cut_off_s"] == {"c/b": 80.0}
