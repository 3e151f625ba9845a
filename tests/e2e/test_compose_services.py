"""docker-compose.yml's BigFleet services, each started as compose would start it, on loopback.

There is no Docker engine here, so the test runs what compose would run:
for every service built from this repository (and the Temporal readiness
gate, whose script needs only the ``temporal`` CLI), it takes the service's
``command``, ``environment`` and ``healthcheck`` from docker-compose.yml,
rewrites what only exists inside the compose network — service host names
and container ports to loopback free ports, volume paths to temporary
directories, the database URL to a fresh database on the test PostgreSQL,
``temporal:7233`` to a Temporal dev server from the wheel (started without
BigFleet's search attributes, like a fresh Temporal on PostgreSQL) — and
starts it with ``.venv/bin/bigfleet`` in the order ``depends_on`` gives,
honouring each condition: one-shots must exit 0, ``service_healthy`` waits
for the service's own healthcheck command to pass.

Then: every healthcheck passes (gRPC health over mutual TLS, with each
container's own certificate), the shards published the addresses they
advertise rather than their wildcard listeners, the coordinator's workflow
runs, and no long-running process has exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from bigfleet.store import Database, ShardRow, Store
from bigfleet.temporal import binary
from tests.ports import free_port
from tests.waiting import eventually
from workflows.coordinator_contracts import COORDINATOR_ID

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# Services whose image is not ours and whose command the test can still run here.
RUNNABLE_ELSEWHERE = {"temporal-namespace"}
# Services the test stands in for: PostgreSQL, and Temporal (schema, server, UI).
PROVIDED = {"postgres", "temporal-schema", "temporal", "temporal-ui"}
WITHIN_S = 120.0


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with nothing set: the default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)


@dataclass
class Loopback:
    """Rewrites what a compose service sees into what this machine has."""

    services: Mapping[str, Any]
    database_url: str
    temporal_port: int
    volumes_root: Path
    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def port(self, service: str, port: int) -> int:
        if service == "temporal" and port == 7233:
            return self.temporal_port
        return self.ports.setdefault((service, port), free_port())

    def text(self, service: str, value: str) -> str:
        value = _interpolate(str(value))
        # The BigFleet database: a fresh one on the test server (put in last, as it is).
        value = re.sub(r"postgresql://[^@/\s]+@postgres:5432/[\w-]+", "\0DATABASE\0", value)
        # A wildcard or loopback listener inside the container: its own free port.
        value = re.sub(
            r"\b(?:0\.0\.0\.0|127\.0\.0\.1|localhost):(\d+)\b",
            lambda m: f"127.0.0.1:{self.port(service, int(m.group(1)))}",
            value,
        )
        # Another service by name: where that service listens here.
        names = "|".join(re.escape(n) for n in sorted(self.services, key=len, reverse=True))
        value = re.sub(
            rf"(?<![\w.-])({names}):(\d+)\b",
            lambda m: f"127.0.0.1:{self.port(m.group(1), int(m.group(2)))}",
            value,
        )
        return self._paths(service, value).replace("\0DATABASE\0", self.database_url)

    def _mounts(self, service: str) -> list[tuple[str, Path]]:
        mounts = []
        for entry in self.services[service].get("volumes", []):
            source, target = entry.split(":")[:2]
            if source.startswith("."):
                mounts.append((target, (ROOT / source).resolve()))
            else:
                here = self.volumes_root / source
                here.mkdir(parents=True, exist_ok=True)
                mounts.append((target, here))
        return mounts

    def _paths(self, service: str, value: str) -> str:
        for target, here in self._mounts(service):
            value = re.sub(rf"(^|=){re.escape(target)}(?=/|$)", rf"\g<1>{here}", value)
        return value

    def argv(self, service: str, args: list[str]) -> list[str]:
        out = [self.text(service, a) for a in args]
        if out and out[0] == "bigfleet":
            out[0] = str(VENV_BIN / "bigfleet")
        return out

    def command(self, service: str) -> list[str]:
        svc = self.services[service]
        entry = svc.get("entrypoint")
        head = list(entry) if entry else ["bigfleet"]
        return self.argv(service, [*head, *svc.get("command", [])])

    def healthcheck(self, service: str) -> list[str] | None:
        check = self.services[service].get("healthcheck")
        if not check:
            return None
        test = list(check["test"])
        assert test[0] == "CMD", f"{service}: a healthcheck the image can run without a shell"
        return self.argv(service, test[1:])

    def environment(self, service: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BIGFLEET_")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        for key, value in (self.services[service].get("environment") or {}).items():
            env[key] = self.text(service, value)
        return env


@dataclass
class Running:
    service: str
    process: asyncio.subprocess.Process
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- {self.service} ({self.log}) ---\n" + "\n".join(text[-lines:])


class Stack:
    """Compose's start-up, run by hand: order, conditions, healthchecks."""

    def __init__(self, loop: Loopback, logs: Path, workdir: Path) -> None:
        self.loop = loop
        self.logs = logs
        self.workdir = workdir
        self.running: dict[str, Running] = {}
        self.completed: set[str] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._health: dict[str, asyncio.Task[None]] = {}

    def order(self, wanted: set[str]) -> list[str]:
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            assert name not in path, f"depends_on cycle: {(*path, name)}"
            if name in done or name in PROVIDED:
                return
            for dep in _depends(self.loop.services[name]):
                visit(dep, (*path, name))
            done.append(name)

        for name in sorted(wanted):
            visit(name, ())
        return done

    async def up(self, wanted: set[str]) -> None:
        """Start ``wanted`` as compose does: each service as soon as its dependencies allow."""
        self._tasks = {
            name: asyncio.create_task(self._when_ready(name)) for name in self.order(wanted)
        }
        try:
            await asyncio.gather(*self._tasks.values())
        finally:
            for task in (*self._tasks.values(), *self._health.values()):
                task.cancel()

    async def _when_ready(self, service: str) -> None:
        for dep, condition in _depends(self.loop.services[service]).items():
            if dep in PROVIDED:
                continue
            await self._tasks[dep]  # started; a one-shot's task ends once it exited 0
            if condition == "service_completed_successfully":
                assert dep in self.completed, f"{service} starts before {dep} completed"
            elif condition == "service_healthy":
                await self.wait_healthy(dep)
        await self.start(service)

    async def start(self, service: str) -> None:
        svc = self.loop.services[service]
        log = self.logs / f"{service}.log"
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *self.loop.command(service),
                env=self.loop.environment(service),
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                cwd=self.workdir,  # a container's own working directory
            )
        run = Running(service, process, log)
        self.running[service] = run
        if svc.get("restart") == "no":  # a one-shot: its dependents wait for exit 0
            try:
                code = await asyncio.wait_for(process.wait(), WITHIN_S)
            except TimeoutError:
                raise AssertionError(f"{service} did not finish\n{run.tail()}") from None
            assert code == 0, f"{service} exited {code}\n{run.tail()}"
            self.completed.add(service)

    async def wait_healthy(self, service: str) -> None:
        """Until the service's own healthcheck passes (one prober however many wait)."""
        if service not in self._health:
            self._health[service] = asyncio.create_task(self._probe(service))
        await asyncio.shield(self._health[service])

    async def _probe(self, service: str) -> None:
        argv = self.loop.healthcheck(service)
        assert argv is not None, f"something waits for {service} to be healthy; it has no check"
        run = self.running[service]
        deadline = time.monotonic() + WITHIN_S
        last = ""
        while True:
            assert run.process.returncode is None, f"{service} exited\n{run.tail()}"
            probe = await asyncio.create_subprocess_exec(
                *argv,
                env=self.loop.environment(service),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await probe.communicate()
            last = out.decode(errors="replace").strip()
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{service} never became healthy: {last}\n{run.tail()}")
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for run in self.running.values():
            if run.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.process.pid, signal.SIGTERM)
        for run in self.running.values():
            try:
                await asyncio.wait_for(run.process.wait(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.process.pid, signal.SIGKILL)
                await run.process.wait()

    def tails(self) -> str:
        return "\n".join(run.tail() for run in self.running.values())


def _depends(svc: Mapping[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _ours(services: Mapping[str, Any]) -> set[str]:
    return {n for n, s in services.items() if s.get("build")} | RUNNABLE_ELSEWHERE


@pytest.fixture
async def temporal_server() -> AsyncIterator[tuple[int, Client]]:
    """A Temporal dev server with no BigFleet search attribute registered (as a fresh
    Temporal on PostgreSQL has none): the processes register them."""
    port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(binary("temporal")), port=port, ui=False
    )
    try:
        yield port, env.client
    finally:
        await env.shutdown()


async def test_every_bigfleet_service_starts_from_its_compose_definition_and_becomes_healthy(
    tmp_path: Path,
    empty_database_url: str,
    temporal_server: tuple[int, Client],
) -> None:
    services = _compose()["services"]
    port, client = temporal_server
    loop = Loopback(
        services=services,
        database_url=empty_database_url,
        temporal_port=port,
        volumes_root=tmp_path / "volumes",
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "home").mkdir()
    stack = Stack(loop, tmp_path / "logs", tmp_path / "home")
    wanted = _ours(services)
    try:
        await stack.up(wanted)
        # Every service with a healthcheck passes it, whether or not anything waits for it.
        await asyncio.gather(
            *(stack.wait_healthy(s) for s in sorted(wanted) if services[s].get("healthcheck"))
        )
        await _the_stack_is_up(stack, loop, client)
    except BaseException:
        print(stack.tails())
        raise
    finally:
        await stack.stop()


async def _the_stack_is_up(stack: Stack, loop: Loopback, client: Client) -> None:
    services = loop.services
    long_running = {n for n in stack.running if services[n].get("restart") != "no"}
    assert {"shard-0", "shard-1", "coordinator"} <= long_running

    # The certificates the processes present are the ones the certs service wrote.
    assert (loop.volumes_root / "certs" / "ca.pem").exists()

    # Each shard published the address it advertises, never its wildcard listener.
    db = Database.connect(loop.database_url)
    try:
        store = Store(db.engine)

        async def both_published() -> dict[str, ShardRow] | None:
            rows = {row.id: row for row in await store.shards()}
            both = all(rows.get(s) is not None and rows[s].address for s in ("shard-0", "shard-1"))
            return rows if both else None

        rows = await eventually(
            both_published, within=WITHIN_S, what="both shards to publish their addresses"
        )
    finally:
        await db.close()
    for shard in ("shard-0", "shard-1"):
        advertised = loop.text(shard, services[shard]["environment"]["BIGFLEET_SHARD_ADVERTISE"])
        published = rows[shard].address or ""
        assert published == advertised and not published.startswith("0.0.0.0"), (shard, published)

    # The coordinator's singleton workflow runs.
    async def coordinating() -> bool:
        with contextlib.suppress(Exception):
            described = await client.get_workflow_handle(COORDINATOR_ID).describe()
            return described.status == WorkflowExecutionStatus.RUNNING
        return False

    await eventually(coordinating, within=WITHIN_S, what="the coordinator workflow to run")

    # Nothing long-running has exited on the way.
    for name in sorted(long_running):
        run = stack.running[name]
        assert run.process.returncode is None, f"{name} exited\n{run.tail()}"
