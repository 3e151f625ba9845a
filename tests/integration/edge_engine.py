"""A stand-alone engine process for the edge fault test: killed with SIGKILL, started again.

    python -m tests.integration.edge_engine --database-url URL --temporal HOST:PORT \
        --socket PATH --shard ID

A real :class:`ShardProcess` whose Session port is one edge process that
the test starts itself (``spawn_edges=False``), so the edge outlives this
process. Both runs use one lease holder, so the second takes the lease at
once. It prints ``{"address", "pid", "epoch"}`` once the edge joined, then
answers one JSON line per command read on stdin:

    needs CLUSTER          {"needs": [aggregate, ...]}   the engine's needs in force
    node CLUSTER MACHINE   {"sent": bool}                a node update, the way back
    clusters               {"clusters": [...]}           sessions the edges reported
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from bigfleet import temporal
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.store import Database, Store
from bigfleet.v1alpha1 import provider_pb2, shard_pb2


def node_update(cluster: str, machine: str) -> shard_pb2.ShardMessage:
    """A node state update of a configured machine, as the node view sends it."""
    return shard_pb2.ShardMessage(
        node_state_update=shard_pb2.NodeStateUpdate(
            supersedes_key=f"node:{machine}",
            machine_id=machine,
            cluster_id=cluster,
            state=provider_pb2.MACHINE_STATE_CONFIGURED,
            node_name=machine,
        )
    )


def _answer(process: ShardProcess, line: str) -> dict[str, object]:
    words = line.split()
    if words[:1] == ["needs"]:
        return {"needs": [dict(n.aggregate) for n in process.engine.needs_of(words[1])]}
    if words[:1] == ["node"]:
        return {"sent": process.hub.send(words[1], node_update(words[1], words[2]))}
    if words[:1] == ["clusters"]:
        return {"clusters": process.hub.clusters()}
    return {"error": f"unknown command {line!r}"}


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--temporal", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--shard", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--edges", type=int, default=1, help="0: the Session port is a thread")
    args = parser.parse_args(argv)
    db = Database.connect(args.database_url)
    await db.migrate()
    client = await temporal.connect(args.temporal)
    process = ShardProcess(
        ShardOptions(
            shard_id=args.shard,
            listen=args.listen,
            holder="edge-fault-test",
            cycle_interval_s=0.5,
            apply_coalesce_s=0.05,
            edges=args.edges,
            edge_socket=args.socket,
            spawn_edges=False,
        ),
        store=Store(db.engine),
        temporal=client,
        providers={},
    )
    await process.start()
    print(json.dumps({"address": process.address, "pid": os.getpid(), "epoch": process.epoch}),
          flush=True)  # fmt: skip
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := (await reader.readline()).decode().strip():
            print(json.dumps(_answer(process, line)), flush=True)
    finally:
        await process.stop()
        await db.close()


if __name__ == "__main__":
    asyncio.run(main())
