"""The plan activity's body: the shards' reports as production sends them, planned.

``plan_round`` is what ``CoordinatorActivities.plan`` runs once it knows the
active shards. These tests feed it ``ShardReport``s, the wire shape the
shards' reporters signal, so they check the conversion the simulator's
coordinator does not go through: a profile's rack comes from its labels, and
every active shard is told what the others hold idle (ADR 0129).
"""

from __future__ import annotations

import dataclasses

from activities.coordinator import plan_round, shard_view
from shard_engine.coordination import DOMAIN_LABEL
from shard_engine.model import Operator
from shard_engine.pending import REASON_AWAITING_TRANSFER
from workflows import coordinator_contracts as co
from workflows.contracts import RequirementSpec

GPU = {"cpu": 224.0, "nvidia.com/gpu": 8.0}
GP = {"cpu": 128.0, "memory": 768.0}


def _servers(rack: str, idle: int, *, speculative: int = 0) -> co.ProfileReport:
    """Idle H100 servers of one rack, as a shard reports them."""
    return co.ProfileReport(
        provider="metal",
        instance_type="h100",
        zone="z1",
        capacity_type=4,
        labels={"node.kubernetes.io/instance-type": "h100", DOMAIN_LABEL: rack},
        allocatable=GPU,
        idle=idle,
        speculative=speculative,
    )


def _gang(servers: int) -> co.ShortfallReport:
    return co.ShortfallReport(
        cluster_id="train",
        need_key="gang-1",
        priority=900_000,
        deficit={"nvidia.com/gpu": 8.0 * servers},
        requirements=[RequirementSpec(DOMAIN_LABEL, int(Operator.SAME), [])],
        min_unit={"nvidia.com/gpu": 8.0},
    )


def _report(
    shard_id: str,
    *profiles: co.ProfileReport,
    shortfalls: tuple[co.ShortfallReport, ...] = (),
) -> co.ShardReport:
    return co.ShardReport(
        shard_id=shard_id,
        epoch=1,
        sent_at=1.0,
        total_machines=100,
        profiles=list(profiles),
        shortfalls=list(shortfalls),
    )


def test_a_profiles_rack_is_read_from_its_labels() -> None:
    view = shard_view(_report("a", _servers("r1", 2), _servers("r2", 0, speculative=3)))
    assert [(s.domain, s.idle, s.speculative) for s in view.supply] == [("r1", 2, 0), ("r2", 0, 3)]


def test_a_shortfall_waiting_for_another_shards_idle_is_known_by_its_reason() -> None:
    waiting = dataclasses.replace(
        _gang(2), reason=f"{REASON_AWAITING_TRANSFER}: a matching idle machine is held"
    )
    short = dataclasses.replace(_gang(2), need_key="gang-2", reason="no matching supply: none")
    view = shard_view(_report("a", shortfalls=(waiting, short)))
    assert [(s.need_key, s.awaiting_idle) for s in view.shortfalls] == [
        ("gang-1", True),
        ("gang-2", False),
    ]


def test_a_gang_is_not_assembled_from_two_racks_of_one_profile() -> None:
    # Two idle servers in each of two racks: four servers of one shape, but no rack
    # holds the gang of four, so nothing moves.
    reports = [
        _report("a", shortfalls=(_gang(4),)),
        _report("b", _servers("r1", 2), _servers("r2", 2)),
    ]
    result = plan_round(co.PlanInput(reports, max_share=0.5), active=["a", "b"])
    assert result.transfers == []


def test_a_gang_is_moved_inside_the_one_rack_that_holds_it() -> None:
    # The instruction names the rack, so the donor releases r2's servers. Before the
    # rack was read from the labels it named none, and the donor could release two
    # of r1 and one of r2: a gang split over two racks.
    reports = [
        _report("a", shortfalls=(_gang(3),)),
        _report("b", _servers("r1", 2), _servers("r2", 4)),
    ]
    (move,) = plan_round(co.PlanInput(reports, max_share=0.5), active=["a", "b"]).transfers
    assert (move.kind, move.donor, move.receiver, move.domain, move.count) == (
        "idle",
        "b",
        "a",
        "r2",
        3,
    )


def test_every_shards_idle_machines_are_on_offer_less_this_rounds_moves() -> None:
    # a is short of three servers: b's rack r2 gives them, one of r2's four stays on
    # offer, and all of r1 too. Draining d takes nothing new and is no receiver, but
    # its idle machines are on offer to the others.
    idle_gp = co.ProfileReport("metal", "gp", "z1", 4, {"zone": "z1"}, GP, idle=5)
    reports = [
        _report("a", shortfalls=(_gang(3),)),
        _report("b", _servers("r1", 2), _servers("r2", 4)),
        _report("c"),
        _report("d", idle_gp),
    ]
    result = plan_round(co.PlanInput(reports, max_share=0.5), active=["a", "b", "c"])

    assert [(t.donor, t.domain, t.count) for t in result.transfers] == [("b", "r2", 3)]
    assert result.receivers == ["a", "b", "c"]
    # Every shard's offers once (the workflow leaves out a receiver's own when asked).
    assert [
        (o.shard_id, o.labels.get(DOMAIN_LABEL, o.labels.get("zone", "")), o.count)
        for o in result.idle
    ] == [("b", "r1", 2), ("b", "r2", 1), ("d", "z1", 5)]
    assert result.idle[0].allocatable == GPU
