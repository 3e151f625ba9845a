"""A simulated cluster operator: roll-ups on a cadence, bootstrap answers, node tracking.

It behaves as a real operator would on the wire: Hello first, full-replacement
roll-ups with increasing timestamps, a ``BootstrapBlobResponse`` echoing each
``request_id``, a ``ReclaimAck`` for each reclaim instruction, and it keeps the
latest ``NodeStateUpdate`` per machine as its view of upcoming nodes. Dialling,
reconnecting and following redirects are ``clusters.session.OperatorSession``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from bigfleet.v1alpha1 import capacity_pb2, provider_pb2, shard_pb2
from clusters.session import OperatorSession, insecure_channel

log = logging.getLogger(__name__)

__all__ = ["ClusterNode", "DemandPattern", "SimulatedCluster"]


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
        # Mutual TLS: called on every (re)connect, so a rotated certificate is picked up.
        self.credentials = credentials
        self.session = OperatorSession(
            cluster_id, shard_address, self, channel_factory=self._channel, standbys=standbys
        )
        self.demand = demand
        self.rollup_interval_s = rollup_interval_s
        self.clock = clock
        self.bootstrap_error = bootstrap_error
        self.nodes: dict[str, ClusterNode] = {}
        self.acks: list[str] = []
        self.bootstrap_requests = 0
        self.reclaims: list[shard_pb2.ReclaimInstruction] = []
        self.connected = asyncio.Event()
        self._started = clock()

    # ----------------------------------------------------------- running

    def start(self) -> None:
        self.session.start()

    async def stop(self) -> None:
        await self.session.stop()

    @property
    def shard_address(self) -> str:
        """Where the operator's session dials now (after redirects and standby rotation)."""
        return self.session.shard_address

    @property
    def redirects(self) -> list[str]:
        """Shard addresses this operator was redirected to (its cluster moved shard)."""
        return self.session.redirects

    @property
    def endings(self) -> list[str]:
        """How each session ended (gRPC status code names), oldest first."""
        return self.session.endings

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

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self.credentials is None:
            return insecure_channel(address)
        return grpc.aio.secure_channel(address, self.credentials())

    # ------------------------------------------------- clusters.session.SessionHandler

    def opened(self, ack: shard_pb2.Acknowledgement) -> None:
        self.acks.append(ack.echo)
        self.connected.set()

    async def sending(self) -> None:
        """A full roll-up every ``rollup_interval_s`` while the session lasts."""
        while True:
            await self.session.send(shard_pb2.OperatorMessage(rollup=self.rollup()))
            await asyncio.sleep(self.rollup_interval_s)

    async def received(self, frame: shard_pb2.ShardMessage) -> None:
        kind = frame.WhichOneof("payload")
        if kind == "ack":
            self.acks.append(frame.ack.echo)
            if frame.ack.echo.startswith("rollup-rejected"):
                log.warning("cluster %s: %s", self.cluster_id, frame.ack.echo)
        elif kind == "bootstrap_request":
            await self.session.send(self._bootstrap(frame.bootstrap_request))
        elif kind == "node_state_update":
            self._node_update(frame.node_state_update)
        elif kind == "reclaim_instruction":
            self.reclaims.append(frame.reclaim_instruction)
            await self.session.send(
                shard_pb2.OperatorMessage(
                    reclaim_ack=shard_pb2.ReclaimAck(
                        instruction_id=frame.reclaim_instruction.instruction_id,
                        nodes_started=len(frame.reclaim_instruction.nodes),
                    )
                )
            )

    def closed(self, ending: str) -> None:
        self.connected.clear()

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
