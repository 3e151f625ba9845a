"""End to end: a demo cluster's roll-up becomes configured machines on the real stack.

Real Temporal dev server (from its wheel), real PostgreSQL, the simulated
cloud provider over loopback gRPC, the shard process and a simulated cluster
operator speaking Shard/Session — all in this process, on free ports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from bigfleet.devstack import DevStack, DevStackOptions
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern
from providers.core import ProviderCore
from providers.model import FencingToken
from shard_engine.quantity import parse_quantity

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


async def _eventually(check: Callable[[], Any], *, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.25)


@pytest.fixture
async def stack(
    tmp_path: Path, empty_database_url: str
) -> AsyncIterator[tuple[DevStack, TokenRecorder]]:
    recorder = TokenRecorder()
    options = DevStackOptions(
        data_dir=tmp_path,
        database_url=empty_database_url,
        temporal_port=0,
        ui=False,
        shard_listen="127.0.0.1:0",
        time_factor=0.01,
        cycle_interval_s=0.3,
        observe_interval_s=0.3,
        rollup_interval_s=0.5,
        clusters=((CLUSTER, DemandPattern(cpu=12, memory_gib=24, priority=500_000)),),
        quota_scale=0.2,
        persist=False,
        provider_hook=recorder.attach,
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
    await _eventually(lambda: cluster.configured_nodes(), within=15, what="NodeStateUpdate frames")
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
