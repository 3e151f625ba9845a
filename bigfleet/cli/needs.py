"""``bigfleet needs``: why-not, every need and what the last cycle made of it (ShardRead)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.options import DatabaseOption

__all__ = ["needs_list"]


def needs_list(
    cluster: Annotated[str, typer.Option("--cluster", help="Only this cluster's needs.")] = "",
    unmet: Annotated[bool, typer.Option("--unmet", help="Only needs still short.")] = False,
    shard: Annotated[
        list[str] | None,
        typer.Option(
            "--shard", help="A shard's Session address HOST:PORT (default: every live shard)."
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Why-not: every need and what the last cycle made of it (ShardRead/InspectNeeds).

    Columns: SHARD, CLUSTER, NEED (its key), PRIORITY, STATUS (ok, or what is
    still missing), REASON (why it is short), SUPPLY (matching machines
    idle/configured/speculative; + when capped), VICTIMS (lower-priority
    machines preempted for it), AGE (cycles short).
    """
    from bigfleet.identity import channel, client_security
    from bigfleet.v1alpha1 import shardread_pb2, shardread_pb2_grpc

    settings = runtime.settings()

    async def addresses() -> dict[str, str]:
        if shard:
            return {address: address for address in shard}
        found = connections.endpoints(database_url=database_url)
        if found.shards and not database_url:
            return dict(found.shards)
        async with connections.open_store(database_url) as store:
            rows = await store.shards()
        return {r.id: r.address for r in rows if r.address and r.lease_holder}

    async def main() -> None:
        targets = await addresses()
        if not targets:
            runtime.fail(
                "no shard is serving (no live lease with an address); is `make dev` running?"
            )
        security = client_security(settings.tls)
        typer.echo(
            f"{'SHARD':<10} {'CLUSTER':<18} {'NEED':<16} {'PRIORITY':>9} {'STATUS':<22} "
            f"{'REASON':<24} {'SUPPLY':<14} {'VICTIMS':>7} {'AGE':>4}"
        )
        shown = 0
        for shard_id, address in sorted(targets.items()):
            runtime.REACHING.append(f"shard {shard_id} at {address}")
            conn = channel(address, security)
            try:
                stub = shardread_pb2_grpc.ShardReadStub(conn)
                request = shardread_pb2.InspectNeedsRequest(cluster_id=cluster)
                async for frame in stub.InspectNeeds(request, timeout=10):
                    if frame.WhichOneof("frame") == "header":
                        header = frame.header
                        if header.cycle == 0:
                            typer.echo(f"{shard_id:<10} (no cycle yet)")
                        continue
                    view = frame.need
                    if unmet and view.satisfied:
                        continue
                    typer.echo(_need_row(shard_id, view))
                    shown += 1
            finally:
                await conn.close(None)
        if not shown:
            typer.echo("no unmet needs" if unmet else "no needs")

    runtime.run(main())


def _need_row(shard_id: str, view: Any) -> str:
    """One NeedView as a table row (see ``bigfleet needs``)."""
    from bigfleet.v1alpha1 import shardread_pb2

    deficit = ",".join(f"{k}={v}" for k, v in sorted(view.residual_deficit.resources.items()))
    status = "ok" if view.satisfied else f"short {deficit}"
    reason = ""
    if not view.satisfied:
        name = shardread_pb2.UnmetReason.Name(view.unmet_reason)
        reason = name.removeprefix("UNMET_REASON_").lower().replace("_", "-")
        if reason == "unspecified":
            reason = view.unmet_detail.split(":", 1)[0] or "-"
    supply = "-"
    if view.HasField("matching_supply"):
        m = view.matching_supply
        supply = f"{m.idle}/{m.configured}/{m.speculative}{'+' if m.capped else ''}"
    victims = view.preemption.victims_found if view.HasField("preemption") else 0
    return (
        f"{shard_id:<10} {view.cluster_id:<18} {view.need_key[:16]:<16} {view.need.priority:>9} "
        f"{status[:22]:<22} {reason[:24]:<24} {supply:<14} {victims:>7} {view.age_cycles_unmet:>4}"
    )
