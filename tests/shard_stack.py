"""A real shard process for integration tests: Temporal dev server, migrated database, no providers.

The edge tests and the roll-up counting test start the same stack and differ
only in the cycle cadence, the intake's coalescing window and the number of
edge processes; this is that stack, once.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from bigfleet.temporal import start_dev_server
from tests.ports import free_port


@contextlib.asynccontextmanager
async def shard_process(
    database_url: str,
    shard_id: str,
    *,
    edges: int,
    cycle_interval_s: float,
    apply_coalesce_s: float = 0.05,
) -> AsyncIterator[ShardProcess]:
    """A started shard process on ``database_url`` (migrated), stopped with its servers after."""
    env = await start_dev_server(port=free_port(), ui=False)
    db = Database.connect(database_url)
    await db.migrate()
    process = ShardProcess(
        ShardOptions(
            shard_id=shard_id,
            listen="127.0.0.1:0",
            cycle_interval_s=cycle_interval_s,
            apply_coalesce_s=apply_coalesce_s,
            edges=edges,
            edge_socket=str(Path(tempfile.mkdtemp(prefix="bf-")) / "edge.sock"),
        ),
        store=Store(db.engine),
        temporal=env.client,
        providers={},
    )
    await process.start()
    try:
        yield process
    finally:
        await process.stop()
        await db.close()
        await env.shutdown()
