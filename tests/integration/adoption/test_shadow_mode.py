"""A shard in shadow mode over the real stack decides, records, and never acts.

The stack is real (Temporal dev server, PostgreSQL, a simulated cloud over
gRPC, the coordinator dealing quota); a simulated cluster's operator dials
the shard and asks for 8 cores and 8 GiB of m6i.large, which takes every one
of the eight the shard holds. The shard must record each provision it would
have made exactly once, while the cloud receives no mutating call and Temporal no machine
workflow. The report over its decision log is then checked against an
incumbent record whose figures are worked out here by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from bigfleet.decisions import Decision
from bigfleet.shadow import compare, parse_incumbent
from bigfleet.shard.gate import GatedActuator
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.shard.virtual import ShadowDelays
from bigfleet.store.decisions import DecisionStore
from clusters.operator import DemandPattern, SimulatedCluster
from shard_engine.config import EngineConfig
from shard_engine.model import MachineState
from tests.integration.adoption.stack import World, world
from tests.integration.multishard import eventually
from tests.ports import free_port
from workflows.contracts import PollPolicy
from workflows.registry import ALL_WORKFLOWS

pytestmark = pytest.mark.e2e

__all__ = ["world"]  # the fixture, imported for pytest

SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))
CLUSTER = "c-shadow"


async def _provisions(store: DecisionStore, since: datetime) -> list[Decision] | None:
    rows = await store.window(
        since=since, until=datetime(2100, 1, 1, tzinfo=UTC), cluster_id=CLUSTER
    )
    provisions = [d for d in rows if d.kind == "provision"]
    return provisions if provisions else None


async def test_a_shadow_shard_records_what_it_would_do_and_never_acts(world: World) -> None:
    listen = f"127.0.0.1:{free_port()}"
    shard = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            listen=listen,
            holder="shadow",
            lease_ttl_s=15,
            cycle_interval_s=0.3,
            observe_interval_s=0.3,
            report_interval_s=0.5,
            poll=PollPolicy(initial_s=0.2, max_s=1.0),
            shadow=True,
        ),
        store=world.store,
        temporal=world.env.client,
        providers={"simcloud": world.client},
    )
    decisions = DecisionStore(world.db.engine)
    started = datetime.now(UTC)
    await shard.start()
    await world.coordinator.start()
    cluster = SimulatedCluster(
        CLUSTER,
        listen,
        DemandPattern(
            cpu=8, memory_gib=8, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
        ),
        rollup_interval_s=0.5,
    )
    cluster.start()
    try:
        provisions = await eventually(
            lambda: _provisions(decisions, started),
            within=180,
            what="the shadow shard to record the provisions it would have made",
        )
        cycles = shard.cycles
        await eventually(lambda: shard.cycles >= cycles + 5, within=60, what="five more cycles")
        provisions = await _provisions(decisions, started) or []

        # Decided once: eight machines, recorded once each, all in one cycle, every row in
        # shadow mode (the coordinator deals them in one batch, which the shard adopts whole).
        # (every m6i.large the shard holds: at 8 GiB a machine offers less than 8 GiB)
        assert len(provisions) == len({d.machine_id for d in provisions}) == 8
        assert len({d.cycle for d in provisions}) == 1
        assert {d.mode for d in provisions} == {"shadow"}
        assert {d.inputs["instance_type"] for d in provisions} == {"m6i.large"}
        # Never acted: no mutating provider call, no machine workflow, nothing configured.
        assert world.mutations.calls == []
        machine_types = {w.__name__ for w in ALL_WORKFLOWS}
        started_types = [w.workflow_type async for w in world.env.client.list_workflows()]
        assert [t for t in started_types if t in machine_types] == []
        assert [
            w.id async for w in world.env.client.list_workflows(f"TaskQueue = '{shard.task_queue}'")
        ] == []
        actuator = shard.parts.core.actuator
        assert isinstance(actuator, GatedActuator)
        assert actuator.withheld["shadow"] >= 1
        configured = [m for m in (await world.client.list()).machines if m.cluster == CLUSTER]
        assert configured == []
    finally:
        await cluster.stop()
        await shard.stop()

    # The report against an incumbent worked out by hand over one hour from `start`:
    # i1 runs the whole hour, i2 the second half, at $0.096 on-demand: 1.5 machine-hours,
    # $0.144. BigFleet: each would-be machine from its decision instant to the end.
    start = started.timestamp()
    end = start + 3600
    incumbent = parse_incumbent(
        "time,cluster,node,event,instance_type,capacity_type,price_per_hour\n"
        f"{start},{CLUSTER},i1,join,m6i.large,on-demand,0.096\n"
        f"{start + 1800},{CLUSTER},i2,join,m6i.large,on-demand,0.096\n"
    )
    rows = await decisions.window(
        since=datetime.fromtimestamp(start - 60, UTC), until=datetime.fromtimestamp(end, UTC)
    )
    [report] = compare(rows, incumbent, since=start, until=end, cluster=CLUSTER).clusters

    [theirs] = report.incumbent
    assert (theirs.instance_type, theirs.machine_hours, theirs.cost) == ("m6i.large", 1.5, 0.144)
    [ours] = report.bigfleet
    expected_hours = sum((end - d.decided_at) / 3600 for d in provisions)
    assert ours.instance_type == "m6i.large"
    assert ours.machine_hours == pytest.approx(expected_hours, abs=1e-5)
    assert ours.cost == pytest.approx(expected_hours * 0.096, abs=1e-5)
    first = min(d.decided_at for d in provisions)
    race = report.races[0]
    assert race.unmet_at <= first == race.bigfleet_at  # short before quota came, perhaps
    assert (race.incumbent_at, race.first) == (start + 1800, "bigfleet")


async def _decided(store: DecisionStore, since: datetime, kind: str) -> list[Decision] | None:
    rows = await store.window(
        since=since, until=datetime(2100, 1, 1, tzinfo=UTC), cluster_id=CLUSTER
    )
    found = [d for d in rows if d.kind == kind]
    return found or None


async def test_a_shadow_shards_would_be_machines_settle_and_are_reclaimed_when_demand_falls(
    world: World,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    shard = ShardProcess(
        ShardOptions(
            shard_id="shard-0",
            listen=listen,
            holder="shadow",
            lease_ttl_s=15,
            cycle_interval_s=0.3,
            observe_interval_s=0.3,
            report_interval_s=0.5,
            poll=PollPolicy(initial_s=0.2, max_s=1.0),
            shadow=True,
            # Short would-be delays; reclaim as soon as excess shows.
            shadow_delays=ShadowDelays(create_s=1.0, configure_s=0.5, drain_margin_s=0.5),
            engine=EngineConfig(
                reclaim_hysteresis_cycles=1,
                reclaim_min_age_seconds=0,
                reclaim_window_seconds=0,
                reclaim_grace_seconds=1,  # a would-be drain takes its grace and the margin
            ),
        ),
        store=world.store,
        temporal=world.env.client,
        providers={"simcloud": world.client},
    )
    decisions = DecisionStore(world.db.engine)
    started = datetime.now(UTC)
    await shard.start()
    await world.coordinator.start()
    cluster = SimulatedCluster(
        CLUSTER,
        listen,
        DemandPattern(
            cpu=4, memory_gib=4, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
        ),
        rollup_interval_s=0.5,
    )
    cluster.start()
    try:
        provisions = await eventually(
            lambda: _decided(decisions, started, "provision"),
            within=180,
            what="the shadow shard to record the provisions it would have made",
        )
        would_be = {d.machine_id for d in provisions}

        def settled() -> bool:
            records = [shard.engine.machine(m) for m in would_be]
            return all(
                r is not None and r.state == MachineState.CONFIGURED and r.cluster == CLUSTER
                for r in records
            )

        await eventually(settled, within=60, what="the would-be machines to settle configured")
        assert shard.parts.settlement is not None
        assert shard.parts.settlement.settled["ProvisionOp"] == len(would_be)

        cluster.demand = DemandPattern(
            cpu=1, memory_gib=1, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
        )
        reclaims = await eventually(
            lambda: _decided(decisions, started, "reclaim"),
            within=120,
            what="a would-be reclaim once demand fell",
        )
        assert {d.mode for d in reclaims} == {"shadow"}
        assert {d.machine_id for d in reclaims} <= would_be

        def drained_idle() -> bool:
            records = [shard.engine.machine(d.machine_id) for d in reclaims]
            return all(r is not None and r.state == MachineState.IDLE for r in records)

        await eventually(drained_idle, within=60, what="the reclaimed machines to settle idle")

        # Still never acted: no provider mutation, no workflow, nothing in PostgreSQL.
        assert world.mutations.calls == []
        machine_types = {w.__name__ for w in ALL_WORKFLOWS}
        started_types = [w.workflow_type async for w in world.env.client.list_workflows()]
        assert [t for t in started_types if t in machine_types] == []
        async with world.db.engine.connect() as conn:
            bound = (
                await conn.execute(
                    text("SELECT count(*) FROM machines WHERE cluster_id IS NOT NULL")
                )
            ).scalar_one()
            logged = (
                await conn.execute(
                    text("SELECT count(*) FROM assignment_log WHERE cluster_id = :c"),
                    {"c": CLUSTER},
                )
            ).scalar_one()
        assert (bound, logged) == (0, 0)
        assert [m for m in (await world.client.list()).machines if m.cluster == CLUSTER] == []
    finally:
        await cluster.stop()
        await shard.stop()

    # The report closes each reclaimed machine's interval at its reclaim.
    rows = await decisions.window(
        since=datetime.fromtimestamp(started.timestamp() - 60, UTC),
        until=datetime(2100, 1, 1, tzinfo=UTC),
    )
    end = max(d.decided_at for d in rows) + 60
    [report] = compare(
        rows,
        parse_incumbent("time,cluster,node,event\n"),
        since=started.timestamp(),
        until=end,
        cluster=CLUSTER,
    ).clusters
    ours_rows = sorted(
        (d for d in rows if d.cluster_id == CLUSTER or d.kind == "release"),
        key=lambda d: d.decided_at,
    )
    # By hand from the log: each would-be machine from its provision to its first
    # reclaim (or release) after it, else to the end; no machine was provisioned twice.
    opened = {d.machine_id: d.decided_at for d in ours_rows if d.kind == "provision"}
    closed: dict[str, float] = {}
    for d in ours_rows:
        if d.kind in ("reclaim", "release") and d.machine_id in opened:
            closed.setdefault(d.machine_id, d.decided_at)
    expected = sum((closed.get(m, end) - t) / 3600 for m, t in opened.items())
    never_settling = sum((end - t) / 3600 for t in opened.values())
    [ours] = report.bigfleet
    assert closed, "some would-be machine was reclaimed"
    assert ours.machine_hours == pytest.approx(expected, abs=1e-5)
    assert ours.machine_hours < never_settling
