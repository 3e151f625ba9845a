"""``bigfleet dev`` pointed at a Temporal that is not up yet waits for it (with back-off).

The stack's own servers are waited for anyway; a given ``temporal_address``
(or database URL) is retried for ``connect_timeout_s``
(``BIGFLEET_CONNECT_TIMEOUT_SECONDS``), as every other process does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet.devstack import DevStack, DevStackOptions
from bigfleet.temporal import start_dev_server
from tests.ports import free_port

pytestmark = pytest.mark.e2e


async def test_the_dev_stack_waits_for_a_temporal_that_comes_up_late(
    tmp_path: Path, empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    options = DevStackOptions(
        data_dir=tmp_path,
        database_url=empty_database_url,
        temporal_address=f"127.0.0.1:{port}",
        shard_listen="127.0.0.1:0",
        clusters=(),
        coordinator=False,
        persist=False,
        connect_timeout_s=120.0,
    )
    late: list[WorkflowEnvironment] = []

    def waited() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "bigfleet.backoff"]

    async def start_late() -> None:
        # Temporal comes up once the stack has found it absent and said it waits
        # (however long the stack takes to get there), not after a fixed pause.
        deadline = time.monotonic() + 60
        while True:
            if waited() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        late.append(await start_dev_server(port=port, ui=False))

    stack = DevStack(options)
    caplog.set_level(logging.WARNING, logger="bigfleet.backoff")
    starter = asyncio.create_task(start_late())
    try:
        await stack.start()
        assert stack.temporal_address == f"127.0.0.1:{port}"
        assert stack.client is not None
        assert await stack.client.service_client.check_health()
        said = waited()
        assert said and all(f"Temporal at 127.0.0.1:{port}" in m for m in said), said
    finally:
        await stack.stop()
        await starter
        for env in late:
            await env.shutdown()


async def test_without_a_retry_window_an_absent_temporal_fails_at_once(
    tmp_path: Path, empty_database_url: str
) -> None:
    options = DevStackOptions(
        data_dir=tmp_path,
        database_url=empty_database_url,
        temporal_address=f"127.0.0.1:{free_port()}",
        clusters=(),
        coordinator=False,
        persist=False,
    )
    stack = DevStack(options)
    try:
        with pytest.raises(RuntimeError, match="connect"):
            await stack.start()
    finally:
        await stack.stop()
