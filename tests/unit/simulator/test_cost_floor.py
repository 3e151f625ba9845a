"""The cost floor: what no policy that places pods on arrival can pay less than, by hand."""

from __future__ import annotations

import pytest

from clusters.pods import PodSpec
from shard_engine.model import CapacityType, MachineRecord, MachineState, Operator, Requirement
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


NO_GPU = Requirement("nvidia.com/gpu.count", Operator.DOES_NOT_EXIST)


def _machine(
    machine_id: str, cores: float, gib: float, price: float, *, gpus: float = 0.0
) -> MachineRecord:
    labels = {"nvidia.com/gpu.count": str(int(gpus))} if gpus else {}
    return MachineRecord(
        id=machine_id,
        state=MachineState.SPECULATIVE,
        provider="cloud",
        instance_type=machine_id,
        zone="a",
        capacity_type=CapacityType.ON_DEMAND,
        price_per_hour=price,
        interruption_probability=0.0,
        labels=labels,
        allocatable={"cpu": cores, "memory": gib * GI, "nvidia.com/gpu": gpus},
    )


def _cpu_pod(name: str, cores: float, gib: float, *, no_gpu: bool = True) -> PodSpec:
    return PodSpec.build(
        name, {"cpu": cores, "memory": gib * GI}, requirements=(NO_GPU,) if no_gpu else ()
    )


def test_the_other_pods_pay_their_reservations_at_the_cheapest_rate_able_to_hold_them() -> None:
    # small: 4 cores, 16 GiB at $0.20/h ($0.05 a core, $0.0125 a GiB);
    # big: 64 cores, 512 GiB at $4.80/h ($0.075 a core, $0.009375 a GiB).
    # p: 2 cores, 4 GiB for 1 h; both hold it: cores 2 × 0.05 = $0.10, memory 4 × 0.009375.
    # q: 1 core, 24 GiB for 1 h; only big holds it: cores 0.075, memory 24 × 0.009375 = 0.225.
    # Cores add to $0.175, memory to $0.2625: the larger is the floor of their machines.
    trace = Trace(
        events=(
            Arrive(0.0, "c", _cpu_pod("p", 2.0, 4.0)),
            Arrive(1800.0, "c", _cpu_pod("q", 1.0, 24.0)),
            Leave(3600.0, "c", "p"),
            Leave(5400.0, "c", "q"),
        ),
        duration=7200.0,
    )
    machines = [_machine("small", 4.0, 16.0, 0.20), _machine("big", 64.0, 512.0, 4.80)]
    floor = cost_floor(trace, machines, [])
    assert floor.other_pods == 2
    assert floor.other_usd == pytest.approx(0.2625)
    assert floor.usd == pytest.approx(0.2625)
    assert floor.to_json()["other_usd"] == pytest.approx(0.26, abs=0.01)


def test_a_pod_a_gpu_machine_could_hold_or_no_machine_holds_adds_nothing() -> None:
    gpu = _machine("gpu", 96.0, 1000.0, 28.0, gpus=8.0)
    small = _machine("small", 4.0, 16.0, 0.20)
    trace = Trace(
        events=(
            # No requirement keeps it off the GPU server, whose machine the GPU term may count.
            Arrive(0.0, "c", _cpu_pod("free", 2.0, 4.0, no_gpu=False)),
            # Nothing holds 200 cores: it is never placed, and the bound is for placed pods.
            Arrive(0.0, "c", _cpu_pod("huge", 200.0, 4.0)),
            # Kept off the GPU server; still running when the run ends at 2 h: 2 h × 2 × $0.05.
            Arrive(0.0, "c", _cpu_pod("kept", 2.0, 4.0)),
        ),
        duration=7200.0,
    )
    floor = cost_floor(trace, [gpu, small], [])
    assert floor.other_pods == 1
    assert floor.other_usd == pytest.approx(0.20)
