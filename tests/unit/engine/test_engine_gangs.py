"""Gangs stay whole (issue 18 item 1, ADR 0126).

The wire has no gang field: each need with a Same requirement is one gang.
Two gangs of one cluster are never merged, each has its own machine
accounting (two gangs never count the same machines), and a gang is placed
in one domain or not at all.
"""

from __future__ import annotations

from collections import Counter

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState, Need, Reclaim, Rollup
from shard_engine.needs import validate_rollup
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine_ids, need, of_kind, rollup, same

EAGER = EngineConfig(
    reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
)


def gang(servers: int, *, priority: int = 900_000) -> Need:
    """A gang of ``servers`` 8-GPU servers in one rack."""
    return need(gpu=8.0 * servers, min_gpu=8, priority=priority, requirements=[same("rack")])


def gpu_racks(engine: ShardEngine, **racks: int) -> None:
    for rack, servers in racks.items():
        fleet(engine, servers, prefix=rack, cpu=64, gpu=8, labels={"rack": rack})


def servers_of_train_in_ra(engine: ShardEngine, servers: int) -> None:
    """``servers`` 8-GPU servers of rack ra, configured for cluster train."""
    fleet(
        engine,
        servers,
        prefix="ra",
        state=MachineState.CONFIGURED,
        cluster="train",
        cpu=64,
        gpu=8,
        labels={"rack": "ra"},
    )


def racks_of(engine: ShardEngine, cluster: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for m in engine.machines():
        if m.cluster == cluster and m.state == MachineState.CONFIGURED:
            out[m.labels["rack"]] += 1
    return out


def two_gangs(stamp: int, a: int, b: int) -> Rollup:
    return rollup("train", stamp, gang(a), gang(b))


def test_two_gangs_with_equal_keys_are_two_needs() -> None:
    merged, _ = validate_rollup(two_gangs(1, 4, 4))

    assert len(merged) == 2
    assert sorted(n.aggregate["nvidia.com/gpu"] for n in merged.values()) == [32.0, 32.0]


def test_needs_without_a_same_requirement_are_still_merged_by_key() -> None:
    merged, _ = validate_rollup(rollup("web", 1, need(cpu=4), need(cpu=6)))

    [only] = merged.values()
    assert only.aggregate["cpu"] == 10.0


def test_each_gang_goes_to_its_own_rack_when_no_rack_holds_both() -> None:
    engine = ShardEngine()
    gpu_racks(engine, ra=6, rb=6)
    apply(engine, two_gangs(1, 4, 4), now=0)

    Carrier(engine).run(now=1, cycles=2)

    assert sorted(racks_of(engine, "train").values()) == [4, 4]


def test_two_gangs_in_one_rack_count_their_own_machines() -> None:
    engine = ShardEngine()
    gpu_racks(engine, ra=16)
    apply(engine, rollup("train", 1, gang(4)), now=0)
    Carrier(engine).run(now=1, cycles=2)
    apply(engine, two_gangs(2, 4, 4), now=3)

    Carrier(engine).run(now=4, cycles=2)

    assert racks_of(engine, "train") == Counter(ra=8)


def test_a_gang_no_rack_can_hold_gets_nothing() -> None:
    engine = ShardEngine()
    gpu_racks(engine, ra=3, rb=3)
    apply(engine, rollup("train", 1, gang(4)), now=0)

    plans = Carrier(engine).run(now=1, cycles=3)

    assert [m for p in plans for m in machine_ids(p.actions)] == []
    assert racks_of(engine, "train") == Counter()


def test_one_gang_that_cannot_be_placed_does_not_hold_back_the_other() -> None:
    engine = ShardEngine()
    gpu_racks(engine, ra=5)
    apply(engine, two_gangs(1, 4, 6), now=0)

    Carrier(engine).run(now=1, cycles=3)

    assert racks_of(engine, "train") == Counter(ra=4)


def test_the_machines_of_two_gangs_in_one_rack_are_not_excess() -> None:
    engine = ShardEngine(EAGER)
    gpu_racks(engine, ra=16)
    carrier = Carrier(engine)
    apply(engine, two_gangs(1, 4, 4), now=0)
    carrier.run(now=1, cycles=3)
    assert racks_of(engine, "train") == Counter(ra=8)

    plans = carrier.run(now=10, cycles=5)

    assert [a for p in plans for a in of_kind(p, Reclaim)] == []
    assert racks_of(engine, "train") == Counter(ra=8)


def test_a_gang_no_rack_can_hold_reports_all_of_itself_short() -> None:
    # Rack ra holds 4 servers of the cluster, 2 of them claimed by gang a; gang b
    # (3 servers) fits in no rack of this shard. Its shortfall is 3 servers — a
    # whole rack's worth another shard can give in one profile — not the 1 that
    # ra's two unclaimed servers leave.
    engine = ShardEngine()
    servers_of_train_in_ra(engine, 4)
    apply(engine, two_gangs(1, 2, 3), now=0)

    plan = engine.cycle(now=1)

    [shortfall] = plan.shortfalls
    assert shortfall.deficit["nvidia.com/gpu"] == 24.0


def test_a_pinned_gang_asks_for_what_its_rack_lacks_not_its_whole_size() -> None:
    # Two pods of a gang of three run on ra's two servers of this shard; the cluster
    # pins the gang to ra (ADR 0158) and the shard has no other server there. Only ra
    # can take the third pod, so the gang is short of one server in ra: asking for three
    # (a whole rack's worth) could never be met by the servers other shards hold there.
    engine = ShardEngine()
    servers_of_train_in_ra(engine, 2)
    gpu_racks(engine, rb=4)  # a whole free rack elsewhere, where the pinned gang cannot go
    pinned = need(gpu=24.0, min_gpu=8, priority=900_000, requirements=[same("rack", "ra")])
    apply(engine, rollup("train", 1, pinned), now=0)

    plan = engine.cycle(now=1)

    assert machine_ids(plan.actions) == []
    [shortfall] = plan.shortfalls
    assert (shortfall.need_key, shortfall.deficit["nvidia.com/gpu"]) == (pinned.key, 8.0)


def test_a_rack_a_pinned_gang_runs_in_counts_for_it_not_for_the_gang_it_was_bought_for() -> None:
    # ra's two servers were bought for gang x (two servers). The cluster's scheduler
    # started an earlier gang p of three on them instead, and pins p to ra. x runs
    # nothing, so its bindings in ra are p's machines: p is short of one server in ra
    # (which a donor can add beside its pods), and x of its whole size (ADR 0160).
    # Read the other way, x looked served and p short of three for good.
    engine = ShardEngine()
    gpu_racks(engine, ra=2)
    x = gang(2)
    apply(engine, rollup("train", 1, x), now=0)
    Carrier(engine).run(now=1, cycles=2)
    assert racks_of(engine, "train") == Counter(ra=2)

    p = need(gpu=24.0, min_gpu=8, priority=900_000, requirements=[same("rack", "ra")])
    apply(engine, rollup("train", 2, x, p), now=30)
    plan = engine.cycle(now=31)

    short = {sf.need_key: sf.deficit["nvidia.com/gpu"] for sf in plan.shortfalls}
    [x_key, p_key] = [n.key for n in validate_rollup(rollup("train", 2, x, p))[0].values()]
    assert short == {p_key: 8.0, x_key: 16.0}


def test_a_gang_that_names_its_rack_once_its_pods_run_stays_the_same_need() -> None:
    # The cluster side pins a gang to the rack its first pods run in (ADR 0158). Were the
    # rack part of the gang's identity, the pinned gang would be a new need: its machines
    # would lose their binding, a second, unpinned gang of the cluster would claim them,
    # and the pinned one would look short of its whole size.
    assert (
        gang(3).key
        == need(gpu=24.0, min_gpu=8, priority=900_000, requirements=[same("rack", "ra")]).key
    )

    engine = ShardEngine(EAGER)
    carrier = Carrier(engine)
    gpu_racks(engine, ra=4, rb=3)
    apply(engine, rollup("train", 1, gang(3)), now=0)
    carrier.run(now=1, cycles=2)
    (rack,) = racks_of(engine, "train")
    placed = racks_of(engine, "train")[rack]
    assert placed == 3

    pinned = need(gpu=24.0, min_gpu=8, priority=900_000, requirements=[same("rack", rack)])
    apply(engine, rollup("train", 2, pinned, gang(3)), now=30)
    plans = carrier.run(now=31, cycles=3)

    # The pinned gang keeps its three machines; the new gang gets three of its own.
    assert not [a for p in plans for a in of_kind(p, Reclaim)]
    assert sum(racks_of(engine, "train").values()) == 6
    assert racks_of(engine, "train")[rack] >= 3
