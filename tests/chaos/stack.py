"""The stack the fault scenarios break: every part in a process of its own.

    PostgreSQL (the machine's server, a fresh database) ◀─FaultProxy─┐
    Temporal dev server (its own SQLite file)  ◀──────────────────────┼── shard-0 (primary)
    simulated cloud (`bigfleet provider serve`, its own state file) ◀─FaultProxy─┘
    coordinator (`bigfleet coordinator run`)   direct paths
    standby shard-0 (optional)                 direct path to PostgreSQL and the provider
    cluster operators (SimulatedCluster, in the test process: the outside world)

The test process owns every process it starts (``Part``) and only ever
signals those. Faults are injected with the proxies (cut, blackhole, delay)
and with signals (SIGKILL, SIGSTOP/SIGCONT) to the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from bigfleet import temporal
from bigfleet.store import Database, Store
from clusters.operator import DemandPattern, SimulatedCluster
from providers.client import ProviderClient
from providers.errors import ProviderError
from tests.chaos.faultproxy import FaultProxy
from tests.ports import free_port as free_port  # re-exported for the scenarios
from workflows import search_attributes as sa

REPO = Path(__file__).resolve().parents[2]
TINY_CLOUD = REPO / "tests" / "fixtures" / "tiny_cloud.json"
SMALL = ("node.kubernetes.io/instance-type", 1, ("m6i.large",))
PROVIDER = "simcloud"
SHARD = "shard-0"

# The shard's clock in these drills: a 6 s lease (acting window 4.5 s), a reconcile
# every 5 s, deadlines a twentieth of production's (30 s to create or configure).
LEASE_TTL_S = 6.0
RECONCILE_S = 5.0
DEADLINE_SCALE = 0.05
TIME_FACTOR = 0.05

# The workload: two clusters of small machines (m6i.large, 1.93 allocatable cores).
# Units of 0.95 cores fit two to a machine, so the shard's count by units (ADR 0127)
# is the count perfect packing gives: 3 machines for c-web, 2 for c-batch, and room
# left in the fleet to create more when a scenario raises demand.
DEMAND = {
    "c-web": DemandPattern(
        cpu=5,
        memory_gib=4,
        min_unit_cpu=0.95,
        min_unit_memory_gib=1,
        requirements=(SMALL,),
        priority=500_000,
    ),
    "c-batch": DemandPattern(
        cpu=3,
        memory_gib=4,
        min_unit_cpu=0.95,
        min_unit_memory_gib=1,
        requirements=(SMALL,),
        priority=100_000,
    ),
}


def through(url: str, address: str) -> str:
    """``url`` with its host and port replaced by ``address``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{address}" if userinfo else address
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass
class Part:
    """One process of the stack, started and signalled only by this test."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        out = self.log.open("ab")
        out.write(f"\n=== start #{self.starts} at {time.time():.3f}\n".encode())
        out.flush()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
        out.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        """SIGTERM (a clean stop), SIGKILL if it lingers."""
        if not self.alive:
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ChaosStack:
    """Starts the parts, hands out clients, and stops everything it started."""

    tmp: Path
    database_url: str
    standby: bool = False
    parts: dict[str, Part] = field(default_factory=dict)
    clusters: dict[str, SimulatedCluster] = field(default_factory=dict)
    pg_proxy: FaultProxy | None = None
    provider_proxy: FaultProxy | None = None
    temporal_port: int = 0
    provider_port: int = 0
    shard_ports: list[int] = field(default_factory=list)
    client: Client | None = None
    provider: ProviderClient | None = None
    db: Database | None = None

    @property
    def store(self) -> Store:
        assert self.db is not None
        return Store(self.db.engine)

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def provider_address(self) -> str:
        return f"127.0.0.1:{self.provider_port}"

    def shard_address(self, i: int = 0) -> str:
        return f"127.0.0.1:{self.shard_ports[i]}"

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        self.db = Database.connect(self.database_url)
        await self.db.migrate()
        self.temporal_port = free_port()
        self.provider_port = free_port()
        self.shard_ports = [free_port(), free_port()]
        pg = urlsplit(self.database_url)
        self.pg_proxy = await FaultProxy(f"{pg.hostname}:{pg.port or 5432}").start()
        self.provider_proxy = await FaultProxy(self.provider_address).start()
        self._define_parts()
        self.parts["temporal"].start()
        self.client = await _connect_temporal(self.temporal_address, within=60)
        await temporal.ensure_search_attributes(self.client)
        self.parts["provider"].start()
        self.provider = ProviderClient(self.provider_address, timeout=5.0)
        await self.wait_provider()
        self.parts["shard"].start()
        if self.standby:
            # The primary takes the lease first; the standby then stands by for it.
            await self.wait_holder("shard")
            self.parts["standby"].start()
        self.parts["coordinator"].start()
        for cluster_id, demand in DEMAND.items():
            cluster = SimulatedCluster(
                cluster_id,
                self.shard_address(0),
                demand,
                rollup_interval_s=0.5,
                standbys=[self.shard_address(1)] if self.standby else (),
            )
            cluster.start()
            self.clusters[cluster_id] = cluster

    def _define_parts(self) -> None:
        assert self.pg_proxy is not None and self.provider_proxy is not None
        base = {k: v for k, v in os.environ.items() if not k.startswith("BIGFLEET_")}
        base["PYTHONPATH"] = str(REPO)
        python = [sys.executable, "-m", "bigfleet"]
        shard_env = base | {
            "BIGFLEET_TEMPORAL_ADDRESS": self.temporal_address,
            "BIGFLEET_SHARD_ID": SHARD,
            "BIGFLEET_CYCLE_SECONDS": "0.5",
            "BIGFLEET_OBSERVE_SECONDS": "0.5",
            "BIGFLEET_REPORT_SECONDS": "1",
            "BIGFLEET_LEASE_TTL_SECONDS": str(LEASE_TTL_S),
            "BIGFLEET_RECONCILE_SECONDS": str(RECONCILE_S),
            "BIGFLEET_DEADLINE_SCALE": str(DEADLINE_SCALE),
        }
        self.parts["temporal"] = Part(
            "temporal",
            [
                str(temporal.binary("temporal")),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.temporal_port),
                "--headless",
                "--db-filename",
                str(self.tmp / "temporal.sqlite"),
                "--log-level",
                "warn",
                *[arg for key in sa.ALL for arg in ("--search-attribute", _sa_flag(key))],
            ],
            base,
            self.tmp / "temporal.log",
        )
        self.parts["provider"] = Part(
            "provider",
            [
                *python,
                "provider",
                "serve",
                "--kind",
                "sim-cloud",
                "--addr",
                self.provider_address,
                "--state",
                str(self.tmp / "simcloud.json"),
                "--catalog",
                str(TINY_CLOUD),
                "--name",
                PROVIDER,
                "--time-factor",
                str(TIME_FACTOR),
                "--interruption-scale",
                "0",
                # A cloud cleans FAILED machines up (ten simulated minutes: 30 s here).
                "--failed-cleanup",
                "600",
                "--seed",
                "11",
            ],
            base,
            self.tmp / "provider.log",
        )
        self.parts["shard"] = Part(
            "shard",
            [*python, "shard"],
            shard_env
            | {
                "BIGFLEET_DATABASE_URL": through(self.database_url, self.pg_proxy.address),
                "BIGFLEET_PROVIDERS": f"{PROVIDER}={self.provider_proxy.address}",
                "BIGFLEET_SHARD_LISTEN": self.shard_address(0),
            },
            self.tmp / "shard.log",
        )
        self.parts["standby"] = Part(
            "standby",
            [*python, "shard"],
            shard_env
            | {
                "BIGFLEET_DATABASE_URL": self.database_url,
                "BIGFLEET_PROVIDERS": f"{PROVIDER}={self.provider_address}",
                "BIGFLEET_SHARD_LISTEN": self.shard_address(1),
            },
            self.tmp / "standby.log",
        )
        self.parts["coordinator"] = Part(
            "coordinator",
            [*python, "coordinator", "run", "--interval", "1"],
            base
            | {
                "BIGFLEET_DATABASE_URL": self.database_url,
                "BIGFLEET_TEMPORAL_ADDRESS": self.temporal_address,
                "BIGFLEET_PROVIDERS": f"{PROVIDER}={self.provider_address}",
            },
            self.tmp / "coordinator.log",
        )

    async def wait_provider(self, within: float = 60.0) -> None:
        assert self.provider is not None
        deadline = time.monotonic() + within
        while True:
            try:
                await self.provider.list(max_results=1)
                return
            except ProviderError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)

    def holder(self, part: str) -> str:
        """The lease-holder name the part's shard process uses (host:pid)."""
        proc = self.parts[part].proc
        assert proc is not None
        return f"{socket.gethostname()}:{proc.pid}"

    async def wait_holder(self, part: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while True:
            row = await self.store.shard(SHARD)
            if row is not None and row.lease_holder == self.holder(part):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{part} never took the lease\n{self.parts[part].tail()}")
            await asyncio.sleep(0.2)

    async def restart_temporal(self) -> None:
        """Start the killed Temporal server again on its SQLite file and port."""
        self.parts["temporal"].start()
        assert self.client is not None
        await _connect_temporal(self.temporal_address, within=60)

    # ------------------------------------------------------------------- stop

    async def stop(self) -> None:
        for cluster in self.clusters.values():
            await cluster.stop()
        for proxy in (self.pg_proxy, self.provider_proxy):
            if proxy is not None:
                proxy.heal()
        for name in ("coordinator", "standby", "shard", "provider", "temporal"):
            part = self.parts.get(name)
            if part is not None:
                await asyncio.to_thread(part.stop)
        if self.provider is not None:
            await self.provider.close()
        for proxy in (self.pg_proxy, self.provider_proxy):
            if proxy is not None:
                await proxy.stop()
        if self.db is not None:
            await self.db.close()

    def logs(self, names: Sequence[str] = ("shard", "standby", "coordinator", "provider")) -> str:
        return "\n".join(f"--- {n} ---\n{self.parts[n].tail()}" for n in names if n in self.parts)


def _sa_flag(key: object) -> str:
    kinds = {
        "KEYWORD": "Keyword",
        "KEYWORD_LIST": "KeywordList",
        "INT": "Int",
        "TEXT": "Text",
        "DOUBLE": "Double",
        "BOOL": "Bool",
        "DATETIME": "Datetime",
    }
    name = key.name  # type: ignore[attr-defined]
    kind = key.indexed_value_type.name  # type: ignore[attr-defined]
    return f"{name}={kinds[kind]}"


async def _connect_temporal(address: str, *, within: float) -> Client:
    deadline = time.monotonic() + within
    while True:
        try:
            client = await Client.connect(address)
            await client.workflow_service.get_system_info(GetSystemInfoRequest())
            return client
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
