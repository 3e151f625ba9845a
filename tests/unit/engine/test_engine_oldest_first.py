"""Oldest first, fleet-wide (ADR 0176).

A shard's idle machine goes to the need that has waited longest for it,
whichever shard that need is in: a need leaves its shard's idle machines to
a shortfall of another shard that could use them when that shortfall is of
a higher priority, or of the same priority and older. It yields for at most
``fleet_idle_wait_seconds``; the coordinator's idle step moves the machines
meanwhile.

The trace these come from (the scarce fleet, seed 5): a cluster released
two empty GPU servers of one rack, and its own shard gave them to the
cluster's gang that had arrived a minute before, while a gang of two of
another shard's cluster, of the same priority, had waited for such a pair
for 37 minutes. It never ran.
"""

from __future__ import annotations

from shard_engine.config import EngineConfig
from shard_engine.coordination import (
    RemoteIdle,
    RemoteWant,
    ShardShortfall,
    ShardView,
    fleet_wants,
)
from shard_engine.engine import ShardEngine
from shard_engine.model import AssignIdle, MachineState, Need, Preempt, Provision
from shard_engine.shortfalls import reported_requirements
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, need, of_kind, rollup, same, spread_over

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
PRIORITY = 900_000


def shard(*, idle_racks: dict[str, int], slots: int = 0, wait: float = 60.0) -> ShardEngine:
    """A shard with idle 8-GPU servers per rack, and ``slots`` unclaimed ones in rack r9."""
    engine = ShardEngine(EngineConfig(fleet_idle_wait_seconds=wait))
    for rack, count in idle_racks.items():
        fleet(engine, count, prefix=f"idle-{rack}", gpu=8.0, cpu=96.0, labels={RACK: rack})
    if slots:
        fleet(
            engine,
            slots,
            prefix="slot-r9",
            state=MachineState.SPECULATIVE,
            gpu=8.0,
            cpu=96.0,
            labels={RACK: "r9"},
        )
    return engine


def gang_of(servers: int, *, priority: int = PRIORITY) -> Need:
    """A gang of ``servers`` 8-GPU pods in one rack."""
    return need(
        cpu=96.0 * servers,
        memory=0.0,
        gpu=8.0 * servers,
        priority=priority,
        requirements=[same(RACK)],
    )


def want(servers: int, *, age: int, priority: int = PRIORITY, rack: str = "") -> RemoteWant:
    """Another shard's gang of ``servers`` servers, short for ``age`` cycles."""
    return RemoteWant(
        shard_id="other",
        priority=priority,
        requirements=(same(RACK, *((rack,) if rack else ())),),
        deficit={"nvidia.com/gpu": 8.0 * servers, "cpu": 96.0 * servers},
        min_unit={},
        age_cycles=age,
    )


def assigned(engine: ShardEngine, now: float) -> list[str]:
    return [a.machine_id for a in of_kind(engine.cycle(now=now), AssignIdle)]


def test_a_new_gang_leaves_a_rack_of_idle_servers_to_an_older_gang_of_another_shard() -> None:
    engine = shard(idle_racks={"r1": 2})
    engine.set_fleet_idle([], [want(2, age=220)])
    apply(engine, rollup("young", 1, gang_of(2)), now=0)

    plan = engine.cycle(now=10)

    assert of_kind(plan, AssignIdle) == []
    [shortfall] = plan.shortfalls
    assert shortfall.cluster_id == "young"


def test_without_the_older_want_the_gang_takes_its_shards_idle_servers() -> None:
    engine = shard(idle_racks={"r1": 2})
    apply(engine, rollup("young", 1, gang_of(2)), now=0)

    assert len(assigned(engine, 10)) == 2


def test_a_want_that_is_younger_lower_or_unable_to_use_them_is_not_yielded_to() -> None:
    cases = {
        "younger": want(2, age=0),
        "lower priority": want(2, age=220, priority=PRIORITY - 1),
        "a rack of three": want(3, age=220),
        "pinned to another rack": want(2, age=220, rack="r7"),
    }
    for case, other in cases.items():
        engine = shard(idle_racks={"r1": 2})
        engine.set_fleet_idle([], [other])
        apply(engine, rollup("young", 1, gang_of(2)), now=0)
        assert len(assigned(engine, 10)) == 2, case


def test_a_want_of_higher_priority_is_yielded_to_however_young() -> None:
    engine = shard(idle_racks={"r1": 2})
    engine.set_fleet_idle([], [want(2, age=0, priority=PRIORITY + 1)])
    apply(engine, rollup("young", 1, gang_of(2)), now=0)

    assert assigned(engine, 10) == []


def test_a_need_yields_for_at_most_the_wait_then_takes_the_servers() -> None:
    engine = shard(idle_racks={"r1": 2}, wait=60.0)
    engine.set_fleet_idle([], [want(2, age=220)])
    apply(engine, rollup("young", 1, gang_of(2)), now=0)

    assert assigned(engine, 10) == []
    assert assigned(engine, 60) == []
    # 60 s after it first yielded the transfer has not come: the want could not use them.
    assert len(assigned(engine, 70)) == 2


def test_a_need_that_yields_its_idle_servers_may_still_buy_new_ones() -> None:
    # Idle first stays idle first: the yielding gang takes unclaimed slots of its own
    # shard, and the idle pair goes to the older gang.
    engine = shard(idle_racks={"r1": 2}, slots=4)
    engine.set_fleet_idle([], [want(2, age=220)])
    apply(engine, rollup("young", 1, gang_of(2)), now=0)

    plan = engine.cycle(now=10)

    assert of_kind(plan, AssignIdle) == []
    assert sum(len(p.machine_ids) for p in of_kind(plan, Provision)) == 2


def test_the_fleet_wants_a_shard_is_told_are_the_other_shards_shortfalls() -> None:
    short = ShardShortfall("c", "k", PRIORITY, {"nvidia.com/gpu": 16.0}, age_cycles=5)
    empty = ShardShortfall("c", "met", PRIORITY, {"nvidia.com/gpu": 0.0})
    views = {
        "a": ShardView("a", total_machines=1, shortfalls=(short, empty)),
        "b": ShardView("b", total_machines=1),
    }

    wants = fleet_wants(views)

    assert wants["a"] == ()
    [only] = wants["b"]
    assert (only.shard_id, only.priority, only.age_cycles) == ("a", PRIORITY, 5)
    assert dict(only.deficit) == {"nvidia.com/gpu": 16.0}
    assert fleet_wants(views, receivers=["c"]) == {"c": (only,)}


def holding(engine: ShardEngine, servers: int, rack: str, *, cluster: str = "c") -> None:
    """``servers`` empty 8-GPU servers of ``rack``, configured for ``cluster``."""
    fleet(
        engine,
        servers,
        prefix=f"{cluster}-{rack}",
        state=MachineState.CONFIGURED,
        gpu=8.0,
        cpu=96.0,
        labels={RACK: rack},
        cluster=cluster,
    )


def excess_shard() -> ShardEngine:
    """A shard whose cluster ``done`` holds two servers of rack r1 it no longer needs."""
    engine = ShardEngine(EngineConfig())
    holding(engine, 2, "r1", cluster="done")
    apply(engine, rollup("done", 1), now=0)  # its gang has left: no need in force
    return engine


def test_a_new_gang_leaves_a_clusters_excess_servers_to_an_older_gang_of_another_shard() -> None:
    # ADR 0177: Phase 2 takes a cluster's excess for any need of its shard; an older want
    # of another shard gets them first, through the coordinator's cross-shard preemption.
    engine = excess_shard()
    engine.set_fleet_idle([], [want(2, age=220)])
    apply(engine, rollup("young", 2, gang_of(2)), now=0)

    assert of_kind(engine.cycle(now=10), Preempt) == []


def test_without_the_older_want_the_gang_preempts_the_excess_servers() -> None:
    engine = excess_shard()
    apply(engine, rollup("young", 2, gang_of(2)), now=0)

    assert len(of_kind(engine.cycle(now=10), Preempt)) == 2


def test_a_spread_need_leaves_its_shards_idle_machines_to_an_older_want_too() -> None:
    # A spread need takes idle and new machines in one water-fill; when it yields, the
    # fill draws on new machines only (here there are none: it takes nothing).
    def spread_shard() -> ShardEngine:
        engine = ShardEngine(EngineConfig())
        for zone in ("zone-a", "zone-b"):
            fleet(engine, 1, prefix=f"idle-{zone}", zone=zone)
        apply(engine, rollup("web", 1, need(cpu=8.0, spread=[spread_over(ZONE)])), now=0)
        return engine

    older = RemoteWant(
        shard_id="other",
        priority=1000,
        requirements=(),
        deficit={"cpu": 4.0},
        min_unit={},
        age_cycles=50,
    )
    yielding = spread_shard()
    yielding.set_fleet_idle([], [older])
    taking = spread_shard()

    assert assigned(yielding, 10) == []
    assert sorted(assigned(taking, 10)) == ["idle-zone-a-0000", "idle-zone-b-0000"]


# -- a gang that holds part of a rack asks for what the rack lacks (ADR 0180) ---------------
#
# Traced on the `mixed` day (one day, seed 3): a gang of four arrived in a cluster that held
# three empty servers of rack b-r03, freed by its previous gang; another shard held idle
# servers of the same rack. A gang that runs nothing asked the coordinator for a whole rack
# of four, which no shard held idle, and waited 9,591 s.


def idle_elsewhere(rack: str, count: int = 1) -> RemoteIdle:
    """``count`` idle 8-GPU servers of ``rack`` that another shard holds."""
    return RemoteIdle(
        shard_id="other",
        labels={RACK: rack},
        allocatable={"nvidia.com/gpu": 8.0, "cpu": 96.0},
        count=count,
    )


def test_a_gang_holding_three_of_its_four_servers_in_a_rack_asks_for_one_there() -> None:
    engine = shard(idle_racks={})
    holding(engine, 3, "b-r03")
    engine.set_fleet_idle([idle_elsewhere("b-r03")])
    apply(engine, rollup("c", 1, gang_of(4)), now=0)

    [shortfall] = engine.cycle(now=10).shortfalls

    assert shortfall.domain == "b-r03"
    assert shortfall.deficit == {"nvidia.com/gpu": 8.0, "cpu": 96.0}
    [need] = engine.needs_of("c")
    assert reported_requirements(need.requirements, shortfall.domain) == (same(RACK, "b-r03"),)


def test_a_gang_asks_for_a_whole_rack_when_it_holds_less_than_half_or_none_is_idle() -> None:
    cases = {
        "one of four held": (1, [idle_elsewhere("b-r03", 3)]),
        "nothing idle in its rack": (3, [idle_elsewhere("a-r04", 4)]),
        "nothing idle anywhere": (3, []),
    }
    for case, (held, offers) in cases.items():
        engine = shard(idle_racks={})
        holding(engine, held, "b-r03")
        engine.set_fleet_idle(offers)
        apply(engine, rollup("c", 1, gang_of(4)), now=0)

        [shortfall] = engine.cycle(now=10).shortfalls

        assert shortfall.domain == "", case
        assert shortfall.deficit == {"nvidia.com/gpu": 32.0, "cpu": 384.0}, case


def test_machines_in_two_racks_do_not_cover_a_gang_none_of_them_holds() -> None:
    # The trace's cluster held three empty servers of b-r03 and two of a-r04: five for a
    # gang of four, counted as covering it, so the gang was never short and waited.
    engine = shard(idle_racks={})
    holding(engine, 3, "b-r03")
    holding(engine, 2, "a-r04")
    apply(engine, rollup("c", 1, gang_of(4)), now=0)

    [shortfall] = engine.cycle(now=10).shortfalls

    assert shortfall.cluster_id == "c"
    assert shortfall.deficit["nvidia.com/gpu"] == 32.0


def test_the_named_rack_lets_another_shard_yield_its_idle_server_there() -> None:
    # The other side: a shard with one idle server of b-r03 and a new gang of its own
    # leaves the server to the older want, which names b-r03; a whole-rack want of four
    # it could not use, and it took the server (the trace's 23,150 s).
    engine = shard(idle_racks={"b-r03": 1})
    named = RemoteWant(
        shard_id="other",
        priority=PRIORITY,
        requirements=(same(RACK, "b-r03"),),
        deficit={"nvidia.com/gpu": 8.0, "cpu": 96.0},
        min_unit={},
        age_cycles=50,
    )
    engine.set_fleet_idle([], [named])
    apply(engine, rollup("young", 1, gang_of(1)), now=0)
    assert assigned(engine, 10) == []

    engine = shard(idle_racks={"b-r03": 1})
    engine.set_fleet_idle([], [want(4, age=50)])
    apply(engine, rollup("young", 1, gang_of(1)), now=0)
    assert len(assigned(engine, 10)) == 1
