"""The CLI against a running dev stack, with no BIGFLEET_* variable exported.

The dev stack writes where it can be reached into its data dir; every
command that reads PostgreSQL, Temporal, a shard or a provider finds it
there. As an operator would: ``make dev`` in a checkout keeps its data in
``.bigfleet`` there, and the CLI, run in the same directory with no
``BIGFLEET_*`` variable at all (not even the data dir), finds it. Without
a stack, a command fails with one line and a hint, not a traceback. The
CLI runs as a subprocess, as an operator would run it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bigfleet.config import Settings
from bigfleet.devstack import DevStack
from bigfleet.endpoints import ENDPOINTS_FILE
from clusters.operator import DemandPattern
from tests.e2e.stacks import one_shard
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


def _clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BIGFLEET_")}


async def bigfleet(checkout: Path, *args: str) -> tuple[int, str]:
    """Run ``bigfleet ARGS`` in ``checkout`` with no BIGFLEET_* variable."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bigfleet",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_clean_environment(),
        cwd=checkout,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest.fixture
async def stack(tmp_path: Path, empty_database_url: str) -> AsyncIterator[DevStack]:
    options = one_shard(
        # Where `make dev` keeps its data when nothing says otherwise.
        tmp_path / Settings().data_dir,
        empty_database_url,
        (
            ("cli-web", DemandPattern(cpu=8, memory_gib=16, priority=500_000)),
            # Asks for a zone no provider has: short, with "no matching supply".
            (
                "cli-nowhere",
                DemandPattern(
                    cpu=4,
                    memory_gib=8,
                    requirements=(("topology.kubernetes.io/zone", 1, ("zone-nowhere",)),),
                ),
            ),
        ),
    )
    dev = DevStack(options)
    try:
        await dev.start()
        yield dev
    finally:
        await dev.stop()


async def test_every_reading_command_finds_the_dev_stack_by_itself(stack: DevStack) -> None:
    data_dir = stack.options.data_dir
    assert (data_dir / ENDPOINTS_FILE).exists()
    checkout = data_dir.parent

    code, out = await bigfleet(checkout, "shards")
    assert code == 0 and "shard-0" in out, out
    code, out = await bigfleet(checkout, "clusters")
    assert code == 0 and "cli-web" in out, out
    code, out = await bigfleet(checkout, "coordinator", "status")
    assert code == 0 and out.startswith("term "), out
    code, out = await bigfleet(checkout, "drains")
    assert code == 0, out

    async def configured() -> str:
        code, out = await bigfleet(checkout, "machines", "--cluster", "cli-web")
        return out if code == 0 and "CONFIGURED" in out else ""

    out = await eventually(configured, within=90, what="cli-web's machines configured")
    assert "shard-0" in out and "cli-web" in out

    async def short() -> str:
        code, out = await bigfleet(checkout, "needs", "--unmet")
        return out if code == 0 and "cli-nowhere" in out else ""

    out = await eventually(short, within=30, what="the need nothing can serve reported short")
    (row,) = [line for line in out.splitlines() if "cli-nowhere" in line]
    assert "short cpu=4" in row and "no-matching-supply" in row and " 0/0/0 " in row, row
    code, out = await bigfleet(checkout, "needs", "--cluster", "cli-web")
    assert code == 0 and "cli-web" in out and "cli-nowhere" not in out, out


async def test_without_a_stack_a_command_fails_in_one_line_with_a_hint(tmp_path: Path) -> None:
    for args in (("shards",), ("drains",), ("machine", "show", "m-1"), ("needs",)):
        code, out = await bigfleet(tmp_path, *args)
        lines = out.strip().splitlines()
        assert code == 2, (args, out)
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, out)
        assert "make dev" in lines[0] and "Traceback" not in out


async def test_an_unreachable_database_is_one_line_naming_it(tmp_path: Path) -> None:
    code, out = await bigfleet(
        tmp_path, "shards", "--database-url", "postgresql://nobody:secret@127.0.0.1:1/x"
    )
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert "cannot reach PostgreSQL at postgresql://nobody:***@127.0.0.1:1/x" in lines[0]
    assert "secret" not in out


async def test_an_unreachable_temporal_is_one_line_naming_it(tmp_path: Path) -> None:
    code, out = await bigfleet(tmp_path, "drains", "--address", "127.0.0.1:1")
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1, out
    assert "cannot reach Temporal at 127.0.0.1:1" in lines[0]
