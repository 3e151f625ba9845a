"""Crash-resume with real processes: SIGKILL the worker mid-drain, start another, no second Drain.

    test process: Temporal dev server · simulated cloud over gRPC (slow drains)
    worker subprocess #1 (epoch 1): starts the drain, then is SIGKILLed
    worker subprocess #2 (epoch 2): picks the workflow up from its history,
                                    waits the drain out, records the outcome

The provider's recorded calls prove exactly one Drain (one operation id);
the outcome is recorded once, by the second worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from bigfleet.temporal import start_dev_server
from bigfleet.v1alpha1 import provider_pb2
from providers.client import ProviderClient
from providers.config import LatencyRange, ProviderConfig
from providers.core import ProviderCore
from providers.kinds import build_provider
from providers.model import Ack, FencingToken
from providers.server import RunningProvider, start_provider_server
from workflows.contracts import (
    DRAIN_MACHINE,
    Deadlines,
    DrainInput,
    MachineTarget,
    PollPolicy,
)
from workflows.drain import DrainWorkflow

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# 60 simulated seconds of workloads leaving, at 0.15 s per simulated second: ~9 s.
TIME_FACTOR = 0.15


@dataclass
class DrainRecorder:
    """Wraps the provider core's Drain: every call, its token and the operation it got."""

    calls: list[tuple[str, int, FencingToken | None, str]] = field(default_factory=list)

    def attach(self, core: ProviderCore) -> None:
        original: Callable[..., Ack] = core.drain

        def drain(
            machine_id: str, grace_seconds: int = 0, token: FencingToken | None = None
        ) -> Ack:
            ack = original(machine_id, grace_seconds, token)
            self.calls.append((machine_id, grace_seconds, token, ack.operation_id))
            return ack

        core.drain = drain  # type: ignore[method-assign]


@dataclass
class Rig:
    env: WorkflowEnvironment
    provider: RunningProvider
    recorder: DrainRecorder
    client: ProviderClient
    tmp: Path
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    @property
    def temporal_address(self) -> str:
        return self.env.client.service_client.config.target_host

    async def worker(
        self, task_queue: str, epoch: int, records: Path
    ) -> asyncio.subprocess.Process:
        log = (self.tmp / f"worker-{epoch}.log").open("w")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.crash_worker",
            "--temporal",
            self.temporal_address,
            "--provider",
            self.provider.address,
            "--task-queue",
            task_queue,
            "--epoch",
            str(epoch),
            "--records",
            str(records),
            cwd=REPO,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.procs.append(proc)
        return proc


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    env = await start_dev_server(ui=False)
    config = ProviderConfig(
        kind="sim-cloud",
        quota_scale=0.1,
        interruption_scale=0.0,
        time_factor=TIME_FACTOR,
        create_latency_s=LatencyRange(1.0, 1.0),
        configure_latency_s=LatencyRange(1.0, 1.0),
        drain_latency_s=LatencyRange(60.0, 60.0),
    )
    core = build_provider(config)
    recorder = DrainRecorder()
    recorder.attach(core)
    provider = await start_provider_server(config, "127.0.0.1:0", provider=core)
    client = ProviderClient(provider.address)
    rig = Rig(env, provider, recorder, client, tmp_path)
    try:
        yield rig
    finally:
        for proc in rig.procs:
            if proc.returncode is None:
                proc.kill()  # only the workers this test started
                await proc.wait()
        await client.close()
        await provider.stop()
        await env.shutdown()


async def _configured_machine(rig: Rig) -> str:
    listing = await rig.client.list(states=[provider_pb2.MACHINE_STATE_SPECULATIVE])
    machine_id = listing.machines[0].id
    await rig.client.create(machine_id, FencingToken("setup", 1, 1))
    await _until(rig, machine_id, provider_pb2.MACHINE_STATE_IDLE)
    await rig.client.configure(machine_id, "c1", b"blob", FencingToken("setup", 1, 2))
    await _until(rig, machine_id, provider_pb2.MACHINE_STATE_CONFIGURED)
    return machine_id


async def _until(rig: Rig, machine_id: str, state: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while (await rig.client.get(machine_id)).state != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"{machine_id} never reached state {state}")
        await asyncio.sleep(0.05)


async def _drain_activity_completed(handle: WorkflowHandle[Any, Any], within: float) -> None:
    """Wait until the workflow's history holds a completed Drain activity."""
    deadline = time.monotonic() + within
    while True:
        history = await handle.fetch_history()
        scheduled = {
            e.event_id
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == DRAIN_MACHINE
        }
        if any(
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
            for e in history.events
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError("the drain activity never completed")
        await asyncio.sleep(0.1)


async def test_a_drain_survives_a_killed_worker_without_a_second_provider_drain(
    rig: Rig,
) -> None:
    machine_id = await _configured_machine(rig)
    queue = f"shard-crash-{uuid.uuid4().hex[:8]}"
    records = rig.tmp / "records.jsonl"
    first = await rig.worker(queue, epoch=1, records=records)

    handle = await rig.env.client.start_workflow(
        DrainWorkflow.run,
        DrainInput(
            shard_id="shard-crash",
            machine=MachineTarget(machine_id, "sim"),
            cluster_id="c1",
            grace_seconds=120,
            operation_seq=1,
            deadlines=Deadlines(draining_margin_s=300),
            poll=PollPolicy(initial_s=0.25, max_s=1.0),
        ),
        id=f"shard-crash/drain/{machine_id}/1",
        task_queue=queue,
    )
    await _drain_activity_completed(handle, within=90)
    assert (await rig.client.get(machine_id)).state == provider_pb2.MACHINE_STATE_DRAINING

    first.send_signal(signal.SIGKILL)
    assert await first.wait() == -signal.SIGKILL
    assert not records.exists(), "the first worker must not have finished the drain"

    await rig.worker(queue, epoch=2, records=records)
    result = await asyncio.wait_for(handle.result(), timeout=60)

    assert result.state == "IDLE" and result.succeeded
    assert (await rig.client.get(machine_id)).state == provider_pb2.MACHINE_STATE_IDLE
    drains = rig.recorder.calls
    assert len(drains) == 1, f"a second provider Drain was sent: {drains}"
    (_, grace, token, _) = drains[0]
    assert grace == 120 and token is not None and token.epoch == 1
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 1, "the outcome is recorded exactly once"
    assert lines[0]["epoch"] == 2, "the second worker finished the workflow"
    assert lines[0]["record"]["operation"] == "drain"
    assert lines[0]["record"]["outcome"]["state"] == "IDLE"
