"""A count budget holds over the whole fleet: two shards together never drain more than N.

The real stack in one process: Temporal dev server, PostgreSQL, the
simulated cloud over gRPC, two shard processes and the coordinator. Each
shard serves one cluster holding a few machines; demand then falls to one
machine each, so both shards want to reclaim at once. The budget allows one
machine draining fleet-wide; each shard alone would allow itself one, so
without the coordinator's dealing the two shards would drain two together.
A watcher lists the cloud's draining machines every 50 ms for the whole
run. Deadlines bound hangs; nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bigfleet.cli import app
from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern
from shard_engine.budgets import Budget
from shard_engine.config import EngineConfig
from tests.integration.multishard import configured_for, options, shard
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))
CLUSTERS = ("c-east", "c-west")
CAP = 1


def _demand(cpu: float) -> DemandPattern:
    return DemandPattern(
        cpu=cpu, memory_gib=cpu, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
    )


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    dev = DevStack(
        options(
            tmp_path,
            empty_database_url,
            clusters=tuple((c, _demand(6)) for c in CLUSTERS),
            engine=EngineConfig(
                reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
            ),
            budgets=(Budget("one-fleet-wide", count=CAP),),
            drain_seconds=1.0,
        )
    )
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def test_two_shards_never_drain_more_than_a_fleet_wide_count(
    stack: DevStack, tmp_path: Path
) -> None:
    assert stack.store is not None
    owners = {c: await stack.store.assign_cluster(c) for c in CLUSTERS}
    assert sorted(owners.values()) == ["shard-0", "shard-1"], "one cluster per shard"
    for cluster_id in CLUSTERS:

        async def grown(c: str = cluster_id) -> list[provider_pb2.Machine] | None:
            found = await configured_for(stack, c)
            return found if len(found) >= 3 else None

        await eventually(grown, within=240, what=f"machines for {cluster_id}")

    client = next(iter(stack.provider_clients.values()))
    peak = 0
    drained: set[str] = set()
    watching = True

    async def watch() -> None:
        nonlocal peak
        while watching:
            listing = await client.list(states=[provider_pb2.MACHINE_STATE_DRAINING])
            ours = [m for m in listing.machines if m.cluster in CLUSTERS]
            peak = max(peak, len(ours))
            drained.update(f"{m.cluster}/{m.id}" for m in ours)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        for running in stack.clusters:
            running.demand = _demand(1)  # one machine each is enough now

        async def both_reclaimed_twice() -> bool:
            per_cluster = {c: sum(1 for d in drained if d.startswith(f"{c}/")) for c in CLUSTERS}
            return all(n >= 2 for n in per_cluster.values())

        await eventually(both_reclaimed_twice, within=300, what="reclaims on both shards")
    finally:
        watching = False
        await watcher
    assert peak <= CAP, f"{peak} machines draining at once under a fleet-wide cap of {CAP}"
    # Both shards were dealt the count in turn, and each knows its share.
    for shard_id in owners.values():
        shares = shard(stack, shard_id).engine.budget_shares
        assert shares is not None and set(shares) == {"one-fleet-wide"}
    assert stack.coordinator is not None
    status = await stack.coordinator.status()
    granted = status["budget_shares"]
    assert set(granted) == {"shard-0", "shard-1"}
    assert sum(g["one-fleet-wide"] for g in granted.values()) <= CAP

    # `bigfleet budgets` shows the shares the coordinator dealt.
    budgets_file = tmp_path / "budgets.json"
    budgets_file.write_text(json.dumps([{"name": "one-fleet-wide", "nodes": CAP}]))
    (name, provider) = next(iter(stack.provider_clients.items()))
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["budgets"],
        env={
            "BIGFLEET_DATABASE_URL": stack.options.database_url or "",
            "BIGFLEET_TEMPORAL_ADDRESS": _temporal_address(stack),
            "BIGFLEET_PROVIDERS": f"{name}={provider.address}",
            "BIGFLEET_BUDGETS_FILE": str(budgets_file),
            "BIGFLEET_DATA_DIR": str(tmp_path / "elsewhere"),
        },
    )
    assert result.exit_code == 0, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.strip().startswith("shares:")]
    assert "shard-0=" in line and "shard-1=" in line


def _temporal_address(stack: DevStack) -> str:
    assert stack.client is not None
    return stack.client.service_client.config.target_host
