"""The fleet's dealing to shards: cloud quota evenly, bare metal in whole racks."""

from __future__ import annotations

from shard_engine.dealing import Dealable, deal
from shard_engine.model import CapacityType

BARE = int(CapacityType.BARE_METAL)
SPOT = int(CapacityType.SPOT)


def _rack(rack: str, n: int, *, owner: str = "") -> list[Dealable]:
    return [
        Dealable(f"{rack}-{i}", "metal", "z1", "gpu8", BARE, rack=rack, owner=owner)
        for i in range(n)
    ]


def test_every_rack_goes_whole_to_one_shard() -> None:
    machines = _rack("r1", 8) + _rack("r2", 8) + _rack("r3", 8)
    dealt = deal(machines, ["shard-a", "shard-b"])
    holders = {rack: shard for shard, racks in dealt.racks.items() for rack in racks}
    assert sorted(holders) == ["r1", "r2", "r3"]
    for shard, racks in dealt.racks.items():
        for rack, ids in racks.items():
            assert ids == sorted(f"{rack}-{i}" for i in range(8)), (shard, rack)
    assert sorted(len(r) for r in dealt.racks.values()) == [1, 2]


def test_a_free_rack_goes_to_the_shard_holding_fewest_racks() -> None:
    machines = _rack("r1", 4, owner="shard-a") + _rack("r2", 4)
    dealt = deal(machines, ["shard-a", "shard-b"])
    assert dealt.racks == {"shard-b": {"r2": [f"r2-{i}" for i in range(4)]}}


def test_a_new_machine_in_a_held_rack_joins_its_holder() -> None:
    new = Dealable("r1-new", "metal", "z1", "gpu8", BARE, rack="r1")
    machines = [*_rack("r1", 3, owner="shard-b"), new]
    dealt = deal(machines, ["shard-a", "shard-b"])
    assert dealt.racks == {"shard-b": {"r1": ["r1-new"]}}


def test_cloud_quota_spreads_evenly_and_only_speculative_slots_are_dealt() -> None:
    spare = [Dealable(f"s{i}", "cloud", "z1", "m6i", SPOT) for i in range(5)]
    busy_orphan = Dealable("orphan", "cloud", "z1", "m6i", SPOT, speculative=False)
    held = Dealable("held", "cloud", "z1", "m6i", SPOT, owner="shard-a")
    dealt = deal([*spare, busy_orphan, held], ["shard-a", "shard-b"])
    assert sorted(len(ids) for ids in dealt.cloud.values()) == [2, 3]
    assert len(dealt.cloud["shard-b"]) == 3  # shard-a already holds one of the group
    assert "orphan" not in dealt.machines_of("shard-a") + dealt.machines_of("shard-b")


def test_nothing_is_dealt_without_shards() -> None:
    assert deal(_rack("r1", 2), []).racks == {}
