"""The adapter's side of ``bigfleet.v1alpha1.Shard/Session``: an operator for one cluster.

It dials the shard, sends Hello with the cluster id, then full-replacement
roll-ups whenever the pool's demand changes (and on a cadence, so a
restarted shard hears from it soon). It answers BootstrapRequests from the
pool's template, acknowledges ReclaimInstructions, and feeds node states and
capacity hints into the :class:`~nanook.pool.WorkerPool`. Dialling, Hello,
redialling with back-off and following an ``ABORTED`` end that names another
shard's address (the cluster moved) are ``clusters.session.OperatorSession``'s,
the client every operator shares; this module is its handler.

Channels are made in one place, :data:`ChannelFactory`, so transport
security (mTLS with the cluster's certificate) plugs in there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bigfleet.v1alpha1 import capacity_pb2, shard_pb2
from clusters.session import ChannelFactory, OperatorSession, insecure_channel
from nanook.pool import Demand, SupplyHint, WorkerPool
from shard_engine.quantity import InvalidQuantity, format_quantity, parse_quantity

log = logging.getLogger(__name__)

__all__ = ["ChannelFactory", "ShardSession", "insecure_channel", "rollup_message"]

RELEASE_EXTENSION = "release"


def rollup_message(
    cluster_id: str, pool: WorkerPool, demand: Demand, timestamp_ns: int
) -> capacity_pb2.ClusterCapacityNeeds:
    """The roll-up for ``demand``: ``workers`` x worker, ``min_unit`` one worker."""
    config = pool.config
    needs = []
    if demand.workers > 0:
        needs.append(
            capacity_pb2.CapacityNeed(
                requirements=[r.to_wire() for r in config.requirements],
                aggregate_resources={
                    name: format_quantity(name, amount * demand.workers)
                    for name, amount in config.worker_amounts.items()
                },
                priority=config.priority,
                interruption_penalty_bucket=config.interruption_penalty_bucket,  # type: ignore[arg-type]
                reclamation_penalty_bucket=config.reclamation_penalty_bucket,  # type: ignore[arg-type]
                min_unit=dict(config.worker),
            )
        )
    return capacity_pb2.ClusterCapacityNeeds(
        cluster_id=cluster_id,
        timestamp_unix_nanos=timestamp_ns,
        needs=needs,
        release=capacity_pb2.ReleaseMachines(machine_ids=sorted(demand.release)),
    )


def _hint(update: shard_pb2.AvailableCapacityUpdate) -> SupplyHint:
    labels = {
        r.key: r.values[0]
        for r in update.requirements
        if r.operator == capacity_pb2.NodeSelectorRequirement.OPERATOR_IN and len(r.values) == 1
    }
    resources: dict[str, float] = {}
    for name, text in update.resources.resources.items():
        with contextlib.suppress(InvalidQuantity):
            resources[name] = parse_quantity(text)
    return SupplyHint(labels=labels, resources=resources, count=max(0, update.available_count))


class ShardSession:
    """One cluster's session with its shard (see module docstring)."""

    def __init__(
        self,
        cluster_id: str,
        shard_address: str,
        pool: WorkerPool,
        *,
        on_change: Callable[[], None] = lambda: None,
        channel_factory: ChannelFactory = insecure_channel,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cluster_id = cluster_id
        self.pool = pool
        self.on_change = on_change
        self.clock_ns = clock_ns
        self.rollups_sent = 0
        self.last_ack = ""
        self.last_rejection = ""
        self._last_ts = 0
        self._kick = asyncio.Event()
        self.session = OperatorSession(
            cluster_id, shard_address, self, channel_factory=channel_factory, label="nanook"
        )

    def start(self) -> None:
        self.session.start()

    async def stop(self) -> None:
        await self.session.stop()

    @property
    def shard_address(self) -> str:
        """Where the session dials now (the redirect's address once the cluster moved)."""
        return self.session.shard_address

    @property
    def sessions(self) -> int:
        """Sessions the shard acknowledged so far."""
        return self.session.sessions

    def kick(self) -> None:
        """Send a roll-up now (the demand changed)."""
        self._kick.set()

    def drop(self) -> None:
        """End the current session (tests and operators simulate a broken stream)."""
        self.session.drop()

    # ----------------------------------------------------------------- internals

    def _set_connected(self, connected: bool) -> None:
        if self.pool.connected != connected:
            self.pool.connected = connected
            self.on_change()

    def _timestamp(self) -> int:
        self._last_ts = max(self.clock_ns(), self._last_ts + 1)
        return self._last_ts

    # ------------------------------------------------- clusters.session.SessionHandler

    def opened(self, ack: shard_pb2.Acknowledgement) -> None:
        self.last_ack = ack.echo
        self.pool.shard_honours_release = RELEASE_EXTENSION in ack.extensions
        self._set_connected(True)

    async def sending(self) -> None:
        """Send the demand when it changes, and at least every ``rollup_interval_s``."""
        sent: tuple[int, frozenset[str]] | None = None
        last = 0.0
        loop = asyncio.get_running_loop()
        while True:
            demand = self.pool.demand()
            now = loop.time()
            current = (demand.workers, demand.release)
            if current != sent or now - last >= self.pool.config.rollup_interval_s:
                msg = rollup_message(self.cluster_id, self.pool, demand, self._timestamp())
                await self.session.send(shard_pb2.OperatorMessage(rollup=msg))
                self.rollups_sent += 1
                sent, last = current, now
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.pool.config.rollup_interval_s):
                    await self._kick.wait()

    async def received(self, frame: shard_pb2.ShardMessage) -> None:
        kind = frame.WhichOneof("payload")
        if kind == "ack":
            self.last_ack = frame.ack.echo
            if frame.ack.echo.startswith("rollup-") and frame.ack.echo != "rollup":
                self.last_rejection = frame.ack.echo
                log.warning("nanook %s: shard answered %s", self.cluster_id, frame.ack.echo)
        elif kind == "bootstrap_request":
            await self.session.send(self._bootstrap(frame.bootstrap_request))
        elif kind == "node_state_update":
            self._on_node(frame.node_state_update)
        elif kind == "reclaim_instruction":
            await self._on_reclaim(frame.reclaim_instruction)
        elif kind == "available_capacity":
            update = frame.available_capacity
            self.pool.supply_hint(update.supersedes_key, _hint(update))
            self.on_change()

    def closed(self, ending: str) -> None:
        self._set_connected(False)

    def _on_node(self, update: shard_pb2.NodeStateUpdate) -> None:
        if update.cluster_id and update.cluster_id != self.cluster_id:
            log.warning("nanook %s: update for cluster %s", self.cluster_id, update.cluster_id)
            return
        resources: dict[str, float] = {}
        for name, text in update.resources.resources.items():
            with contextlib.suppress(InvalidQuantity):
                resources[name] = parse_quantity(text)
        self.pool.node_state(
            update.machine_id, int(update.state), labels=dict(update.labels), resources=resources
        )
        oversized = self.pool.oversized()
        if update.machine_id in oversized:
            log.warning(
                "nanook %s: machine %s could hold two workers; size the pool's worker "
                "to the machine (one worker per machine)",
                self.cluster_id,
                update.machine_id,
            )
        self.on_change()
        self.kick()

    async def _on_reclaim(self, instruction: shard_pb2.ReclaimInstruction) -> None:
        ours = self.pool.reclaim(list(instruction.nodes))
        log.info(
            "nanook %s: %d workers reclaimed (instruction %s, preemptor priority %d)",
            self.cluster_id,
            ours,
            instruction.instruction_id,
            instruction.preemptor_priority,
        )
        await self.session.send(
            shard_pb2.OperatorMessage(
                reclaim_ack=shard_pb2.ReclaimAck(
                    instruction_id=instruction.instruction_id, nodes_started=ours
                )
            )
        )
        self.on_change()
        self.kick()

    def _bootstrap(self, req: shard_pb2.BootstrapRequest) -> shard_pb2.OperatorMessage:
        try:
            blob = self.pool.config.bootstrap_blob(self.cluster_id)
        except (KeyError, ValueError) as err:
            resp = shard_pb2.BootstrapBlobResponse(
                request_id=req.request_id, error=f"bootstrap template: {err}"
            )
        else:
            resp = shard_pb2.BootstrapBlobResponse(
                request_id=req.request_id,
                user_data=blob,
                ttl_seconds=self.pool.config.bootstrap_ttl_s,
            )
        return shard_pb2.OperatorMessage(bootstrap_response=resp)
