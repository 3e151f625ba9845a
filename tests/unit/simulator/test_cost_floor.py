"""The cost floor: what no policy that places pods on arrival can pay less than, by hand."""

from __future__ import annotations

import pytest

from clusters.pods import PodSpec
from shard_engine.model import CapacityType, MachineRecord, MachineState
from simulator.floor import cost_floor
from simulator.trace import Arrive, Leave, Trace

GI = 2.0**30
RACK = "topology.kubernetes.io/rack"


def _server(machine_id: str, *, provider: str = "metal", gpus: float = 8.0) -> MachineRecord:
    return MachineRecord(
        id=machine_id,
        state=MachineState.SPECULATIVE,
        provider=provider,
        instance_type="h100",
        zone="a",
        capacity_type=CapacityType.RESERVED,
        price_per_hour=28.0,
        interruption_probability=0.0,
        labels={RACK: "r1"},
        allocatable={"cpu": 96.0, "memory": 1000 * GI, "nvidia.com/gpu": gpus},
    )


def _pod(name: str, gpus: float = 8.0) -> PodSpec:
    """A pod of ``gpus`` GPUs and the cores and memory that go with them (11 and 112 GiB each)."""
    return PodSpec.build(
        name,
        {"cpu": 11.0 * gpus, "memory": 112.5 * GI * gpus, "nvidia.com/gpu": gpus},
        colocation="job",
        colocation_key=RACK,
    )


def test_servers_are_billed_from_when_the_peak_so_far_first_needs_them() -> None:
    # Two pods from 0 to 1 h, a third from 2 h to 3 h, a 4-hour run on $28/h servers
    # without Delete: two servers from 0 h on (the third pod reuses one), 2 × 4 h = $224.
    trace = Trace(
        events=(
            Arrive(0.0, "c", _pod("a")),
            Arrive(0.0, "c", _pod("b")),
            Leave(3600.0, "c", "a"),
            Leave(3600.0, "c", "b"),
            Arrive(7200.0, "c", _pod("d")),
            Leave(10800.0, "c", "d"),
        ),
        duration=14400.0,
    )
    floor = cost_floor(trace, [_server("s1"), _server("s2"), _server("s3")], ["metal"])
    assert (floor.pods, floor.peak, floor.price, floor.servers) == (3, 2, 28.0, 3)
    assert floor.usd == pytest.approx(224.0)


def test_a_pod_that_a_deletable_machine_or_a_shared_server_could_hold_counts_nothing() -> None:
    trace = Trace(events=(Arrive(0.0, "c", _pod("a", gpus=4.0)),), duration=3600.0)
    # Two of these pods fit on one 8-GPU server: it could share, so it is left out.
    assert cost_floor(trace, [_server("s1")], ["metal"]).usd == 0.0
    # A cloud machine (it has Delete) could hold an 8-GPU pod: left out too.
    eight = Trace(events=(Arrive(0.0, "c", _pod("a")),), duration=3600.0)
    machines = [_server("s1"), _server("cloud-1", provider="cloud")]
    assert cost_floor(eight, machines, ["metal"]).usd == 0.0
    assert cost_floor(eight, machines[:1], ["metal"]).usd == pytest.approx(28.0)


def test_no_floor_when_the_fleet_cannot_hold_the_peak_on_arrival() -> None:
    # Three pods at once, two servers able to hold them: no policy places every pod when
    # it arrives, so the bound (made for those that do) says nothing.
    trace = Trace(
        events=tuple(Arrive(0.0, "c", _pod(name)) for name in "abc"),
        duration=3600.0,
    )
    floor = cost_floor(trace, [_server("s1"), _server("s2")], ["metal"])
    assert (floor.usd, floor.peak, floor.servers) == (None, 3, 2)
    assert floor.to_json()["usd"] is None
