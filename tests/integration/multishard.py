"""Helpers for multi-shard scenarios on the real stack (dev server, Postgres, gRPC)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from bigfleet.devstack import DevStack, DevStackOptions
from bigfleet.shard.process import ShardProcess
from bigfleet.v1alpha1 import provider_pb2
from clusters.operator import DemandPattern
from tests.waiting import eventually as eventually  # re-exported for the multi-shard tests

TINY_CLOUD = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_cloud.json"
GPU_TYPE = ("node.kubernetes.io/instance-type", 1, ("p5.48xlarge",))

T = TypeVar("T")


def gpu_demand(machines: int, priority: int = 500_000) -> DemandPattern:
    """``machines`` whole p5.48xlarge machines' worth of GPUs."""
    return DemandPattern(
        cpu=1,
        memory_gib=1,
        gpus=8.0 * machines,
        min_unit_gpus=8.0,
        min_unit_cpu=1,
        min_unit_memory_gib=1,
        priority=priority,
        requirements=(GPU_TYPE,),
    )


def options(tmp: Path, db_url: str, **kw: object) -> DevStackOptions:
    base: dict[str, object] = {
        "data_dir": tmp,
        "database_url": db_url,
        "temporal_port": 0,
        "ui": False,
        "shard_listen": "127.0.0.1:0",
        "time_factor": 0.005,
        "cycle_interval_s": 0.3,
        "observe_interval_s": 0.3,
        "rollup_interval_s": 0.5,
        "report_interval_s": 0.5,
        "coordinator_interval_s": 0.5,
        "catalog_path": TINY_CLOUD,
        "persist": False,
        "shards": 2,
        "clusters": (),
        "max_instruction_share": 0.5,
    }
    base.update(kw)
    return DevStackOptions(**base)  # type: ignore[arg-type]


async def coordinator_settled(stack: DevStack, *, more_rounds: int, within: float = 60.0) -> None:
    """Wait until the coordinator has run ``more_rounds`` planning rounds from now on and
    has no instruction in progress: whatever those rounds decided has been carried out."""
    coordinator = stack.coordinator
    assert coordinator is not None
    target = int((await coordinator.status())["rounds"]) + more_rounds

    async def settled() -> bool:
        status = await coordinator.status()
        return int(status["rounds"]) >= target and not status["pending"]

    await eventually(settled, within=within, what=f"{more_rounds} more coordinator rounds")


async def configured_for(stack: DevStack, cluster: str) -> list[provider_pb2.Machine]:
    client = next(iter(stack.provider_clients.values()))
    listing = await client.list(states=[provider_pb2.MACHINE_STATE_CONFIGURED])
    return [m for m in listing.machines if m.cluster == cluster]


def shard(stack: DevStack, shard_id: str) -> ShardProcess:
    return next(p for p in stack.shards if p.shard_id == shard_id)
