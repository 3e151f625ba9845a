"""A stand-alone shard worker for the crash-resume test: killed with SIGKILL, started again.

    python -m tests.integration.crash_worker --temporal HOST:PORT --provider HOST:PORT \
        --task-queue Q --epoch N --records FILE

It serves every machine workflow with the real activities over a real
provider client (gRPC). Each process is a new lease holder, so it mints
tokens with a higher epoch than the one before, as a restarted shard does.
Recorded outcomes are appended to FILE as JSON lines, with the epoch.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from activities.context import BootstrapBlob, ShardInactive
from activities.registry import activities_for
from bigfleet.v1alpha1 import provider_pb2
from providers.client import FencingToken, ProviderClient
from workflows.contracts import (
    BlockedDrain,
    NotifyReclaimInput,
    RecordMachineInput,
    RecordOutcomesInput,
    RecoverInput,
    RequirementSpec,
)
from workflows.registry import ALL_WORKFLOWS

SHARD = "shard-crash"
PROVIDER = "sim"


class CrashContext:
    """The ShardContext of one short-lived worker process."""

    def __init__(self, provider: ProviderClient, epoch: int, records: Path) -> None:
        self._provider = provider
        self.epoch = epoch
        self._records = records
        self._seq = itertools.count(1)

    @property
    def shard_id(self) -> str:
        return SHARD

    def check_active(self) -> None:
        if self.epoch <= 0:
            raise ShardInactive("no lease")

    def acting_for_s(self) -> float:
        self.check_active()
        return self._provider.timeout

    def provider(self, name: str) -> ProviderClient:
        if name != PROVIDER:
            raise KeyError(name)
        return self._provider

    def next_token(self) -> FencingToken:
        return FencingToken(SHARD, self.epoch, next(self._seq))

    def on_fenced(self, provider: str, machine_id: str, detail: str) -> None:
        self.epoch = 0

    async def request_bootstrap(
        self, cluster_id: str, requirements: Sequence[RequirementSpec], *, wait_seconds: float
    ) -> BootstrapBlob:
        return BootstrapBlob(b"join", 600)

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        pass

    async def record_outcomes(self, outcome: RecordOutcomesInput) -> None:
        self._append({"batch": asdict(outcome)})

    def send_reclaim(self, instruction: NotifyReclaimInput) -> bool:
        return False

    def report_blocked_drain(self, report: BlockedDrain) -> None:
        pass

    async def start_recovery(self, recovery: RecoverInput) -> str:
        raise NotImplementedError("not exercised by the crash test")

    async def record_machine(self, record: RecordMachineInput) -> None:
        self._append({"epoch": self.epoch, "record": asdict(record)})

    def _append(self, line: dict[str, object]) -> None:
        with self._records.open("a") as f:
            f.write(json.dumps(line) + "\n")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--records", type=Path, required=True)
    args = parser.parse_args(argv)
    client = await Client.connect(args.temporal)
    provider = ProviderClient(args.provider)
    ctx = CrashContext(provider, args.epoch, args.records)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=list(ALL_WORKFLOWS),
        activities=activities_for(ctx),
        # A dead worker's cached workflows wait this long on its sticky queue
        # before another worker may take them (the default is several seconds).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    print(f"worker epoch {args.epoch} polling {args.task_queue}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
