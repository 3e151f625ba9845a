"""A pause is durable: a paused shard SIGKILLed and replaced stays paused, and resumes on request.

The first shard is a real subprocess (``bigfleet shard``) started while
PostgreSQL already records the pause; its successor runs in this process.
Neither may make a mutating provider call or start a machine workflow
while paused, though both take roll-ups and run cycles (their decision log
says ``actuation paused``). Resuming lets the successor provision within
a few cycles. Deadlines bound hangs on a loaded machine; nothing is timed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from bigfleet.decisions import Decision
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store.controls import ControlStore
from bigfleet.store.decisions import DecisionStore
from clusters.operator import DemandPattern, SimulatedCluster
from shard_engine.pending import REASON_PAUSED
from tests.integration.adoption.stack import World, world
from tests.integration.multishard import eventually
from tests.ports import free_port
from workflows.contracts import PollPolicy
from workflows.registry import ALL_WORKFLOWS

pytestmark = pytest.mark.e2e

__all__ = ["world"]

SHARD = "shard-0"
CLUSTER = "c-pause"
SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))


def _spawn(world: World, listen: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        BIGFLEET_DATABASE_URL=world.url,
        BIGFLEET_TEMPORAL_ADDRESS=world.temporal_address,
        BIGFLEET_PROVIDERS=f"simcloud={world.provider.address}",
        BIGFLEET_SHARD_ID=SHARD,
        BIGFLEET_SHARD_LISTEN=listen,
        BIGFLEET_CYCLE_SECONDS="0.3",
        BIGFLEET_OBSERVE_SECONDS="0.3",
        BIGFLEET_REPORT_SECONDS="0.5",
        BIGFLEET_LEASE_TTL_SECONDS="6",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bigfleet", "shard"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def _paused_rows(store: DecisionStore, since: datetime) -> list[Decision] | None:
    rows = await store.window(
        since=since, until=datetime(2100, 1, 1, tzinfo=UTC), cluster_id=CLUSTER
    )
    paused = [d for d in rows if d.mode == "paused" and d.reason == REASON_PAUSED]
    return paused or None


async def _machine_workflows(world: World) -> list[str]:
    names = {w.__name__ for w in ALL_WORKFLOWS}
    return [w.id async for w in world.env.client.list_workflows() if w.workflow_type in names]


async def _configured_for_cluster(world: World) -> bool:
    return any(m.cluster == CLUSTER for m in (await world.client.list()).machines)


def _paused_gauge() -> float | None:
    return REGISTRY.get_sample_value("bigfleet_shard_paused", {"shard": SHARD})


async def test_a_paused_shard_stays_paused_across_a_sigkill_and_resumes_on_request(
    world: World, tmp_path: Path
) -> None:
    controls = ControlStore(world.db.engine)
    decisions = DecisionStore(world.db.engine)
    await controls.set(SHARD, paused=True, reason="adoption drill", changed_by="test")
    listen = f"127.0.0.1:{free_port()}"
    log = tmp_path / "shard.log"
    since = datetime.now(UTC)
    first = _spawn(world, listen, log)
    cluster = SimulatedCluster(
        CLUSTER,
        listen,
        DemandPattern(
            cpu=4, memory_gib=4, min_unit_cpu=1, min_unit_memory_gib=1, requirements=(SMALL,)
        ),
        rollup_interval_s=0.5,
    )
    successor: ShardProcess | None = None
    try:
        await world.coordinator.start()
        cluster.start()
        seen = await eventually(
            lambda: _paused_rows(decisions, since),
            within=240,
            what="the paused subprocess shard to record 'actuation paused' for the cluster",
        )
        assert {d.shard_id for d in seen} == {SHARD}
        assert world.mutations.calls == []
        assert await _machine_workflows(world) == []

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = datetime.now(UTC)

        successor = ShardProcess(
            ShardOptions(
                shard_id=SHARD,
                listen=listen,
                holder="successor",
                lease_ttl_s=6,
                cycle_interval_s=0.3,
                observe_interval_s=0.3,
                report_interval_s=0.5,
                poll=PollPolicy(initial_s=0.2, max_s=1.0),
            ),
            store=world.store,
            temporal=world.env.client,
            providers={"simcloud": world.client},
        )
        await successor.start()  # stands by until the dead process's lease expires
        await eventually(
            lambda: _paused_rows(decisions, killed_at),
            within=240,
            what="the successor to take over and record its own paused cycles",
        )
        assert successor.adoption.modes.paused
        assert successor.adoption.control.reason == "adoption drill"
        assert _paused_gauge() == 1.0
        assert world.mutations.calls == []
        assert await _machine_workflows(world) == []

        await controls.set(SHARD, paused=False, changed_by="test")
        await eventually(
            lambda: bool(world.mutations.of("create")) or None,
            within=120,
            what="a Create once resumed",
        )
        await eventually(
            lambda: _configured_for_cluster(world), within=240, what="a machine for the cluster"
        )
        assert not successor.adoption.modes.paused
        assert _paused_gauge() == 0.0
        assert await _machine_workflows(world) != []
    except BaseException:
        print(log.read_text(errors="replace")[-20_000:])
        raise
    finally:
        await cluster.stop()
        if successor is not None:
            await successor.stop()
        if first.poll() is None:
            first.kill()
            first.wait()
