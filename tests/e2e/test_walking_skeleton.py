"""End to end: a demo cluster's roll-up becomes configured machines on the real stack.

Real Temporal dev server (from its wheel), real PostgreSQL, the simulated
cloud provider over loopback gRPC, the shard process and a simulated cluster
operator speaking Shard/Session — all in this process, on free ports.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from bigfleet.devstack import DevStack
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern
from providers.core import ProviderCore
from providers.model import FencingToken
from shard_engine.quantity import parse_quantity
from tests.e2e.stacks import one_shard
from tests.waiting import eventually as _eventually

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-alpha"
MUTATIONS = ("create", "configure", "drain", "delete")


class TokenRecorder:
    """Wraps a provider core's mutating methods to record the token each call carried."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, FencingToken | None]] = []

    def attach(self, core: ProviderCore) -> None:
        for name in MUTATIONS:
            original = getattr(core, name)
            setattr(core, name, self._recording(name, original))

    def _recording(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(machine_id: str, *args: Any, **kwargs: Any) -> Any:
            token = kwargs.get("token")
            if token is None:
                token = next((a for a in args if isinstance(a, FencingToken)), None)
            self.calls.append((name, machine_id, token))
            return original(machine_id, *args, **kwargs)

        return call


@pytest.fixture
async def stack(
    tmp_path: Path, empty_database_url: str
) -> AsyncIterator[tuple[DevStack, TokenRecorder]]:
    recorder = TokenRecorder()
    options = one_shard(
        tmp_path,
        empty_database_url,
        ((CLUSTER, DemandPattern(cpu=12, memory_gib=24, priority=500_000)),),
        provider_hook=recorder.attach,
        metrics_listen="127.0.0.1:0",
        temporal_metrics_listen="127.0.0.1:0",
    )
    dev = DevStack(options)
    try:
        await dev.start()
        yield dev, recorder
    finally:
        await dev.stop()


async def test_a_cluster_rollup_becomes_configured_machines(
    stack: tuple[DevStack, TokenRecorder],
) -> None:
    dev, recorder = stack
    assert dev.shard is not None and dev.client is not None
    (cluster,) = dev.clusters
    provider = next(iter(dev.provider_clients.values()))

    async def configured_cpu() -> float:
        listing = await provider.list(states=[provider_pb2.MACHINE_STATE_CONFIGURED])
        total = 0.0
        for m in listing.machines:
            if m.cluster == CLUSTER:
                total += parse_quantity(m.allocatable.resources["cpu"])
        return total if total >= 12 else 0.0

    await _eventually(configured_cpu, within=90, what="12 cores configured for the cluster")

    # The operator was told about its nodes over the session.
    await _eventually(lambda: cluster.configured_nodes(), within=60, what="NodeStateUpdate frames")
    assert "rollup" in cluster.acks and cluster.bootstrap_requests >= 1

    # The machines' workflows completed in Temporal and are findable by cluster.
    async def completed() -> list[Any]:
        found = [
            wf
            async for wf in dev.client.list_workflows(f"BigFleetClusterId='{CLUSTER}'")  # type: ignore[union-attr]
        ]
        done = [w for w in found if w.status == WorkflowExecutionStatus.COMPLETED]
        return done if done and len(done) == len(found) else []

    workflows = await _eventually(completed, within=30, what="completed workflows in visibility")
    assert all(w.workflow_type == "ProvisionWorkflow" for w in workflows)

    # Every provider mutation carried this shard's fencing token at its current epoch.
    assert recorder.calls, "no provider mutation was recorded"
    for name, machine_id, token in recorder.calls:
        assert token is not None and token.shard_id == "shard-0", (name, machine_id, token)
        assert token.epoch == dev.shard.epoch
    sequences = [t.sequence for _, _, t in recorder.calls if t is not None]
    assert len(set(sequences)) == len(sequences)

    # The store recorded each configured machine's binding exactly once.
    assert dev.store is not None
    bound = [m for m in await dev.store.machines("shard-0") if m.cluster_id == CLUSTER]
    assert bound and all(m.operation_seq >= 1 for m in bound)
    for m in bound:
        log = await dev.store.assignment_log(m.machine_id)
        assert [op for op, _, _ in log].count("provision") + [op for op, _, _ in log].count(
            "configure"
        ) == 1


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        body: str = response.read().decode()
    return body


def _value(body: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus' text format (0 when absent)."""
    for line in body.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


async def test_every_part_of_the_stack_serves_its_metrics(
    stack: tuple[DevStack, TokenRecorder],
) -> None:
    dev, _ = stack
    assert dev.metrics is not None and dev.shard is not None
    shard = dev.shard.shard_id

    # Counters are per process and other tests ran stacks here before: compare with now.
    before = await asyncio.to_thread(_scrape, dev.metrics.address)
    provisions = _value(before, "bigfleet_shard_actions_total", shard=shard, kind="provision")

    async def provisioned() -> str:
        body = await asyncio.to_thread(_scrape, dev.metrics.address)  # type: ignore[union-attr]
        grew = _value(body, "bigfleet_shard_actions_total", shard=shard, kind="provision")
        connected = _value(body, "bigfleet_shard_sessions_open", shard=shard) == 1
        return body if grew > provisions and connected else ""

    body = await _eventually(provisioned, within=60, what="provisioning counted in /metrics")

    assert _value(body, "bigfleet_shard_cycle_duration_seconds_count", shard=shard) > 0
    assert _value(body, "bigfleet_shard_cycle_phase_duration_seconds_count", phase="phase1") > 0
    assert _value(body, "bigfleet_shard_lease_held", shard=shard) == 1
    assert _value(body, "bigfleet_shard_lease_epoch", shard=shard) >= 1
    assert _value(body, "bigfleet_shard_rollups_total", shard=shard, outcome="applied") > 0
    assert _value(body, "bigfleet_shard_sessions_open", shard=shard) == 1
    assert _value(body, "bigfleet_workflow_starts_total", type="ProvisionWorkflow") > 0
    assert _value(body, "bigfleet_provider_client_calls_total", method="List", code="OK") > 0
    assert _value(body, "bigfleet_provider_requests_total", method="List", code="OK") > 0
    assert _value(body, "bigfleet_coordinator_term") >= 1
    assert "bigfleet_shard_unmet_needs" in body and "bigfleet_reconcile_repairs_total" in body
    sdk = await asyncio.to_thread(_scrape, dev.temporal_metrics_address)
    assert "temporal_" in sdk
