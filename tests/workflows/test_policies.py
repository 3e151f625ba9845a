"""Pure pieces of the lifecycle: deadline policy, poll backoff, blocked-drain shortfalls."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import create_async_engine

from bigfleet.shard.lifecycle import MachineLifecycle, reclaim_key
from bigfleet.store import Store
from workflows.contracts import (
    BlockedDrain,
    DeadlinePolicy,
    Deadlines,
    NotifyReclaimInput,
    PollPolicy,
    Waiter,
)
from workflows.ids import workflow_id


def test_bare_metal_gets_six_hours_to_create_and_cloud_ten_minutes() -> None:
    policy = DeadlinePolicy()
    assert policy.for_machine("bm", "BARE_METAL").creating_s == 6 * 3600
    assert policy.for_machine("simcloud", "ON_DEMAND").creating_s == 600
    assert policy.for_machine("simcloud", "SPOT") == Deadlines()


def test_the_most_specific_override_wins() -> None:
    policy = DeadlinePolicy(
        overrides={
            "spot": {"creating_s": 180, "deleting_s": 120},
            "simcloud": {"creating_s": 300},
            "simcloud/spot": {"creating_s": 90},
        }
    )
    spot = policy.for_machine("simcloud", "SPOT")
    assert spot.creating_s == 90 and spot.deleting_s == 120
    assert policy.for_machine("simcloud", "ON_DEMAND").creating_s == 300
    assert policy.for_machine("other", "SPOT").creating_s == 180


def test_an_override_naming_an_unknown_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        DeadlinePolicy(overrides={"spot": {"creating": 1}}).for_machine("p", "SPOT")


@given(
    delay=st.floats(0.001, 1e5),
    waited=st.floats(0, 1e7),
    fraction=st.floats(0, 1),
)
def test_the_poll_delay_never_exceeds_its_cap_and_the_cap_grows_with_the_wait(
    delay: float, waited: float, fraction: float
) -> None:
    poll = PollPolicy(initial_s=0.5, max_s=15.0, multiplier=2.0, elapsed_fraction=fraction)
    nxt = poll.next_delay(delay, waited)
    assert nxt <= max(15.0, waited * fraction)
    assert nxt <= delay * 2.0


def test_a_six_hour_wait_costs_a_few_hundred_reads_not_thousands() -> None:
    poll = PollPolicy()
    waited, delay, reads = 0.0, poll.initial_s, 0
    while waited < 6 * 3600:
        reads += 1
        waited += delay
        delay = poll.next_delay(delay, waited)
    assert reads < 200


def test_workflow_ids_name_the_operation_machine_or_batch_and_sequence() -> None:
    assert workflow_id("shard-0", "drain", ["m1"], 7) == "shard-0/drain/m1/7"
    assert workflow_id("shard-0", "provision", ["m1", "m2", "m3"], 2) == "shard-0/provision/m1+2/2"
    with pytest.raises(ValueError):
        workflow_id("shard-0", "drain", [], 1)


def _blocked(machine: str, priority: int, requested: float) -> BlockedDrain:
    return BlockedDrain(
        shard_id="s",
        machine_id=machine,
        victim_cluster_id="batch",
        waiter=Waiter("urgent", "need", priority),
        requested_unix=requested,
        grace_seconds=30,
        workflow_id=f"s/drain/{machine}/1",
    )


def test_a_blocked_drain_is_a_shortfall_until_it_settles() -> None:
    lifecycle = MachineLifecycle()
    lifecycle.report_blocked(_blocked("m1", 500_000, requested=1_000.0))
    lifecycle.report_blocked(_blocked("m2", 900_000, requested=1_000.0))
    lifecycle.report_blocked(_blocked("m1", 500_000, requested=1_000.0))  # re-reported
    found = lifecycle.shortfalls(now=1_000.0 + 12 * 60, deficit_of=lambda m: {"cpu": 2.0})
    assert [s.priority for s in found] == [900_000, 500_000]
    assert found[0].escalated and found[0].deficit == {"cpu": 2.0}
    assert found[0].reason == (
        "drain of m2 (cluster batch) requested 12 min ago, still in progress, "
        "priority-900000 preemptor waiting"
    )
    assert found[0].cluster_id == "urgent" and found[0].need_key == "need"
    lifecycle.settled("m2")
    assert [s.priority for s in lifecycle.shortfalls(now=2_000.0)] == [500_000]


def test_a_newer_reclaim_instruction_for_the_same_nodes_supersedes_the_older() -> None:
    a = NotifyReclaimInput("s", "c", "i#1", ["m2", "m1"], 600)
    b = NotifyReclaimInput("s", "c", "i#2", ["m1", "m2"], 10)
    assert reclaim_key(a) == reclaim_key(b)


def test_batches_are_cut_where_the_machine_ids_stop_fitting_one_search_attribute() -> None:
    from workflows import search_attributes as sa

    ids = [f"simcloud-fleet-a-us-east-1a-m6i-large-od-{i:03d}" for i in range(100)]
    chunks = sa.chunks_that_fit(ids, at_most=64)
    assert [m for c in chunks for m in c] == ids
    assert all(sa.keyword_list_bytes(c) <= sa.MAX_VALUE_BYTES for c in chunks)
    assert not sa.fits(chunks[0] + [chunks[1][0]]), "each chunk is as large as fits"
    assert sa.chunks_that_fit(["a", "b", "c"], at_most=2) == [["a", "b"], ["c"]]
    assert sa.fitting_prefix(ids) == chunks[0]


def test_the_coordinator_report_carries_blocked_preemption_drains() -> None:
    from bigfleet.shard.options import ShardOptions
    from bigfleet.shard.parts import assemble

    # The shard's parts, not started: nothing here reaches the store or Temporal.
    parts = assemble(
        ShardOptions(shard_id="s"),
        store=_unconnected_store(),
        temporal=None,  # type: ignore[arg-type]
        providers={},
        clock=lambda: 1_000.0 + 5 * 60,
    )
    parts.lifecycle.report_blocked(_blocked("m7", 900_000, requested=1_000.0))
    report = parts.reporter.build_report()
    (shortfall,) = report.shortfalls
    assert (shortfall.cluster_id, shortfall.need_key, shortfall.priority) == (
        "urgent",
        "need",
        900_000,
    )
    assert shortfall.escalated


def _unconnected_store() -> Store:
    """A store over an engine that never connects: assembling the parts reaches nothing."""
    return Store(create_async_engine("postgresql+asyncpg://127.0.0.1:5432/test"))


def test_the_report_names_the_rack_a_gang_holding_most_of_it_is_short_in() -> None:
    # ADR 0180: a gang holding three of its four servers in rack b-r03, where another
    # shard holds an idle one, is short of one server there; the report writes the rack
    # into its Same requirement, which is what the coordinator's idle step matches.
    from bigfleet.shard.options import ShardOptions
    from bigfleet.shard.parts import assemble
    from shard_engine.coordination import requirements_from
    from shard_engine.model import Operator, Requirement
    from tests.rollups import apply
    from tests.unit.engine.engine_fleet import rollup
    from tests.unit.engine.test_engine_oldest_first import (
        RACK,
        gang_of,
        holding,
        idle_elsewhere,
    )

    parts = assemble(
        ShardOptions(shard_id="s"),
        store=_unconnected_store(),
        temporal=None,  # type: ignore[arg-type]
        providers={},
        clock=lambda: 1_000.0,
    )
    holding(parts.engine, 3, "b-r03", cluster="train")
    parts.engine.set_fleet_idle([idle_elsewhere("b-r03")])
    apply(parts.engine, rollup("train", 1, gang_of(4)), now=1_000.0)
    parts.engine.cycle(now=1_000.0)

    (shortfall,) = parts.reporter.build_report().shortfalls

    assert shortfall.deficit == {"nvidia.com/gpu": 8.0, "cpu": 96.0}
    assert requirements_from(shortfall.requirements) == (
        Requirement(RACK, Operator.SAME, ("b-r03",)),
    )
