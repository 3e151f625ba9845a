"""The adapter's side of ``bigfleet.v1alpha1.Shard/Session``: an operator for one cluster.

It dials the shard, sends Hello with the cluster id, then full-replacement
roll-ups whenever the pool's demand changes (and on a cadence, so a
restarted shard hears from it soon). It answers BootstrapRequests from the
pool's template, acknowledges ReclaimInstructions, and feeds node states and
capacity hints into the :class:`~nanook.pool.WorkerPool`. A lost session is
redialled with back-off; an ``ABORTED`` end naming another shard's address
(the cluster moved) is followed.

Channels are made in one place, :data:`ChannelFactory`, so transport
security (mTLS with the cluster's certificate) plugs in there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import cast

import grpc

from bigfleet.v1alpha1 import capacity_pb2, shard_pb2, shard_pb2_grpc
from nanook.pool import Demand, SupplyHint, WorkerPool
from shard_engine.quantity import InvalidQuantity, format_quantity, parse_quantity

log = logging.getLogger(__name__)

__all__ = ["ChannelFactory", "ShardSession", "insecure_channel", "rollup_message"]

PROTOCOL_VERSION = "bigfleet.v1alpha1"
RELEASE_EXTENSION = "release"

ChannelFactory = Callable[[str], grpc.aio.Channel]
"""Opens the channel to a shard address (the one place credentials will go)."""


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel (loopback, tests, and deployments before mTLS)."""
    return grpc.aio.insecure_channel(address)


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
        self.shard_address = shard_address
        self.pool = pool
        self.on_change = on_change
        self.channel_factory = channel_factory
        self.clock_ns = clock_ns
        self.rollups_sent = 0
        self.last_ack = ""
        self.last_rejection = ""
        self.sessions = 0
        self._last_ts = 0
        self._kick = asyncio.Event()
        self._outbox: asyncio.Queue[shard_pb2.OperatorMessage | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._call: (
            grpc.aio.StreamStreamCall[shard_pb2.OperatorMessage, shard_pb2.ShardMessage] | None
        ) = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run_forever(), name=f"nanook-{self.cluster_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def kick(self) -> None:
        """Send a roll-up now (the demand changed)."""
        self._kick.set()

    def drop(self) -> None:
        """End the current session (tests and operators simulate a broken stream)."""
        if self._call is not None:
            self._call.cancel()

    # ----------------------------------------------------------------- internals

    def _set_connected(self, connected: bool) -> None:
        if self.pool.connected != connected:
            self.pool.connected = connected
            self.on_change()

    async def _run_forever(self) -> None:
        backoff = 0.2
        while True:
            try:
                await self._session()
                backoff = 0.2
            except grpc.aio.AioRpcError as err:
                log.info("nanook %s: session ended: %s", self.cluster_id, err.code().name)
                moved_to = _redirect(err)
                if moved_to and moved_to != self.shard_address:
                    log.info("nanook %s: now served at %s", self.cluster_id, moved_to)
                    self.shard_address = moved_to
                    backoff = 0.2
            except (OSError, asyncio.InvalidStateError) as err:
                log.warning("nanook %s: session failed: %s", self.cluster_id, err)
            finally:
                self._call = None
                self._set_connected(False)
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

    def _timestamp(self) -> int:
        self._last_ts = max(self.clock_ns(), self._last_ts + 1)
        return self._last_ts

    async def _rollups(self) -> None:
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
                await self._outbox.put(shard_pb2.OperatorMessage(rollup=msg))
                self.rollups_sent += 1
                sent, last = current, now
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.pool.config.rollup_interval_s):
                    await self._kick.wait()

    async def _session(self) -> None:
        self._outbox = asyncio.Queue()
        async with self.channel_factory(self.shard_address) as channel:
            stub = shard_pb2_grpc.ShardStub(channel)
            call = stub.Session(self._requests())
            self._call = call
            sender: asyncio.Task[None] | None = None
            try:
                async for frame in call:
                    kind = frame.WhichOneof("payload")
                    if kind == "ack":
                        sender = self._on_ack(frame.ack, sender)
                    elif kind == "bootstrap_request":
                        await self._outbox.put(self._bootstrap(frame.bootstrap_request))
                    elif kind == "node_state_update":
                        self._on_node(frame.node_state_update)
                    elif kind == "reclaim_instruction":
                        await self._on_reclaim(frame.reclaim_instruction)
                    elif kind == "available_capacity":
                        update = frame.available_capacity
                        self.pool.supply_hint(update.supersedes_key, _hint(update))
                        self.on_change()
            finally:
                if sender is not None:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sender
                # End this session's request stream. A call the shard ended is not
                # cancelled by closing the channel, so gRPC's task that feeds it from
                # _requests() would wait on this queue for ever (one task per session).
                self._outbox.put_nowait(None)

    def _on_ack(
        self, ack: shard_pb2.Acknowledgement, sender: asyncio.Task[None] | None
    ) -> asyncio.Task[None] | None:
        self.last_ack = ack.echo
        if ack.echo == "hello" and sender is None:
            self.sessions += 1
            self.pool.shard_honours_release = RELEASE_EXTENSION in ack.extensions
            self._set_connected(True)
            return asyncio.create_task(self._rollups(), name=f"nanook-rollups-{self.cluster_id}")
        if ack.echo.startswith("rollup-") and ack.echo != "rollup":
            self.last_rejection = ack.echo
            log.warning("nanook %s: shard answered %s", self.cluster_id, ack.echo)
        return sender

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
        await self._outbox.put(
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


def _redirect(err: grpc.aio.AioRpcError) -> str:
    """The address a shard told us to reconnect to (trailing metadata), or ''."""
    if err.code() != grpc.StatusCode.ABORTED:
        return ""
    pairs = cast("Iterable[tuple[str, str | bytes]]", err.trailing_metadata() or ())
    value = dict(pairs).get("bigfleet-shard-address", "")
    return value if isinstance(value, str) else ""
