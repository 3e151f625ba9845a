"""Machine lifecycle throughput: transitions per second through Temporal, end to end.

``python -m bench lifecycle [--machines N] [--batch B] [--drains D] [--provider-process]``

    embedded Temporal dev server (in-memory)
    simulated cloud at near-zero latency, over gRPC (in this process, or its own)
    one worker: every machine workflow with its real activities
    N speculative machines provisioned in batches of B (ProvisionWorkflow:
      Create -> IDLE -> Configure -> CONFIGURED -> record), then D of them
      drained, each in its own DrainWorkflow (Drain -> IDLE -> record)

A *transition* is one completed lifecycle operation on one machine (Create:
SPECULATIVE -> IDLE, Configure: IDLE -> CONFIGURED, Drain: CONFIGURED -> IDLE),
counted only when the provider reports the machine in its target state at
the end. Prints JSON lines ``{"bench", "metric", "value", "unit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.context import BootstrapBlob, ProviderCalls
from activities.registry import activities_for
from bigfleet.shard.executor import MAX_BATCH
from bigfleet.temporal import free_port, start_dev_server
from bigfleet.v1alpha1 import provider_pb2
from providers.client import FencingToken, ProviderClient
from providers.config import ProviderConfig
from providers.server import start_provider_server
from workflows import search_attributes as sa
from workflows.contracts import (
    BlockedDrain,
    DrainInput,
    MachineTarget,
    NotifyReclaimInput,
    PollPolicy,
    ProvisionInput,
    ProvisionResult,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
)
from workflows.drain import DrainWorkflow
from workflows.provision import ProvisionWorkflow
from workflows.registry import ALL_WORKFLOWS, workflow_runner

SHARD = "shard-bench"
PROVIDER = "simcloud"
# Simulated seconds are scaled by this: a 60 s boot takes 0.6 ms.
TIME_FACTOR = 1e-5


@dataclass
class BenchContext:
    """A ShardContext with no store and no operator: outcomes are counted in memory."""

    client: ProviderClient
    epoch: int = 1
    outcomes: int = 0
    records: int = 0
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def shard_id(self) -> str:
        return SHARD

    def check_active(self) -> None:
        return None

    def acting_for_s(self) -> float:
        return self.client.timeout

    def provider(self, name: str) -> ProviderCalls:
        return self.client

    def next_token(self) -> FencingToken:
        return FencingToken(SHARD, self.epoch, next(self._seq))

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        raise RuntimeError(f"fenced on {machine_id}: {detail}")

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        return BootstrapBlob(b"bench-join-token", 600)

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        return None

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        self.outcomes += len(outcome.outcomes)

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        return True

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        return None

    async def start_recovery(self, recovery: RecoverInput) -> str:
        raise RuntimeError(f"{recovery.machine.machine_id} failed in a benchmark that expects none")

    async def record_machine(self, record: RecordMachineInput) -> None:
        self.records += 1


@contextlib.asynccontextmanager
async def _provider(machines: int, *, separate_process: bool) -> AsyncIterator[str]:
    """A simulated cloud with at least ``machines`` speculative slots; yields its address."""
    # About 780 non-spot slots per unit of quota scale in the shipped catalog.
    quota_scale = max(1.0, machines / 700)
    if not separate_process:
        config = ProviderConfig(
            kind="sim-cloud",
            time_factor=TIME_FACTOR,
            quota_scale=quota_scale,
            interruption_scale=0.0,
        )
        running = await start_provider_server(config, "127.0.0.1:0")
        try:
            yield running.address
        finally:
            await running.stop(grace=None)
        return
    address = f"127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bigfleet",
        "provider",
        "serve",
        "--kind",
        "sim-cloud",
        "--addr",
        address,
        "--time-factor",
        str(TIME_FACTOR),
        "--quota-scale",
        str(quota_scale),
        "--interruption-scale",
        "0",
        "--log-level",
        "WARNING",
    )
    try:
        probe = ProviderClient(address, timeout=1.0)
        for _ in range(200):
            with contextlib.suppress(Exception):
                await probe.list(max_results=1)
                break
            await asyncio.sleep(0.05)
        await probe.close()
        yield address
    finally:
        proc.terminate()
        await proc.wait()


async def _speculative(client: ProviderClient, count: int) -> list[str]:
    listing = await client.list(states=[provider_pb2.MACHINE_STATE_SPECULATIVE])
    ids = [m.id for m in listing.machines if m.capacity_type != provider_pb2.CAPACITY_TYPE_SPOT]
    if len(ids) < count:
        raise SystemExit(f"the provider has only {len(ids)} non-spot speculative machines")
    return ids[:count]


async def _provision(
    client: Client, queue: str, ids: list[str], batch: int, poll: PollPolicy
) -> tuple[int, float, int]:
    """Provision ``ids`` in batches; returns (configured, seconds, workflows)."""
    # Cut as the shard's executor cuts: at most ``batch``, and never more ids than
    # fit the BigFleetMachineIds search attribute.
    batches = sa.chunks_that_fit(ids, at_most=batch)
    started = time.perf_counter()
    handles = await asyncio.gather(
        *(
            client.start_workflow(
                ProvisionWorkflow.run,
                ProvisionInput(
                    shard_id=SHARD,
                    cluster_id="bench",
                    need_key="need",
                    priority=100_000,
                    operation_seq=1,
                    machines=[MachineTarget(m, PROVIDER) for m in chunk],
                    poll=poll,
                ),
                id=f"{SHARD}/provision/{chunk[0]}+{len(chunk) - 1}/{uuid.uuid4().hex[:6]}",
                task_queue=queue,
            )
            for chunk in batches
        )
    )
    results: list[ProvisionResult] = await asyncio.gather(*(h.result() for h in handles))
    elapsed = time.perf_counter() - started
    configured = sum(len(r.configured) for r in results)
    return configured, elapsed, len(batches)


async def _drain(client: Client, queue: str, ids: list[str], poll: PollPolicy) -> tuple[int, float]:
    started = time.perf_counter()
    handles = await asyncio.gather(
        *(
            client.start_workflow(
                DrainWorkflow.run,
                DrainInput(
                    shard_id=SHARD,
                    machine=MachineTarget(m, PROVIDER),
                    cluster_id="bench",
                    grace_seconds=0,
                    operation_seq=2,
                    poll=poll,
                ),
                id=f"{SHARD}/drain/{m}/{uuid.uuid4().hex[:6]}",
                task_queue=queue,
            )
            for m in ids
        )
    )
    results = await asyncio.gather(*(h.result() for h in handles))
    return sum(1 for r in results if r.succeeded), time.perf_counter() - started


def _runner(mode: str) -> WorkflowRunner:
    """full: the default sandbox (re-imports workflow modules per run); passthrough: the
    shard's runner (our workflow modules imported once); off: no sandbox."""
    if mode == "off":
        return UnsandboxedWorkflowRunner()
    if mode == "passthrough":
        return workflow_runner()
    return SandboxedWorkflowRunner()


def _emit(metric: str, value: float, unit: str, **extra: Any) -> None:
    line = {"bench": "lifecycle_throughput", "metric": metric, "value": round(value, 2)}
    line["unit"] = unit
    line.update(extra)
    print(json.dumps(line), flush=True)


async def run(args: argparse.Namespace) -> int:
    env = await start_dev_server(port=free_port(), ui=False)
    try:
        async with _provider(args.machines, separate_process=args.provider_process) as address:
            provider = ProviderClient(address)
            ctx = BenchContext(provider)
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            # Near-zero provider latency: the first read after each call finds the
            # machine in place, so the poll interval hardly matters.
            poll = PollPolicy(initial_s=0.05, max_s=0.5)
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=list(ALL_WORKFLOWS),
                activities=activities_for(ctx),
                max_concurrent_workflow_tasks=args.workflow_tasks,
                max_concurrent_activities=args.activities,
                max_cached_workflows=args.cached,
                workflow_runner=_runner(args.sandbox),
                graceful_shutdown_timeout=timedelta(seconds=1),
            ):
                ids = await _speculative(provider, args.machines)
                configured, seconds, workflows = await _provision(
                    env.client, queue, ids, args.batch, poll
                )
                check = [
                    m
                    for i in range(0, len(ids), 200)
                    for m in await asyncio.gather(*(provider.get(m) for m in ids[i : i + 200]))
                ]
                in_place = sum(1 for m in check if m.state == provider_pb2.MACHINE_STATE_CONFIGURED)
                transitions = 2 * min(configured, in_place)
                _emit(
                    "transitions_per_s",
                    transitions / seconds,
                    "1/s",
                    machines=args.machines,
                    batch=args.batch,
                    mean_batch=round(args.machines / workflows, 1),
                    workflows=workflows,
                    seconds=round(seconds, 2),
                    provider="process" if args.provider_process else "in-process",
                )
                _emit("machines_per_s", min(configured, in_place) / seconds, "1/s")
                if args.drains:
                    drained, seconds = await _drain(env.client, queue, ids[: args.drains], poll)
                    _emit(
                        "drain_transitions_per_s",
                        drained / seconds,
                        "1/s",
                        drains=args.drains,
                        seconds=round(seconds, 2),
                    )
            await provider.close()
    finally:
        await env.shutdown()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench lifecycle", description=__doc__)
    parser.add_argument("--machines", type=int, default=2000, help="machines to provision")
    parser.add_argument(
        "--batch",
        type=int,
        default=MAX_BATCH,
        help="at most this many machines per ProvisionWorkflow (fewer if their ids do not fit "
        "one search attribute, as in the shard's executor)",
    )
    parser.add_argument("--drains", type=int, default=200, help="per-machine drains afterwards")
    parser.add_argument(
        "--provider-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the simulated cloud from its own process (uses the second core)",
    )
    parser.add_argument("--workflow-tasks", type=int, default=100)
    parser.add_argument("--activities", type=int, default=100)
    parser.add_argument("--cached", type=int, default=1000)
    parser.add_argument(
        "--sandbox",
        choices=("full", "passthrough", "off"),
        default="passthrough",
        help="passthrough is what the shard process runs (workflows.registry.workflow_runner)",
    )
    args = parser.parse_args(argv)
    status = asyncio.run(run(args))
    # grpcio's and the Temporal core's native threads can abort the interpreter
    # during finalisation after a clean run: leave before it, keeping the status.
    atexit.register(_exit_without_finalising, status)
    return status


def _exit_without_finalising(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
