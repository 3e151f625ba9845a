"""Bindings: a machine counts first for the need it was placed for (ADR 0152).

Each case is small enough to work out on paper: 4-core machines, needs in
cores. The case that claims alone (least contested first, without
bindings) get wrong is ADR 0128's, kept as the explicit example of
``test_engine_properties.py::test_with_nothing_configured_a_second_cycle_issues_no_action``:
a need with a spread claims machines bought for the need pinned to a zone.
"""

from __future__ import annotations

import random
from functools import partial

import numpy as np

from bench.cycle import advance, build
from shard_engine.binding import Bindings
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState, Need, Operator, Requirement
from shard_engine.phase1 import memo_key
from shard_engine.worksheet import Worksheet
from tests.rollups import apply
from tests.unit.engine.engine_fleet import Carrier, fleet, machine_ids, need, rollup
from tests.unit.engine.plan_history import SEEDS, History

ZONE = "topology.kubernetes.io/zone"
IN_A = Requirement(ZONE, Operator.IN, ("zone-a",))


def nested() -> ShardEngine:
    """c1 holds 3 machines in zone-b and 2 in zone-a; free slots in both zones.

    "12 cores anywhere" comes first in cycle order (higher priority), then
    "8 cores in zone-a". Exactly covered if the broad need takes zone-b.
    """
    engine = ShardEngine()
    fleet(engine, 3, prefix="b", zone="zone-b", state=MachineState.CONFIGURED, cluster="c1")
    fleet(engine, 2, prefix="a", zone="zone-a", state=MachineState.CONFIGURED, cluster="c1")
    fleet(engine, 4, prefix="spec-a", zone="zone-a", state=MachineState.SPECULATIVE)
    fleet(engine, 4, prefix="spec-b", zone="zone-b", state=MachineState.SPECULATIVE)
    anywhere = need(cpu=12, priority=2000)
    in_a = need(cpu=8, priority=1000, requirements=[IN_A])
    apply(engine, rollup("c1", 1, anywhere, in_a), now=0)
    return engine


def test_a_broad_need_takes_what_a_narrow_need_cannot_use_first() -> None:
    assert nested().cycle(now=1).actions == ()


def test_what_was_bought_for_a_need_stays_its_own_the_next_cycle() -> None:
    engine = ShardEngine()
    fleet(engine, 4, prefix="spec-a", zone="zone-a", state=MachineState.SPECULATIVE)
    anywhere = need(cpu=8, priority=2000)
    in_a = need(cpu=8, priority=1000, requirements=[IN_A])
    apply(engine, rollup("c1", 1, anywhere, in_a), now=0)
    carrier = Carrier(engine)

    first = carrier.run(now=1)[0]

    assert len(machine_ids(first.actions)) == 4  # 16 cores, all in zone-a
    bound = sorted(engine.placed_for(m) for m in machine_ids(first.actions))
    assert bound == sorted([anywhere.key] * 2 + [in_a.key] * 2)
    assert [plan.actions for plan in carrier.run(now=2, cycles=3)] == [(), (), ()]


def test_a_restarted_engine_reads_the_binding_back_from_the_attribution() -> None:
    """The same cluster as ``nested`` but the zone-b machines bound to the zone-a need's
    key would be nonsense; bound to the broad need they decide as before a restart."""
    engine = ShardEngine()
    anywhere = need(cpu=12, priority=2000)
    in_a = need(cpu=8, priority=1000, requirements=[IN_A])
    from tests.unit.engine.engine_fleet import machine

    for i in range(3):
        engine.upsert_machine(
            machine(f"b-{i}", zone="zone-b", state=MachineState.CONFIGURED, cluster="c1"),
            now=0,
            need_key=anywhere.key,
        )
    for i in range(2):
        engine.upsert_machine(
            machine(f"a-{i}", zone="zone-a", state=MachineState.CONFIGURED, cluster="c1"),
            now=0,
            need_key=in_a.key,
        )
    fleet(engine, 4, prefix="spec-a", zone="zone-a", state=MachineState.SPECULATIVE)
    apply(engine, rollup("c1", 1, anywhere, in_a), now=0)

    assert engine.placed_for("b-0") == anywhere.key
    assert engine.placed_for("a-1") == in_a.key
    assert engine.placed_for("spec-a-0000") == ""
    assert engine.cycle(now=1).actions == ()


BATCH = need(cpu=16, priority=100_000)
PRODUCTION = need(cpu=8, priority=1_000_000)
SPEC = [f"spec-{i:04d}" for i in range(4)]


def batch_on_four_machines() -> tuple[ShardEngine, Carrier, Need]:
    """Cluster "tiers": batch (16 cores) placed on all four 4-core machines there are."""
    engine = ShardEngine()
    fleet(engine, 4, prefix="spec", state=MachineState.SPECULATIVE)
    apply(engine, rollup("tiers", 1, BATCH), now=0)
    carrier = Carrier(engine)
    carrier.run(now=1)
    return engine, carrier, BATCH


def test_a_higher_priority_need_short_takes_over_a_lower_ones_machines_once() -> None:
    """Production (8 cores) arrives where batch holds all 4 machines (16 cores).

    Production is counted first, so batch is the one short by 8 cores: 2
    machines are bought for it. From then on production owns the 2 machines
    it took over, batch owns its 2 old and 2 new ones: nothing more is bought.
    """
    engine, carrier, batch = batch_on_four_machines()
    fleet(engine, 4, prefix="more", state=MachineState.SPECULATIVE)
    production = PRODUCTION
    apply(engine, rollup("tiers", 2, batch, production), now=2)

    [bought] = carrier.run(now=3)

    assert len(machine_ids(bought.actions)) == 2
    assert {a.need_key for a in bought.actions} == {batch.key}  # type: ignore[union-attr]
    # The two machines production took over are rebound to it at commit.
    assert sorted(engine.placed_for(m) for m in SPEC) == sorted(
        [batch.key] * 2 + [production.key] * 2
    )
    assert [plan.actions for plan in carrier.run(now=4, cycles=3)] == [(), (), ()]


def test_a_takeover_is_read_back_after_the_roll_up_changes_and_nothing_else_did() -> None:
    """Batch holds all 4 machines (16 cores) when production (8) arrives, with nothing to buy.

    Production takes over 2 of batch's machines (rebound at commit; batch is
    short and waits). Then batch shrinks to 12 cores while no machine moves:
    production already owns its 2 machines and batch its other 2, so nothing
    moves again. Read from the bindings as they were before the takeover
    (remembered under the cluster's unchanged inventory), production
    looked short once more and took a third machine it does not need.
    """
    engine, carrier, batch = batch_on_four_machines()
    production = PRODUCTION
    apply(engine, rollup("tiers", 2, batch, production), now=2)
    carrier.run(now=3)
    taken_over = sorted(engine.placed_for(m) for m in SPEC)
    assert taken_over == sorted([batch.key] * 2 + [production.key] * 2)

    smaller = need(cpu=12, priority=100_000)
    assert smaller.key == batch.key
    apply(engine, rollup("tiers", 3, smaller, production), now=4)
    carrier.run(now=5, cycles=3)

    assert sorted(engine.placed_for(m) for m in SPEC) == taken_over


def test_what_a_cluster_holds_is_read_again_after_a_takeover_moved_no_machine() -> None:
    """A takeover rebinds machines at commit and moves none: the cluster's inventory
    version stays, its bindings version does not, and every result remembered from
    its claims (what each need has, which are short, Phase 3's quiet clusters) is
    keyed by both, so none is read back from before the takeover."""
    engine, carrier, batch = batch_on_four_machines()
    production = PRODUCTION
    apply(engine, rollup("tiers", 2, batch, production), now=2)
    cluster = engine._clusters.index_of("tiers")
    entry = engine._table.entry(cluster)
    assert entry is not None
    sheet = Worksheet(engine._inventory, 3.0, bindings=engine._bindings)
    before = memo_key(sheet, engine._table.demand(entry))
    inventory_before = engine._inventory.version(cluster)

    carrier.run(now=3)  # production takes over 2 of batch's machines; nothing is bought

    assert engine._inventory.version(cluster) == inventory_before
    assert sorted(engine.placed_for(m) for m in SPEC) == sorted(
        [batch.key] * 2 + [production.key] * 2
    )
    assert memo_key(sheet, engine._table.demand(entry)) != before


def test_a_takeover_with_the_lower_needs_spare_machines_happens_once() -> None:
    """Batch (12 cores, priority 100,000) holds 5 bound 4-core machines (20 cores) when
    production (12 cores) arrives, with nothing to buy.

    On paper: batch claims the 3 machines it wants of its own; its other 2 are
    anyone's and production takes them (8 cores), then takes 1 machine over
    from batch for its last 4 cores. Batch is short 4 cores and waits.
    Rebinding only the machine taken over would leave batch 4 bound machines,
    of which it still claims 3: the takeover would come back every cycle with
    one more machine rebound until batch held no spare (3 cycles here, ADR
    0152). The 2 spare machines production used move with it: 3 machines are
    production's after the first commit, and nothing moves after that.
    """
    from tests.unit.engine.engine_fleet import machine

    engine = ShardEngine()
    batch = need(cpu=12, priority=100_000)
    production = need(cpu=12, priority=1_000_000)
    ids = [f"b-{i}" for i in range(5)]
    for machine_id in ids:
        engine.upsert_machine(
            machine(machine_id, state=MachineState.CONFIGURED, cluster="tiers"),
            now=0,
            need_key=batch.key,
        )
    apply(engine, rollup("tiers", 1, batch, production), now=0)
    carrier = Carrier(engine)

    first = carrier.run(now=1)
    bound = [engine.placed_for(m) for m in ids]
    later = carrier.run(now=2, cycles=3)

    assert sorted(bound) == sorted([production.key] * 3 + [batch.key] * 2)
    assert [engine.placed_for(m) for m in ids] == bound
    for plan in first + later:
        assert plan.actions == ()
        [short] = plan.shortfalls
        assert short.need_key == batch.key
        assert short.deficit == {"cpu": 4.0}


def _note(seen: list[int], rows: np.ndarray) -> None:
    seen.extend(rows.tolist())


def test_binding_a_plans_segments_at_once_is_binding_them_one_by_one() -> None:
    """``bind_all`` (a commit's placements) leaves every row, change count and
    notice as one ``bind`` per segment would, including segments that bind
    nothing (no need key, no cluster), which then fall back to one by one."""
    segments = [
        (np.array([3, 9, 4], dtype=np.int64), 0, "web"),
        (np.array([], dtype=np.int64), 1, "db"),
        (np.array([12, 2], dtype=np.int64), 1, "db"),
        (np.array([7], dtype=np.int64), 0, "batch"),
    ]
    for extra in ([], [(np.array([9], dtype=np.int64), -1, "")]):
        told: tuple[list[int], list[int]] = ([], [])
        one = Bindings(on_change=partial(_note, told[0]))
        many = Bindings(on_change=partial(_note, told[1]))
        for bindings in (one, many):
            bindings.bind([4, 12], 0, "batch")  # rows already bound elsewhere change too
        before = [one.version(c) for c in (0, 1, 2)]
        for rows, cluster, key in [*segments, *extra]:
            one.bind(rows, cluster, key)
        many.bind_all([*segments, *extra])

        assert many.codes.tolist() == one.codes.tolist()[: len(many.codes)]
        assert [many.need_of(r) for r in range(14)] == [one.need_of(r) for r in range(14)]
        # A version says whether anything changed, not how many times.
        changed = [one.version(c) > v for c, v in zip((0, 1, 2), before, strict=True)]
        assert [many.version(c) > v for c, v in zip((0, 1, 2), before, strict=True)] == changed
        assert changed == [True, True, False]
        assert sorted(told[1]) == sorted(told[0])
    assert many.need_of(9) is None and one.need_of(3) == (0, "web")


def _checked(engine: ShardEngine, asked: list[int]) -> None:
    """Make ``engine``'s commit answer ``holds`` both ways and insist they agree."""
    placed = engine._holds_placed

    def both(rows: np.ndarray, clusters: np.ndarray) -> np.ndarray:
        shortcut = placed(rows, clusters)
        assert shortcut.tolist() == engine._holds(rows, clusters).tolist()
        asked.append(len(rows))
        return shortcut

    engine._holds_placed = both  # type: ignore[method-assign]


def test_a_commit_asks_about_the_machines_it_placed_as_anyone_would() -> None:
    """The commit's shortcut (``ShardEngine._holds_placed``) answers what ``_holds`` answers
    for every machine it binds away from another cluster, over every seeded plan history
    (``plan_history``), which place such machines dozens of times."""
    asked: list[int] = []
    for seed in SEEDS:
        history = History(seed)
        _checked(history.engine, asked)
        history.run()
    assert sum(asked) > 20


def test_the_burst_world_asks_the_same_with_and_without_the_shortcut() -> None:
    """The bench's burst world (thousands of placements a cycle, idle machines reassigned
    across clusters) agrees too, cycle after cycle."""
    world = build(
        machines=20_000, clusters=12, needs_per_cluster=8, types=8, zones=3, racks=4, seed=3
    )
    asked: list[int] = []
    _checked(world.engine, asked)
    rng = random.Random(4)
    plan = None
    for _ in range(15):
        advance(world, rng, plan, pending=0.18, excess=0.18, grow=40)
        plan = world.engine.cycle(now=world.now)
    assert sum(asked) > 0
