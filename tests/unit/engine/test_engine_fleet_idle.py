"""Idle first, fleet-wide (issue 18 item 3, ADR 0129).

A shard told that another shard holds a matching idle machine does not
create one: the need waits for the coordinator's idle transfer, reported as
a shortfall, for at most ``fleet_idle_wait_seconds``, then buys as before.
A gang that holds none of its machines waits too, for one rack held whole
(ADR 0172), or for a rack whose idle machines and unclaimed slots elsewhere
complete it with fewer claims than any rack of its own (ADR 0173).
"""

from __future__ import annotations

from shard_engine.config import EngineConfig
from shard_engine.coordination import ProfileSupply, ShardShortfall, ShardView, plan_transfers
from shard_engine.engine import ShardEngine
from shard_engine.fleet_idle import RemoteIdle
from shard_engine.model import AssignIdle, MachineState, Provision
from tests.rollups import apply
from tests.unit.engine.engine_fleet import GI, fleet, need, of_kind, rollup, same, zone_in

LABELS = {"topology.kubernetes.io/zone": "zone-a", "rack": "r1"}
ALLOC = {"cpu": 4.0, "memory": 16 * GI}


def shard_b(wait: float = 60.0) -> ShardEngine:
    engine = ShardEngine(EngineConfig(fleet_idle_wait_seconds=wait))
    fleet(engine, 4, prefix="b-spec", state=MachineState.SPECULATIVE, labels=LABELS)
    return engine


def offer(count: int = 1, rack: str = "r1", slots: int = 0) -> RemoteIdle:
    return RemoteIdle(
        shard_id="a",
        labels={**LABELS, "rack": rack},
        allocatable=ALLOC,
        count=count,
        speculative=slots,
    )


def gang(engine: ShardEngine, cpu: float) -> None:
    """Cluster ``train`` asks for ``cpu`` cores' worth of 4-core machines in one rack."""
    apply(engine, rollup("train", 1, need(cpu=cpu, requirements=[same("rack")])), now=0)


def test_a_need_another_shards_idle_machine_fits_waits_for_it_and_reports_it() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer()])
    apply(engine, rollup("web", 1, need(cpu=4)), now=0)

    plan = engine.cycle(now=1)

    assert of_kind(plan, Provision) == []
    [shortfall] = plan.shortfalls
    assert shortfall.cluster_id == "web"
    assert engine.why_not("web")[shortfall.need_key].startswith("awaiting another shard")


def test_the_coordinator_answers_the_wait_with_an_idle_transfer() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer()])
    apply(engine, rollup("web", 1, need(cpu=4)), now=0)
    plan = engine.cycle(now=1)
    donor = ShardView(
        "a",
        total_machines=10,
        supply=(ProfileSupply("sim", "m.xlarge", "zone-a", 0, LABELS, ALLOC, idle=1),),
    )
    reported = tuple(
        ShardShortfall(s.cluster_id, s.need_key, s.priority, dict(s.deficit))
        for s in plan.shortfalls
    )
    receiver = ShardView("b", total_machines=4, shortfalls=reported)

    [instruction] = plan_transfers({"a": donor, "b": receiver})

    assert (instruction.kind, instruction.donor, instruction.receiver) == ("idle", "a", "b")
    assert instruction.count == 1


def test_after_the_wait_the_need_buys_as_before() -> None:
    engine = shard_b(wait=30)
    engine.set_fleet_idle([offer()])
    apply(engine, rollup("web", 1, need(cpu=4)), now=0)

    waited = [len(of_kind(engine.cycle(now=t), Provision)) for t in (1, 11, 21)]
    bought = engine.cycle(now=31)

    assert waited == [0, 0, 0]
    assert len(of_kind(bought, Provision)) == 1


def test_without_the_fleet_index_or_with_nothing_that_fits_the_shard_buys_at_once() -> None:
    lone = shard_b()
    apply(lone, rollup("web", 1, need(cpu=4)), now=0)
    other_zone = shard_b()
    other_zone.set_fleet_idle(
        [RemoteIdle("a", {"topology.kubernetes.io/zone": "zone-b"}, ALLOC, 3)]
    )
    apply(other_zone, rollup("web", 1, need(cpu=4, requirements=[zone_in("zone-a")])), now=0)

    assert len(of_kind(lone.cycle(now=1), Provision)) == 1
    assert len(of_kind(other_zone.cycle(now=1), Provision)) == 1


def test_one_idle_machine_elsewhere_holds_back_only_what_it_can_serve() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(1)])
    apply(engine, rollup("web", 1, need(cpu=4)), now=0)
    apply(engine, rollup("api", 1, need(cpu=4)), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Provision)) == 1  # one waits for the remote machine, one buys


def test_a_gang_waits_for_a_rack_another_shard_holds_idle_whole() -> None:
    # Two 4-core machines' worth, one rack: four idle in r1 elsewhere hold it whole.
    engine = shard_b()
    engine.set_fleet_idle([offer(4)])
    gang(engine, cpu=8)

    plan = engine.cycle(now=1)

    assert of_kind(plan, Provision) == []
    [shortfall] = plan.shortfalls
    assert engine.why_not("train")[shortfall.need_key].startswith("awaiting another shard")


def test_a_gang_does_not_wait_for_machines_of_two_racks() -> None:
    # One idle machine in r1 and one in r2: together enough, but not in one rack.
    engine = shard_b()
    engine.set_fleet_idle([offer(1), offer(1, rack="r2")])
    gang(engine, cpu=8)

    assert len(of_kind(engine.cycle(now=1), Provision)) == 1


def test_a_gang_that_runs_in_a_rack_grows_there_instead_of_waiting() -> None:
    # The gang holds one machine of r1 here; it can only be completed in r1.
    engine = shard_b()
    fleet(engine, 1, prefix="b-run", state=MachineState.CONFIGURED, cluster="train", labels=LABELS)
    engine.set_fleet_idle([offer(4, rack="r2")])
    gang(engine, cpu=8)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Provision)) == 1
    assert plan.shortfalls == ()


def test_the_coordinator_answers_a_gangs_wait_with_one_rack() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(4)])
    gang(engine, cpu=8)
    plan = engine.cycle(now=1)
    donor = ShardView(
        "a",
        total_machines=100,
        supply=(
            ProfileSupply("sim", "m.xlarge", "zone-a", 0, LABELS, ALLOC, idle=4, domain="r1"),
            ProfileSupply(
                "sim", "m.xlarge", "zone-a", 0, {**LABELS, "rack": "r2"}, ALLOC, idle=1, domain="r2"
            ),
        ),
    )
    # The shard reports the need's requirements with its shortfall (the roll-up's need).
    reported = tuple(
        ShardShortfall(s.cluster_id, s.need_key, s.priority, dict(s.deficit), (same("rack"),))
        for s in plan.shortfalls
    )
    receiver = ShardView("b", total_machines=4, shortfalls=reported)

    [instruction] = plan_transfers({"a": donor, "b": receiver})

    assert (instruction.kind, instruction.domain, instruction.count) == ("idle", "r1", 2)


def test_a_gang_waits_for_a_rack_elsewhere_rather_than_topping_up_a_few_idle_here() -> None:
    # Three machines' worth: one idle here (and speculative ones) cannot hold it without
    # claiming two; another shard holds four idle in one rack.
    engine = shard_b()
    fleet(engine, 1, prefix="b-idle", labels=LABELS)
    engine.set_fleet_idle([offer(4, rack="r2")])
    gang(engine, cpu=12)

    plan = engine.cycle(now=1)

    assert (of_kind(plan, Provision), of_kind(plan, AssignIdle)) == ([], [])
    [shortfall] = plan.shortfalls
    assert engine.why_not("train")[shortfall.need_key].startswith("awaiting another shard")


def test_a_gang_its_own_idle_machines_hold_takes_them_without_waiting() -> None:
    engine = shard_b()
    fleet(engine, 3, prefix="b-idle", labels=LABELS)
    engine.set_fleet_idle([offer(4, rack="r2")])
    gang(engine, cpu=12)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, AssignIdle)) == 3
    assert of_kind(plan, Provision) == []
    assert plan.shortfalls == ()


def test_a_gang_takes_a_rack_of_idle_machines_over_buying_in_a_lower_rack() -> None:
    # One shard, two racks that can each hold the gang: r1 (the lower code) only
    # speculative, r2 two idle machines already paid for. The gang goes to r2.
    engine = ShardEngine(EngineConfig())
    fleet(engine, 4, prefix="r1-spec", state=MachineState.SPECULATIVE, labels=LABELS)
    fleet(engine, 2, prefix="r2-idle", labels={**LABELS, "rack": "r2"})
    gang(engine, cpu=8)

    plan = engine.cycle(now=1)

    assert of_kind(plan, Provision) == []
    assert sorted(a.machine_id for a in of_kind(plan, AssignIdle)) == [
        "r2-idle-0000",
        "r2-idle-0001",
    ]


def test_a_need_larger_than_what_is_on_offer_buys_now_instead_of_waiting_in_vain() -> None:
    # Two machines' worth against one remote idle machine: the coordinator's idle step
    # covers a shortfall whole or not at all, so waiting would only lose the minute.
    engine = shard_b()
    engine.set_fleet_idle([offer(1)])
    apply(engine, rollup("web", 1, need(cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert len(of_kind(plan, Provision)) == 1
    assert not any(
        why.startswith("awaiting another shard") for why in engine.why_not("web").values()
    )


def test_offers_of_two_shards_that_cover_a_need_together_make_it_wait() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(1), RemoteIdle("c", LABELS, ALLOC, 1)])
    apply(engine, rollup("web", 1, need(cpu=8)), now=0)

    plan = engine.cycle(now=1)

    assert of_kind(plan, Provision) == []
    assert len(plan.shortfalls) == 1


def _gang_short(engine: ShardEngine, now: float) -> tuple[int, bool]:
    """Machines the gang claims this cycle, and whether it waits for another shard."""
    plan = engine.cycle(now=now)
    waits = any(
        why.startswith("awaiting another shard") for why in engine.why_not("train").values()
    )
    return sum(len(p.machine_ids) for p in of_kind(plan, Provision)), waits


def test_a_gang_waits_for_a_racks_idle_machines_and_slots_elsewhere_over_claiming_here() -> None:
    # Three machines' worth; this shard's rack r1 has only slots (three claims). r2,
    # elsewhere, holds two idle machines and slots beside them: one claim.
    engine = shard_b()
    engine.set_fleet_idle([offer(2, rack="r2", slots=5)])
    gang(engine, cpu=12)

    assert _gang_short(engine, now=1) == (0, True)


def test_a_gang_does_not_wait_for_idle_machines_no_slots_complete() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(2, rack="r2")])
    gang(engine, cpu=12)

    assert _gang_short(engine, now=1) == (3, False)


def test_a_gang_does_not_wait_for_a_rack_that_reuses_no_more_than_its_own() -> None:
    # r1 here: two idle machines and slots, so one claim; r2 elsewhere saves no more.
    engine = shard_b()
    fleet(engine, 2, prefix="b-idle", labels=LABELS)
    engine.set_fleet_idle([offer(2, rack="r2", slots=5)])
    gang(engine, cpu=12)

    plan = engine.cycle(now=1)

    claimed = sum(len(p.machine_ids) for p in of_kind(plan, Provision))
    assert (len(of_kind(plan, AssignIdle)), claimed) == (2, 1)
    assert plan.shortfalls == ()


def test_a_gang_whose_rack_is_half_here_keeps_waiting_for_the_rest() -> None:
    # The idle transfer of a mixed answer has landed (two idle machines of r2 here), its
    # slot is still on its way (offered as slots alone): the gang waits for it rather
    # than claim three in r1.
    engine = shard_b()
    fleet(engine, 2, prefix="b-moved", labels={**LABELS, "rack": "r2"})
    engine.set_fleet_idle([offer(0, rack="r2", slots=1)])
    gang(engine, cpu=12)

    plan = engine.cycle(now=1)

    assert (of_kind(plan, Provision), of_kind(plan, AssignIdle)) == ([], [])
    assert len(plan.shortfalls) == 1


def test_slots_alone_are_waited_for_by_no_need_that_is_not_a_gang() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(0, slots=4)])
    apply(engine, rollup("web", 1, need(cpu=4)), now=0)

    assert len(of_kind(engine.cycle(now=1), Provision)) == 1


def test_the_coordinator_answers_with_the_racks_idle_machines_and_one_slot() -> None:
    engine = shard_b()
    engine.set_fleet_idle([offer(2, rack="r2", slots=5)])
    gang(engine, cpu=12)
    plan = engine.cycle(now=1)
    donor = ShardView(
        "a",
        total_machines=100,
        supply=(
            ProfileSupply(
                "sim",
                "m.xlarge",
                "zone-a",
                0,
                {**LABELS, "rack": "r2"},
                ALLOC,
                idle=2,
                speculative=5,
                domain="r2",
            ),
        ),
    )
    reported = tuple(
        ShardShortfall(s.cluster_id, s.need_key, s.priority, dict(s.deficit), (same("rack"),))
        for s in plan.shortfalls
    )
    receiver = ShardView("b", total_machines=4, shortfalls=reported)

    moves = [(i.kind, i.domain, i.count) for i in plan_transfers({"a": donor, "b": receiver})]

    assert moves == [("idle", "r2", 2), ("speculative", "r2", 1)]
