"""make dev for rehearsing operations: a stuck drain that waits for a person; a quiet Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bigfleet.devstack import DevStack
from bigfleet.endpoints import ENDPOINTS_FILE
from clusters.operator import DemandPattern
from tests.e2e.stacks import one_shard
from tests.ports import free_port
from tests.waiting import eventually
from workflows import search_attributes as sa
from workflows.drain import DrainWorkflow

pytestmark = pytest.mark.e2e


@pytest.fixture
async def rehearsal(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    options = one_shard(
        tmp_path,
        empty_database_url,
        (("rehearse", DemandPattern(cpu=8, memory_gib=16, priority=200_000)),),
        stuck_drain=True,
    )
    dev = DevStack(options)
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def test_the_injected_stuck_drain_ends_waiting_for_an_operator(rehearsal: DevStack) -> None:
    dev = rehearsal
    assert dev.client is not None
    machine_id = await eventually(lambda: dev.stuck_drain, within=90, what="the stuck drain")
    query = f"BigFleetMachineId = '{machine_id}' AND BigFleetOperation = 'drain'"

    async def parked() -> Any:
        async for wf in dev.client.list_workflows(query):  # type: ignore[union-attr]
            if wf.typed_search_attributes.get(sa.PHASE) == sa.AWAITING_OPERATOR:
                return wf
        return None

    wf = await eventually(parked, within=120, what="the drain to wait for an operator")
    assert wf.typed_search_attributes.get(sa.REASON) == "operator"
    view = await dev.client.get_workflow_handle(wf.id).query(DrainWorkflow.view)
    assert view.awaiting_operator and view.reason == "operator"
    assert f"stuck drain: {machine_id}" in dev.summary()
    await dev.client.get_workflow_handle(wf.id).signal(DrainWorkflow.abandon)


async def test_ctrl_c_stops_the_dev_stack_with_one_line(
    tmp_path: Path, empty_database_url: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIGFLEET_")}
    env["BIGFLEET_DATABASE_URL"] = empty_database_url
    args = [
        sys.executable, "-m", "bigfleet", "dev",
        "--data-dir", str(tmp_path),
        "--temporal-port", str(free_port()),
        "--ui-port", str(free_port()),
        "--shard-port", str(free_port()),
        "--metrics-port", "0",
        "--temporal-metrics-port", "0",
        "--summary-every", "1",
    ]  # fmt: skip
    # Its own session: the SIGINT below reaches this process group only, as a terminal's would.
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []

    async def read_until(marker: str) -> None:
        while not any(marker in line for line in seen):
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)  # type: ignore[union-attr]
            if not line:
                raise AssertionError("bigfleet dev exited early:\n" + "".join(seen))
            seen.append(line.decode())

    try:
        # The first summary, stamped and explained: everything is up.
        await read_until("(machines: the shard's inventory by state")
        assert any(line.startswith("— at ") for line in seen)
        assert (tmp_path / ENDPOINTS_FILE).exists()
        before = len(seen)
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
    after = [line for line in [*seen[before:], *rest.decode().splitlines(True)] if line.strip()]
    tail = [line for line in after if not line.startswith(("— at ", "  ", "coordinator", "shard"))]
    assert [line.strip() for line in tail] == ["stopped"], "".join(after)
    assert proc.returncode == 0
    assert not (tmp_path / ENDPOINTS_FILE).exists()
