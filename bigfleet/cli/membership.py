"""``bigfleet shards [drain | remove]`` and ``bigfleet clusters``: who serves what (PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.options import DatabaseOption

__all__ = ["clusters_list", "shards_app"]


shards_app = typer.Typer(help="Shard membership: list (no subcommand), drain, remove.")


@shards_app.callback(invoke_without_command=True)
def shards_list(ctx: typer.Context, database_url: DatabaseOption = None) -> None:
    """Shard membership: leases, epochs, clusters and machines per shard."""
    if ctx.invoked_subcommand is not None:
        return

    async def main() -> None:
        from bigfleet.store.controls import ALL_SHARDS, Control, ControlStore

        async with connections.open_store(database_url) as store:
            rows = await store.shards()
            controls = await ControlStore(store.engine).all()
        fleet = controls.get(ALL_SHARDS)
        typer.echo(
            f"{'shard':<12} {'state':<9} {'epoch':>5} {'clusters':>8} {'machines':>8}  "
            f"{'acting':<16} lease"
        )
        for r in rows:
            lease = (
                f"{r.lease_holder} until {r.lease_expires_at:%H:%M:%S}"
                if r.lease_holder and r.lease_expires_at
                else "free"
            )
            # Pause, dry run (bigfleet pause / dry-run, this shard's or --all's) and shadow.
            control = controls.get(r.id, Control(r.id)).combined(fleet)
            acting = (
                "shadow"
                if control.shadow
                else "paused"
                if control.paused
                else "dry-run"
                if control.dry_run
                else "active"
            )
            typer.echo(
                f"{r.id:<12} {r.state:<9} {r.epoch:>5} {r.clusters:>8} {r.machines:>8}  "
                f"{acting:<16} {lease}"
            )
            if control.reason:
                typer.echo(f"{'':<12} {acting}: {control.reason} ({control.changed_by or '?'})")

    runtime.run(main())


@shards_app.command("drain")
def shards_drain(
    shard_id: Annotated[str, typer.Argument(help="The shard to drain.")],
    wait: Annotated[
        bool, typer.Option(help="Wait until it owns no cluster and no machine.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    database_url: DatabaseOption = None,
) -> None:
    """Drain a shard: it takes nothing new and gives all it owns to active shards.

    The coordinator moves each of its clusters with the machines bound to it
    (the operator is told to reconnect to the new shard), hands its other
    machines over rack by rack, and rebalances its quota away.
    """
    from bigfleet.store import MembershipError

    async def main() -> str:
        async with connections.open_store(database_url) as store:
            try:
                await store.drain_shard(shard_id)
            except KeyError as err:
                return str(err.args[0])
            except MembershipError as err:
                return str(err)
            row = await store.shard(shard_id)
            assert row is not None
            active = ", ".join(await store.active_shards())
            typer.echo(
                f"shard {shard_id} is draining: {row.clusters} cluster(s) and {row.machines} "
                f"machine(s) move to {active} as the coordinator gets to them"
            )
            if not wait:
                typer.echo(
                    f"follow with `bigfleet shards`; then `bigfleet shards remove {shard_id}`"
                )
                return ""
            deadline = asyncio.get_running_loop().time() + timeout
            last = (row.clusters, row.machines)
            while last != (0, 0):
                if asyncio.get_running_loop().time() > deadline:
                    return (
                        f"shard {shard_id} still owns {last[0]} cluster(s) and {last[1]} "
                        f"machine(s) after {timeout:g} s (is the coordinator running?)"
                    )
                await asyncio.sleep(1.0)
                row = await store.shard(shard_id)
                assert row is not None
                if (row.clusters, row.machines) != last:
                    last = (row.clusters, row.machines)
                    typer.echo(f"  {last[0]} cluster(s), {last[1]} machine(s) left")
            typer.echo(f"shard {shard_id} owns nothing; remove it with `bigfleet shards remove`")
            return ""

    error = runtime.result(main())
    if error:
        runtime.fail(error)


@shards_app.command("remove")
def shards_remove(
    shard_id: Annotated[str, typer.Argument(help="The drained shard to remove.")],
    database_url: DatabaseOption = None,
) -> None:
    """Remove a drained shard. Refused while it still owns clusters or machines."""
    from bigfleet.store import MembershipError

    async def main() -> str:
        async with connections.open_store(database_url) as store:
            try:
                await store.remove_shard(shard_id)
            except KeyError as err:
                return str(err.args[0])
            except MembershipError as err:
                return str(err)
        return ""

    error = runtime.result(main())
    if error:
        runtime.fail(error)
    typer.echo(f"shard {shard_id} removed")


def clusters_list(database_url: DatabaseOption = None) -> None:
    """Which shard serves each cluster (assigned on first contact, permanent)."""

    async def main() -> None:
        async with connections.open_store(database_url) as store:
            for c in await store.clusters():
                typer.echo(
                    f"{c.cluster_id:<32} {c.shard_id:<12} since {c.first_seen_at:%Y-%m-%d %H:%M:%S}"
                )

    runtime.run(main())
