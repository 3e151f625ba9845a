"""Each shard is offered the other shards' idle machines, per profile (ADR 0129)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shard_engine.coordination import (
    Instruction,
    ProfileSupply,
    RemoteIdle,
    ShardShortfall,
    ShardView,
    TransferKind,
    idle_offers,
    plan_transfers,
)

GP = {"cpu": 128.0, "memory": 768.0}
GPU = {"cpu": 224.0, "nvidia.com/gpu": 8.0}


def _supply(
    instance_type: str, alloc: dict[str, float], *, idle: int, zone: str = "z1"
) -> ProfileSupply:
    return ProfileSupply(
        provider="metal",
        instance_type=instance_type,
        zone=zone,
        capacity_type=4,
        labels={"node.kubernetes.io/instance-type": instance_type, "zone": zone},
        allocatable=alloc,
        idle=idle,
        speculative=10,
    )


def _views() -> dict[str, ShardView]:
    return {
        "a": ShardView("a", 100, (_supply("gp", GP, idle=4), _supply("gpu", GPU, idle=1))),
        "b": ShardView("b", 100, (_supply("gp", GP, idle=2, zone="z2"),)),
        "c": ShardView("c", 100, ()),
    }


def test_a_shard_is_offered_every_other_shards_idle_machines_and_never_its_own() -> None:
    offers = idle_offers(_views())

    assert sorted(offers) == ["a", "b", "c"]
    assert [
        (o.shard_id, o.labels["node.kubernetes.io/instance-type"], o.count) for o in offers["c"]
    ] == [
        ("a", "gp", 4),
        ("a", "gpu", 1),
        ("b", "gp", 2),
    ]
    # b's budget in a round is 5 machines (5 % of 100): 2 idle, and 3 of its 10 unclaimed
    # slots of the profile beside them.
    assert offers["a"] == (
        RemoteIdle("b", _supply("gp", GP, idle=2, zone="z2").labels, GP, 2, speculative=3),
    )
    assert all(o.shard_id != "b" for o in offers["b"])
    assert len(offers["b"]) == 2


def test_speculative_and_configured_machines_are_not_offered() -> None:
    view = ShardView(
        "a",
        100,
        (
            ProfileSupply(
                "metal",
                "gp",
                "z1",
                4,
                {},
                GP,
                idle=0,
                speculative=16,
                configured_by_priority={0: 3},
            ),
        ),
    )
    assert idle_offers({"a": view, "b": ShardView("b", 10)}) == {"a": (), "b": ()}


def test_only_receivers_get_offers_but_every_shard_donates() -> None:
    offers = idle_offers(_views(), receivers=["c"])

    assert list(offers) == ["c"]
    assert {o.shard_id for o in offers["c"]} == {"a", "b"}


def test_idle_machines_a_planned_transfer_takes_are_no_longer_on_offer() -> None:
    moved = Instruction(
        kind=TransferKind.IDLE,
        donor="a",
        receiver="b",
        provider="metal",
        instance_type="gp",
        zone="z1",
        capacity_type=4,
        count=3,
        cluster_id="svc",
        need_key="k",
        priority=0,
    )
    offers = idle_offers(_views(), planned=[moved])

    gp_from_a = [o for o in offers["c"] if o.shard_id == "a" and o.allocatable == GP]
    assert [o.count for o in gp_from_a] == [1]


def test_an_offer_is_capped_at_what_the_donor_may_give_in_one_round() -> None:
    # 40 machines at max_share 0.05: at most 2 leave the donor per round.
    views = {"a": ShardView("a", 40, (_supply("gp", GP, idle=6),)), "b": ShardView("b", 40)}
    assert [o.count for o in idle_offers(views)["b"]] == [2]
    speculative = Instruction(
        TransferKind.SPECULATIVE, "a", "b", "metal", "gp", "z1", 4, 2, "svc", "k", 0
    )
    assert idle_offers(views, planned=[speculative])["b"] == ()


def test_what_is_offered_is_what_the_planner_would_move() -> None:
    """An offer fits a shortfall exactly when the planner's idle step covers it."""
    views = _views()
    (offer,) = [o for o in idle_offers(views)["c"] if o.allocatable == GPU]
    short = ShardView(
        "c",
        100,
        shortfalls=(ShardShortfall("train", "k", 900_000, {"nvidia.com/gpu": 8.0 * offer.count}),),
    )
    (moved,) = plan_transfers({**views, "c": short})
    assert (moved.kind, moved.donor, moved.instance_type, moved.count) == (
        TransferKind.IDLE,
        "a",
        "gpu",
        offer.count,
    )


@given(
    idle=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=1, max_size=4),
    total=st.integers(1, 200),
    moved=st.integers(0, 6),
)
def test_nothing_is_offered_that_is_not_idle_elsewhere_or_beyond_a_rounds_budget(
    idle: list[list[int]], total: int, moved: int
) -> None:
    views = {
        f"s{i}": ShardView(
            f"s{i}",
            total,
            tuple(_supply(f"t{j}", GP, idle=n) for j, n in enumerate(counts)),
        )
        for i, counts in enumerate(idle)
    }
    planned = [
        Instruction(TransferKind.IDLE, "s0", "s1", "metal", "t0", "z1", 4, moved, "c", "k", 0)
    ]
    offers = idle_offers(views, planned=planned)
    budget = max(1, int(total * 0.05))
    assert sorted(offers) == sorted(views)
    for receiver, got in offers.items():
        assert all(o.shard_id != receiver and o.count > 0 for o in got)
        for o in got:
            held = idle[int(o.shard_id[1:])][int(o.labels["node.kubernetes.io/instance-type"][1:])]
            taken = (
                moved
                if (o.shard_id, o.labels["node.kubernetes.io/instance-type"]) == ("s0", "t0")
                else 0
            )
            assert o.count <= held - taken
            assert o.count <= budget - (moved if o.shard_id == "s0" else 0)


def test_an_offer_carries_the_slots_beside_its_idle_machines_less_this_rounds_quota() -> None:
    # a's gp profile: 4 idle and 10 slots, a budget of 5 machines a round. A quota
    # transfer of 1 this round leaves 4 of budget: 4 idle on offer, no slot left.
    quota = Instruction(
        TransferKind.SPECULATIVE, "a", "b", "metal", "gp", "z1", 4, 1, "svc", "k", 0
    )
    before = [o for o in idle_offers(_views())["c"] if o.shard_id == "a" and o.allocatable == GP]
    after = [
        o
        for o in idle_offers(_views(), planned=[quota])["c"]
        if o.shard_id == "a" and o.allocatable == GP
    ]
    assert [(o.count, o.speculative) for o in before] == [(4, 1)]
    assert [(o.count, o.speculative) for o in after] == [(4, 0)]
