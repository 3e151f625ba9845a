"""Fault scenarios, every part in its own process; the invariants are checked after each.

Each scenario starts the stack (``stack.py``), waits until the invariants hold,
puts work in motion (a change of demand), injects one fault, ends it, and
waits until the invariants hold again. The time that takes is the scenario's
recovery time; it is printed as a JSON line (``figure``) with the load
average, for docs/benchmarks.md and the issue's note. Nothing here asserts a
wall-clock figure.

``make test-chaos`` runs every scenario; ``make test`` runs the two marked
fast (a shard SIGKILLed mid-provisioning, and a silent database with a
standby that has a direct path).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from bigfleet.v1alpha1 import provider_pb2
from tests.chaos.invariants import StateAges, settle
from tests.chaos.stack import LEASE_TTL_S, SHARD, ChaosStack

pytestmark = pytest.mark.e2e

ALL = ("temporal", "provider", "shard", "coordinator")
# From a cold start the stack takes a while on two busy cores.
SETTLE_S = 240.0
RECOVER_S = 240.0


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[ChaosStack]:
    s = ChaosStack(tmp_path, empty_database_url)
    try:
        yield s
    finally:
        await s.stop()


@pytest.fixture
async def standby_stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[ChaosStack]:
    s = ChaosStack(tmp_path, empty_database_url, standby=True)
    try:
        yield s
    finally:
        await s.stop()


async def _started(stack: ChaosStack) -> StateAges:
    await stack.start()
    ages = StateAges(stack)
    ages.start()
    await settle(stack, ages, serving=ALL, within=SETTLE_S)
    return ages


def _more_demand(stack: ChaosStack, cluster: str = "c-web", cpu: float = 9.0) -> None:
    """Put work in motion: the cluster wants more machines from now on."""
    c = stack.clusters[cluster]
    c.demand = replace(c.demand, cpu=cpu)


async def _until_in_motion(stack: ChaosStack, *states: int, within: float = 60.0) -> None:
    assert stack.provider is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        listing = await stack.provider.list(states=list(states))
        if listing.machines:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no machine reached {states} within {within:g} s\n{stack.logs()}")


def _figure(scenario: str, **values: float | str) -> None:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(json.dumps({"figure": "chaos", "scenario": scenario, **values, "loadavg": load}))


# --------------------------------------------------------------------- fast tier


async def test_a_shard_killed_mid_provisioning_is_replaced_and_nothing_is_lost(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    _more_demand(stack)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    stack.parts["shard"].kill()
    stack.parts["shard"].start()  # a new process: it waits out the dead one's lease
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    _figure(
        "shard SIGKILL mid-provisioning",
        lease_ttl_s=LEASE_TTL_S,
        recovered_after_restart_s=round(recovered, 1),
    )
    await ages.stop()


async def test_a_silent_database_hands_the_shard_to_a_standby_and_the_two_never_act_together(
    standby_stack: ChaosStack,
) -> None:
    stack = standby_stack
    ages = await _started(stack)
    _more_demand(stack)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    assert stack.pg_proxy is not None
    stack.pg_proxy.blackhole()
    recovered = await settle(
        stack, ages, serving=("temporal", "provider", "standby", "coordinator"), within=RECOVER_S
    )
    shard = await stack.store.shard(SHARD)
    assert shard is not None and shard.lease_holder == stack.holder("standby")
    # The old holder stopped on its own clock before the standby's first act: its
    # last word before the standby took the lease is that it stopped acting.
    took = _last_log_time(stack, "standby", r"took its lease at epoch")
    assert took is not None, stack.logs()
    events = sorted(
        [(t, "acting") for t in _log_times(stack, "shard", r"took its lease at epoch")]
        + [(t, "stopped") for t in _log_times(stack, "shard", r"stops acting")]
    )
    before = [e for e in events if e[0] < took]
    assert before and before[-1][1] == "stopped", (events, took, stack.logs())
    stopped = before[-1][0]
    # Its operators were sent away with UNAVAILABLE and found the standby.
    assert all("UNAVAILABLE" in c.endings for c in stack.clusters.values())
    assert all(c.shard_address == stack.shard_address(1) for c in stack.clusters.values())
    # The path heals: the old process learns it lost and does not act again.
    stack.pg_proxy.heal()
    await asyncio.sleep(LEASE_TTL_S)
    assert all(t < took for t in _log_times(stack, "shard", r"took its lease at epoch"))
    _figure(
        "PostgreSQL blackhole, standby with a direct path",
        lease_ttl_s=LEASE_TTL_S,
        primary_stopped_before_standby_s=round(took - stopped, 2),
        settled_after_blackhole_s=round(recovered, 1),
    )
    await ages.stop()


# --------------------------------------------------------------------- slow tier


@pytest.mark.chaos
async def test_temporal_killed_and_restarted_on_its_own_file_loses_no_machine(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    _more_demand(stack)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    stack.parts["temporal"].kill()
    await asyncio.sleep(5)
    await stack.restart_temporal()
    restarted = time.monotonic()
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    _figure(
        "Temporal dev server SIGKILL and restart",
        down_s=5,
        recovered_after_restart_s=round(recovered, 1),
        wall_s=round(time.monotonic() - restarted, 1),
    )
    await ages.stop()


@pytest.mark.chaos
async def test_a_45_second_database_cut_stops_the_shard_and_it_resumes_with_a_new_epoch(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    before = await stack.store.shard(SHARD)
    assert before is not None
    _more_demand(stack, "c-batch", cpu=6.0)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    assert stack.pg_proxy is not None
    stack.pg_proxy.cut()
    await asyncio.sleep(45)
    stack.pg_proxy.heal()
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    after = await stack.store.shard(SHARD)
    assert after is not None and after.epoch > before.epoch
    assert _first_log_time(stack, "shard", r"stops acting") is not None
    _figure(
        "PostgreSQL cut for 45 s",
        cut_s=45,
        recovered_after_heal_s=round(recovered, 1),
        epochs=f"{before.epoch}->{after.epoch}",
    )
    await ages.stop()


@pytest.mark.chaos
async def test_a_provider_killed_and_restarted_from_its_state_file_converges(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    _more_demand(stack)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    stack.parts["provider"].kill()
    await asyncio.sleep(3)
    stack.parts["provider"].start()
    await stack.wait_provider()
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    _figure("provider SIGKILL and restart", down_s=3, recovered_after_restart_s=round(recovered, 1))
    await ages.stop()


@pytest.mark.chaos
async def test_a_provider_stopped_for_60_seconds_converges_once_it_runs_again(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    _more_demand(stack)
    await _until_in_motion(stack, provider_pb2.MACHINE_STATE_CREATING)
    stack.parts["provider"].signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(60)
    finally:
        stack.parts["provider"].signal(signal.SIGCONT)
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    _figure("provider SIGSTOP for 60 s", stopped_s=60, recovered_after_cont_s=round(recovered, 1))
    await ages.stop()


@pytest.mark.chaos
async def test_shards_keep_serving_while_the_coordinator_is_dead_and_a_new_one_takes_a_new_term(
    stack: ChaosStack,
) -> None:
    ages = await _started(stack)
    term = await stack.store.term()
    stack.parts["coordinator"].kill()
    _more_demand(stack)
    # Without a coordinator the shard serves the new demand from what it owns.
    await settle(stack, ages, serving=("temporal", "provider", "shard"), within=RECOVER_S)
    stack.parts["coordinator"].start()
    restarted = time.monotonic()
    deadline = restarted + RECOVER_S
    while await stack.store.term() <= term:
        assert time.monotonic() < deadline, stack.logs(("coordinator",))
        await asyncio.sleep(0.5)
    recovered = await settle(stack, ages, serving=ALL, within=RECOVER_S)
    _figure(
        "coordinator SIGKILL",
        new_term_after_restart_s=round(time.monotonic() - restarted - recovered, 1),
        settled_after_new_term_s=round(recovered, 1),
    )
    await ages.stop()


# ----------------------------------------------------------------------- helpers

_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})")


def _log_times(stack: ChaosStack, part: str, pattern: str) -> list[float]:
    text = stack.parts[part].log.read_text(errors="replace")
    times: list[float] = []
    for line in text.splitlines():
        if re.search(pattern, line):
            stamp = _STAMP.match(line)
            if stamp:
                moment = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                times.append(moment.timestamp())
    return times


def _first_log_time(stack: ChaosStack, part: str, pattern: str) -> float | None:
    times = _log_times(stack, part, pattern)
    return times[0] if times else None


def _last_log_time(stack: ChaosStack, part: str, pattern: str) -> float | None:
    times = _log_times(stack, part, pattern)
    return times[-1] if times else None
