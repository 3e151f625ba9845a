"""The shard process: its parts wired together, start and stop, and the loops that drive them.

    lease loop     LeaseKeeper renews every ttl/3   -> the epoch on every fencing token
    observe loop   ProviderObserver lists providers -> engine.upsert_machine, NodeView
    sessions       operator roll-ups, on their own  -> SessionSink -> Intake, acked at once
                   thread (server.IngestServer)
    apply loop     SessionSink, a few ms at a time   -> engine.apply_rollup
    cycle loop     engine.cycle -> ShardCore -> Executor (its actuator)
                                                     -> workflows on task queue shard-<id>
    report loop    CoordinatorReporter              -> signal to the coordinator
    reconcile loop Reconciler: providers' List vs PostgreSQL vs engine -> repairs (ADR 0103)
    worker         activities (ShardActivityContext, CrossShardTransfers, ShardMembership)
                   -> providers, sessions, OutcomeRecorder -> store, engine.settle;
                   polls shard-<id> only while this process holds the lease

Each part is its own module with the dependencies it uses. The process stops
acting — no provider mutation, no workflow start, no cycle, its operator
sessions closed with UNAVAILABLE, its worker off the task queue so the work
goes to the next holder — the moment it is fenced, told it lost its
lease, or its acting deadline passes on its own clock without a confirmed
renewal (ADR 0100); it resumes only after taking the lease again with a new
epoch and rebuilding its view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.context import ProviderCalls
from activities.registry import shard_activities
from bigfleet.identity import KeyPairSource
from bigfleet.shard import telemetry
from bigfleet.shard.admissions import Admissions
from bigfleet.shard.executor import claim_running
from bigfleet.shard.intake import Intake
from bigfleet.shard.interpreter import GcPauses
from bigfleet.shard.options import ShardOptions, advertised, task_queue
from bigfleet.shard.parts import assemble
from bigfleet.shard.relay import EdgeLink, EdgeSpawn, RelayHub, default_socket, dismissing_edges
from bigfleet.shard.rollups import SessionSink
from bigfleet.shard.server import IngestOptions, IngestServer
from bigfleet.store import Store
from bigfleet.temporal import stop_worker
from workflows.registry import ALL_WORKFLOWS, workflow_runner

log = logging.getLogger(__name__)


__all__ = ["ShardOptions", "ShardProcess", "task_queue"]


class ShardProcess:
    """One shard: owns its task queue, its operator sessions and its slice of the fleet."""

    def __init__(
        self,
        options: ShardOptions,
        *,
        store: Store,
        temporal: Client,
        providers: Mapping[str, ProviderCalls],
        clock: Callable[[], float] = time.time,
        tls: KeyPairSource | None = None,
    ) -> None:
        self.options = options
        # Mutual TLS for the Session port (None: plaintext); see bigfleet.identity.
        self.tls = tls
        self.store = store
        self.temporal = temporal
        self.clock = clock
        self.address = ""  # advertised to operators (ShardOptions.advertise)
        self.listening = ""  # where the Session port is bound
        self.cycles = 0
        self.last_plan_actions = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._lease_task: asyncio.Task[None] | None = None
        self._server: IngestServer | None = None
        self._link: EdgeLink | None = None
        self._worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._stopping_worker: asyncio.Task[None] | None = None
        # Set by a cycle whose report should not wait for the interval (ADR 0184).
        self._news = asyncio.Event()
        self._stopping = False
        self._undo_interpreter: Callable[[], None] | None = None
        # The collector's pauses in this process (every loop of it stalls for them).
        self.gc = GcPauses()
        self._unhook_gc: Callable[[], None] | None = None
        self.parts = assemble(
            options, store=store, temporal=temporal, providers=providers, clock=clock
        )
        # The parts the loops drive, and those tests and the dev stack look at.
        self.engine = self.parts.engine
        self.hub = self.parts.hub
        self.lifecycle = self.parts.lifecycle
        self.lease = self.parts.lease
        # Shadow mode, pause, dry run and the decision log (gate.py).
        self.adoption = self.parts.adoption
        self.state = self.parts.state
        self.lease.on_stop(self._stopped_acting)
        # The Session port's sink: Hellos admitted, roll-ups staged then applied.
        self.sink = SessionSink(
            shard_id=options.shard_id,
            acting=lambda: self.active,
            lease=self.lease,
            # Hellos ask PostgreSQL for their cluster's shard in batches.
            admissions=Admissions(lambda ids: store.assign_clusters(ids)),
            membership=self.parts.membership,
            # Acknowledged on the sessions thread, applied on this loop.
            intake=Intake(clock=clock, max_skew_s=options.engine.rollup_max_skew_seconds),
            engine=self.engine,
            terms=self.parts.terms,
            clock=clock,
            slice_s=options.apply_slice_s,
            coalesce_s=options.apply_coalesce_s,
        )

    # ------------------------------------------------------------ identity

    @property
    def shard_id(self) -> str:
        return self.options.shard_id

    @property
    def task_queue(self) -> str:
        return task_queue(self.shard_id)

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def standing_by(self) -> bool:
        return self.lease.standing_by

    @property
    def owned(self) -> Mapping[str, str]:
        """Machines PostgreSQL records as ours (id -> provider); only these are acted on."""
        return self.state.owned

    @property
    def highest_term(self) -> int:
        """The highest coordinator term this process has seen."""
        return self.parts.terms.highest

    def session_loop_lag_worst(self) -> float:
        """The longest the Session port's loop has run late, in seconds (0 before it runs)."""
        return self._server.lag.worst if self._server is not None else 0.0

    @property
    def active(self) -> bool:
        """May act: holds its lease, was not fenced, is not stopping."""
        return self.lease.active and not self._stopping

    # ---------------------------------------------------------- start, stop

    async def start(self) -> None:
        """Take the lease, load inventory, serve sessions, and start the loops."""
        # Short GIL hand-overs and short collector pauses for the acks (interpreter.py).
        self._undo_interpreter = self.options.interpreter.apply()
        self._unhook_gc = self.gc.install()
        # The engine's compiled loops, loaded (or compiled, once per machine) before
        # the lease: the first cycle would otherwise pay for it (ADR 0162). Imported
        # here so that commands importing this module do not load numba.
        from shard_engine import kernels

        await asyncio.to_thread(kernels.warm)
        await self.lease.take_or_stand_by()
        # Renewals start at once: the rest of start-up may outlast the acting window.
        self._lease_task = asyncio.create_task(self.lease.keep(self._after_retake), name="lease")
        for row in await self.store.machines(self.shard_id):
            self.parts.sequences.advance_to(row.machine_id, row.operation_seq)
            # With the cluster it was bound to, the first observation tells that cluster
            # about a machine that left it while no process of this shard ran (ADR 0104).
            self.state.hold(row.machine_id, row.provider, cluster_id=row.cluster_id or "")
        # Before the first observation, so quarantined machines never reach the engine.
        await self.load_quarantine()
        await self.parts.observer.observe_all(full=True)
        await claim_running(
            self.temporal,
            shard_id=self.shard_id,
            engine=self.engine,
            owned=self.state.owned,
            clock=self.clock,
        )
        # Every Hello is answered with the state of every machine of the cluster
        # (ADR 0104); the view lives on this loop, the sessions on their own.
        loop = asyncio.get_running_loop()

        def resync_soon(cluster_id: str) -> None:
            loop.call_soon_threadsafe(self._resync, cluster_id)

        self.hub.on_open(resync_soon)
        if self.options.edges:
            self.listening = await self._join_edges()
        else:
            self.listening = await self._serve_sessions()
        self.address = advertised(self.listening, self.options.advertise)
        # Where a moved cluster's operator is sent: the lease row carries our address.
        await self.lease.publish_address(self.address)
        if self.active:
            self._start_worker()
        await self.adoption.start()  # a paused shard stays paused from its first cycle
        self._tasks = [
            asyncio.create_task(self.adoption.run(), name="decision-log"),
            self._every(self.options.observe_interval_s, self._observe, name="observe"),
            self._every(self.options.cycle_interval_s, self._cycle, name="cycle"),
            asyncio.create_task(self.sink.run(), name="apply-rollups"),
            asyncio.create_task(self._report_loop(), name="report"),
            self._every(self.options.cycle_interval_s, self._read_offers, name="offers"),
            self._every(self.options.reconcile_interval_s, self._reconcile, name="reconcile"),
        ]
        self.options.interpreter.started()
        log.info(
            "shard %s serving on %s (epoch %d, task queue %s)",
            self.shard_id,
            self.address,
            self.epoch,
            self.task_queue,
        )

    async def stop(self) -> None:
        """Stop the loops, the worker and the server, and give the lease up."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._stop_worker()
        await self.adoption.close()
        if self._stopping_worker is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stopping_worker
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lease_task
        if self._server is not None:
            await self._server.stop(grace=1.0)
        if self._link is not None:
            await self._link.stop(final=True)
            self._link = None
        await self.lease.release()
        if self._undo_interpreter is not None:
            self._undo_interpreter()
            self._undo_interpreter = None
        if self._unhook_gc is not None:
            self._unhook_gc()
            self._unhook_gc = None

    async def _serve_sessions(self) -> str:
        """The Session port on a thread of this process: acks never wait for the cycle.

        When the port is held and this shard's edge socket is still on disk,
        the holder is likely an edge that outlived an engine of this shard
        run with edges (ADR 0147): it is told to stop, and the port is tried
        again for ``edge_dismiss_s``.
        """
        options = self.options
        path = options.edge_socket or default_socket(self.shard_id, options.listen)
        deadline = time.monotonic() + options.edge_dismiss_s
        dismissing: contextlib.AsyncExitStack | None = None
        dismissed: list[int] = []
        try:
            while True:
                self._server = IngestServer(
                    self.hub,
                    self.sink,
                    IngestOptions(listen=options.listen, limits=options.session_limits),
                    tls=self.tls,
                    inspect=lambda cid, limit: self.engine.inspect_needs(cid, limit=limit),
                )
                try:
                    return await self._server.start()
                except OSError as err:
                    self._server = None
                    if dismissing is None and not _on_disk(path):
                        raise
                    if time.monotonic() >= deadline:
                        told = f"; {len(dismissed)} edge(s) of an earlier run told to stop"
                        raise OSError(f"{err}{told if dismissed else ''}") from err
                if dismissing is None:
                    dismissing = contextlib.AsyncExitStack()
                    dismissed = await dismissing.enter_async_context(dismissing_edges(path))
                await asyncio.sleep(0.2)
        finally:
            if dismissing is not None:
                await dismissing.aclose()

    async def _join_edges(self) -> str:
        """The Session port in edge processes: serve their socket, wait for (or start) them.

        Edges that outlived a killed engine process rejoin this one; the
        missing ones are started. Returns the address they share.
        """
        assert isinstance(self.hub, RelayHub)
        options = self.options
        self._link = EdgeLink(
            options.edge_socket or default_socket(self.shard_id, options.listen),
            hub=self.hub,
            sink=self.sink,
            deferral=self.parts.membership.deferral,
            inspect=lambda cid, limit: self.engine.inspect_needs(cid, limit=limit),
            listen=options.listen,
            shard_id=self.shard_id,
        )
        self.parts.membership.on_departure(self._link.departing)
        await self._link.start()
        spawn = EdgeSpawn(
            listen=options.listen,
            max_skew_s=options.engine.rollup_max_skew_seconds,
            orphan_s=options.edge_orphan_s,
        )
        return await self._link.gather(options.edges, spawn if options.spawn_edges else None)

    @property
    def edge_link(self) -> EdgeLink | None:
        """The link to the edge processes (None: the Session port is a thread here)."""
        return self._link

    # -------------------------------------------------------------- worker

    def _start_worker(self) -> None:
        """Serve the task queue ``shard-<id>`` (only while holding the lease; DESIGN §4)."""
        if self._worker is not None:
            return
        self._worker = Worker(
            self.temporal,
            task_queue=self.task_queue,
            workflows=list(ALL_WORKFLOWS),
            activities=shard_activities(
                self.parts.context,
                transfers=self.parts.transfers,
                membership=self.parts.membership,
                guard=self.lease,
            ),
            workflow_runner=workflow_runner(),
            graceful_shutdown_timeout=timedelta(seconds=5),
        )
        self._worker_task = asyncio.create_task(self._worker.run(), name="worker")

    async def _stop_worker(self) -> None:
        """Stop polling the task queue, so its work goes to whichever process holds the
        lease instead of bouncing off this one."""
        worker, task = self._worker, self._worker_task
        self._worker, self._worker_task = None, None
        await self._shutdown(worker, task)

    async def _shutdown(self, worker: Worker | None, task: asyncio.Task[None] | None) -> None:
        await stop_worker(worker, task, name=f"shard {self.shard_id}")

    # --------------------------------------------------------------- loops

    def _every(
        self, interval_s: float, step: Callable[[], Awaitable[None]], *, name: str
    ) -> asyncio.Task[None]:
        """Run ``step`` every ``interval_s`` until cancelled; a failing step is logged."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await step()
                except Exception:
                    log.exception("shard %s: %s failed", self.shard_id, name)

        return asyncio.create_task(loop(), name=name)

    async def _after_retake(self) -> None:
        """A new epoch: rebuild the engine's view from full Lists and the running
        workflows before acting again."""
        self.parts.observer.forget_cursors()
        await self.parts.observer.observe_all(full=True)
        await claim_running(
            self.temporal,
            shard_id=self.shard_id,
            engine=self.engine,
            owned=self.state.owned,
            clock=self.clock,
        )
        if not self._stopping:
            self._start_worker()

    def _stopped_acting(self, reason: str) -> None:
        """The lease keeper stopped acting: send every operator to the next holder, and
        stop serving the task queue until the lease is held again."""
        self.hub.close_all(unavailable=f"shard {self.shard_id} is not acting ({reason}); reconnect")
        worker, task = self._worker, self._worker_task
        self._worker, self._worker_task = None, None  # a re-take starts a new one
        if worker is not None:
            self._stopping_worker = asyncio.get_running_loop().create_task(
                self._shutdown(worker, task)
            )

    async def _observe(self) -> None:
        await self.parts.observer.observe_all(full=False)

    async def _cycle(self) -> None:
        telemetry.record_lease(self.shard_id, held=self.active, epoch=self.lease.epoch)
        if self.active:
            await self.adoption.refresh()
            await self.run_cycle()
            if self.adoption.reaches_out and self.parts.reporter.news_due():
                self._news.set()  # the report loop sends it now (ADR 0184)

    async def _report_loop(self) -> None:
        """Report every report interval, and at once when a cycle has news (ADR 0184)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), self.options.report_interval_s)
            self._news.clear()
            try:
                await self._report()
            except Exception:
                log.exception("shard %s: report failed", self.shard_id)

    async def _read_offers(self) -> None:
        """The coordinator's latest offers, each cycle interval, not only after a report.

        A round planned on another shard's report (its idle machines, say)
        offers them to this shard; read at the next report, they would come
        up to an interval late and a need would buy in between (ADR 0184).
        """
        if self.active and self.adoption.reaches_out:
            await self.parts.reporter.read_fleet_idle()

    async def _report(self) -> None:
        if self.active and self.adoption.reaches_out:
            self.parts.capacity_hints.publish()
            await self.parts.reporter.send_report()

    async def _reconcile(self) -> None:
        if self.active and self.adoption.reaches_out:
            await self.parts.reconciler.run_once()

    async def run_cycle(self) -> int:
        """One decision cycle: plan, then start a workflow per action. Returns actions started.

        A process that cannot prove it holds its lease (or was fenced) plans
        nothing and starts nothing.
        """
        if not self.active:
            return 0
        self.sink.apply_staged()  # every roll-up acknowledged so far counts in this cycle
        if self.parts.settlement is not None:
            self.parts.settlement.settle_due()  # shadow: would-be operations that are done
        started = time.perf_counter()
        plan = self.engine.cycle(now=self.clock(), dry_run=self.adoption.dry_run)
        telemetry.record_cycle(
            self.shard_id,
            plan,
            seconds=time.perf_counter() - started,
            stats=self.engine.stats,
            sessions_open=len(self.hub),
        )
        telemetry.record_gc(
            self.shard_id, "engine", total_s=self.gc.total_s, worst_s=self.gc.take_worst()
        )
        if self._server is not None:
            lag = self._server.lag
            telemetry.record_session_loop(self.shard_id, "thread", lag_s=lag.value, busy=lag.busy)
        self.cycles += 1
        self.last_plan_actions = len(plan.actions)
        self.adoption.after_cycle(plan, cycle=self.cycles)
        if plan.dry_run:
            return 0  # recorded, not started: nothing was marked in flight
        return await self.parts.core.execute(plan.actions)

    # ----------------------------------------------------------- quarantine

    async def load_quarantine(self) -> None:
        """Take back the machines an earlier process of this shard quarantined."""
        self.lifecycle.restore_quarantine(await self.store.quarantined(self.shard_id))

    async def release_quarantine(self, machine_id: str) -> bool:
        """Use a quarantined machine again (store first, then memory). Its
        provider's cursor is dropped so the next observation is a full List
        that brings the machine back into the engine. True if it was
        quarantined."""
        stored = await self.store.release_quarantine(machine_id)
        released = self.lifecycle.release_quarantine(machine_id)
        provider = self.state.provider_of(machine_id)
        if provider is not None:
            self.parts.observer.forget_cursor(provider)
        return released or stored

    def _resync(self, cluster_id: str) -> None:
        self.parts.nodes.resync(cluster_id)


def _on_disk(path: str) -> bool:
    """Whether a file is at ``path`` (a stat: too quick to hand to a thread)."""
    return os.path.exists(path)
