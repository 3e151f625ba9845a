"""A simulated cluster operator: roll-ups on a cadence, bootstrap answers, node tracking.

It behaves as a real operator would on the wire: Hello first, full-replacement
roll-ups with increasing timestamps, a ``BootstrapBlobResponse`` echoing each
``request_id``, a ``ReclaimAck`` for each reclaim instruction, and it keeps the
latest ``NodeStateUpdate`` per machine as its view of upcoming nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc

from bigfleet.v1alpha1 import capacity_pb2, provider_pb2, shard_pb2, shard_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["ClusterNode", "DemandPattern", "SimulatedCluster"]

PROTOCOL_VERSION = "bigfleet.v1alpha1"


@dataclass(frozen=True)
class DemandPattern:
    """Demand that changes over time: a base plus a slow wave, in CPU cores and GiB.

    ``period_s`` of 0 keeps demand constant. ``min_unit`` is per machine.
    """

    cpu: float
    memory_gib: float
    priority: int = 100_000
    amplitude: float = 0.0
    period_s: float = 0.0
    min_unit_cpu: float = 1.0
    min_unit_memory_gib: float = 2.0
    requirements: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    interruption_bucket: int = capacity_pb2.PENALTY_BUCKET_8
    gpus: float = 0.0
    min_unit_gpus: float = 0.0

    def at(self, t: float) -> tuple[float, float]:
        """(cpu, memory GiB) demanded ``t`` seconds after start."""
        factor = 1.0
        if self.period_s > 0 and self.amplitude:
            factor += self.amplitude * math.sin(2 * math.pi * t / self.period_s)
        return max(0.0, self.cpu * factor), max(0.0, self.memory_gib * factor)


@dataclass
class ClusterNode:
    """The operator's view of one machine coming to (or leaving) the cluster."""

    machine_id: str
    state: int
    node_name: str = ""
    last_error: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def state_name(self) -> str:
        return provider_pb2.MachineState.Name(self.state).removeprefix("MACHINE_STATE_")  # type: ignore[arg-type]


class SimulatedCluster:
    """One cluster's operator, connected to its shard."""

    def __init__(
        self,
        cluster_id: str,
        shard_address: str,
        demand: DemandPattern,
        *,
        rollup_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        bootstrap_error: str = "",
        credentials: Callable[[], grpc.ChannelCredentials] | None = None,
        standbys: Sequence[str] = (),
    ) -> None:
        self.cluster_id = cluster_id
        # Addresses of the shard's other processes (a standby for its lease): a
        # session ending UNAVAILABLE (the process stopped acting, or is gone) tries
        # the next one, as an operator behind a service address would reach them.
        self._addresses = [shard_address, *[a for a in standbys if a != shard_address]]
        # Mutual TLS: called on every (re)connect, so a rotated certificate is picked up.
        self.credentials = credentials
        self.shard_address = shard_address
        self.demand = demand
        self.rollup_interval_s = rollup_interval_s
        self.clock = clock
        self.bootstrap_error = bootstrap_error
        self.nodes: dict[str, ClusterNode] = {}
        self.acks: list[str] = []
        self.bootstrap_requests = 0
        self.reclaims: list[shard_pb2.ReclaimInstruction] = []
        self.connected = asyncio.Event()
        # Shard addresses this operator was redirected to (its cluster moved shard).
        self.redirects: list[str] = []
        # How each session ended (gRPC status code names), oldest first.
        self.endings: list[str] = []
        self._started = clock()
        self._outbox: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------- running

    def start(self) -> None:
        self._task = asyncio.create_task(self._run_forever(), name=f"cluster-{self.cluster_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def configured_nodes(self) -> list[ClusterNode]:
        configured = provider_pb2.MACHINE_STATE_CONFIGURED
        return [n for n in self.nodes.values() if n.state == configured]

    def rollup(self) -> capacity_pb2.ClusterCapacityNeeds:
        """The cluster's current full demand."""
        cpu, mem = self.demand.at(self.clock() - self._started)
        d = self.demand
        need = capacity_pb2.CapacityNeed(
            requirements=[
                capacity_pb2.NodeSelectorRequirement(key=k, operator=op, values=list(v))  # type: ignore[arg-type]
                for k, op, v in d.requirements
            ],
            aggregate_resources=self._aggregate(cpu, mem),
            priority=d.priority,
            interruption_penalty_bucket=d.interruption_bucket,  # type: ignore[arg-type]
            reclamation_penalty_bucket=capacity_pb2.PENALTY_BUCKET_8,
            min_unit=self._min_unit(),
        )
        return capacity_pb2.ClusterCapacityNeeds(
            cluster_id=self.cluster_id,
            timestamp_unix_nanos=time.time_ns(),
            needs=[need] if cpu > 0 else [],
        )

    def _aggregate(self, cpu: float, mem: float) -> dict[str, str]:
        out = {"cpu": f"{round(cpu * 1000)}m", "memory": f"{round(mem * 1024)}Mi"}
        if self.demand.gpus > 0:
            out["nvidia.com/gpu"] = f"{round(self.demand.gpus)}"
        return out

    def _min_unit(self) -> dict[str, str]:
        d = self.demand
        out = {
            "cpu": f"{round(d.min_unit_cpu * 1000)}m",
            "memory": f"{round(d.min_unit_memory_gib * 1024)}Mi",
        }
        if d.min_unit_gpus > 0:
            out["nvidia.com/gpu"] = f"{round(d.min_unit_gpus)}"
        return out

    async def _run_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._session()
                backoff = 0.2
            except grpc.aio.AioRpcError as err:
                log.info("cluster %s: session ended: %s", self.cluster_id, err.code().name)
                self.endings.append(err.code().name)
                if (
                    err.code() == grpc.StatusCode.UNAVAILABLE
                    and self.shard_address in self._addresses
                ):
                    at = self._addresses.index(self.shard_address)
                    self.shard_address = self._addresses[(at + 1) % len(self._addresses)]
                moved_to = _redirect(err)
                if moved_to and moved_to != self.shard_address:
                    log.info(
                        "cluster %s: now served at %s; reconnecting", self.cluster_id, moved_to
                    )
                    self.shard_address = moved_to
                    self.redirects.append(moved_to)
                    backoff = 0.2
            self.connected.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _requests(self) -> AsyncIterator[shard_pb2.OperatorMessage]:
        yield shard_pb2.OperatorMessage(
            hello=shard_pb2.Hello(cluster_id=self.cluster_id, protocol_version=PROTOCOL_VERSION)
        )
        while True:
            msg = await self._outbox.get()
            if msg is None:
                return
            yield msg

    async def _rollups(self) -> None:
        while True:
            await self._outbox.put(shard_pb2.OperatorMessage(rollup=self.rollup()))
            await asyncio.sleep(self.rollup_interval_s)

    async def _session(self) -> None:
        self._outbox = asyncio.Queue()
        async with (
            grpc.aio.secure_channel(self.shard_address, self.credentials())
            if self.credentials is not None
            else grpc.aio.insecure_channel(self.shard_address)
        ) as channel:
            stub = shard_pb2_grpc.ShardStub(channel)
            call = stub.Session(self._requests())
            sender: asyncio.Task[None] | None = None
            try:
                async for frame in call:
                    kind = frame.WhichOneof("payload")
                    if kind == "ack":
                        self.acks.append(frame.ack.echo)
                        if frame.ack.echo == "hello":
                            self.connected.set()
                            sender = asyncio.create_task(self._rollups())
                        elif frame.ack.echo.startswith("rollup-rejected"):
                            log.warning("cluster %s: %s", self.cluster_id, frame.ack.echo)
                    elif kind == "bootstrap_request":
                        await self._outbox.put(self._bootstrap(frame.bootstrap_request))
                    elif kind == "node_state_update":
                        self._node_update(frame.node_state_update)
                    elif kind == "reclaim_instruction":
                        self.reclaims.append(frame.reclaim_instruction)
                        await self._outbox.put(
                            shard_pb2.OperatorMessage(
                                reclaim_ack=shard_pb2.ReclaimAck(
                                    instruction_id=frame.reclaim_instruction.instruction_id,
                                    nodes_started=len(frame.reclaim_instruction.nodes),
                                )
                            )
                        )
            finally:
                if sender is not None:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sender
                # End this session's request stream. A call the shard ended is not
                # cancelled by closing the channel, so gRPC's task that feeds it from
                # _requests() would wait on this queue for ever (one task per session).
                self._outbox.put_nowait(None)

    def _bootstrap(self, req: shard_pb2.BootstrapRequest) -> shard_pb2.OperatorMessage:
        self.bootstrap_requests += 1
        if self.bootstrap_error:
            resp = shard_pb2.BootstrapBlobResponse(
                request_id=req.request_id, error=self.bootstrap_error
            )
        else:
            blob = json.dumps(
                {
                    "kind": "JoinConfiguration",
                    "cluster": self.cluster_id,
                    "token": secrets.token_urlsafe(24),
                    "labels": {r.key: (r.values[0] if r.values else "") for r in req.requirements},
                }
            ).encode()
            resp = shard_pb2.BootstrapBlobResponse(
                request_id=req.request_id, user_data=blob, ttl_seconds=900
            )
        return shard_pb2.OperatorMessage(bootstrap_response=resp)

    def _node_update(self, upd: shard_pb2.NodeStateUpdate) -> None:
        if upd.cluster_id != self.cluster_id:
            log.warning("cluster %s got an update for %s", self.cluster_id, upd.cluster_id)
            return
        self.nodes[upd.machine_id] = ClusterNode(
            upd.machine_id, int(upd.state), upd.node_name, upd.last_error, dict(upd.labels)
        )


def _redirect(err: grpc.aio.AioRpcError) -> str:
    """The address a shard told us to reconnect to (trailing metadata), or ''."""
    if err.code() != grpc.StatusCode.ABORTED:
        return ""
    pairs = cast("Iterable[tuple[str, str | bytes]]", err.trailing_metadata() or ())
    value = dict(pairs).get("bigfleet-shard-address", "")
    return value if isinstance(value, str) else ""
