"""``bigfleet nanook``: serve a Nanook worker pool through BigFleet, and talk to one.

    bigfleet nanook serve --config pool.yaml --cluster-id ID --shard HOST:PORT \\
        --rest-listen HOST:PORT --grpc-listen HOST:PORT
    bigfleet nanook status   --rest http://HOST:PORT   (or --grpc HOST:PORT)
    bigfleet nanook scale-to N [--keep ID ...] --rest URL (or --grpc HOST:PORT)
    bigfleet nanook check-config pool.yaml
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nanook.client import GrpcScalingClient, RestScalingClient, ScalingClient, ScalingError
from nanook.session import ChannelFactory, insecure_channel

app = typer.Typer(help="Serve the Polars Nanook scaling protocol for one worker pool.")

_channels: list[Callable[[], ChannelFactory]] = [lambda: insecure_channel]


def install_channel_factory(factory: Callable[[], ChannelFactory]) -> None:
    """Set how ``serve`` opens its Session channel (the ``bigfleet`` command installs
    one that reads BIGFLEET_TLS_*; without it, plaintext)."""
    _channels[0] = factory


@app.command("serve")
def serve_command(
    config: Annotated[Path, typer.Option("--config", help="The pool configuration file (YAML).")],
    cluster_id: Annotated[str, typer.Option("--cluster-id", help="This cluster's id in BigFleet.")],
    shard: Annotated[str, typer.Option("--shard", help="The shard's Session address HOST:PORT.")],
    rest_listen: Annotated[
        str, typer.Option("--rest-listen", help="REST scaling service address (base path /).")
    ] = "127.0.0.1:8480",
    grpc_listen: Annotated[
        str, typer.Option("--grpc-listen", help="gRPC ScalingService address.")
    ] = "127.0.0.1:8481",
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the adapter: a cluster operator for the pool, serving REST and gRPC to its scheduler."""
    from nanook.adapter import serve
    from nanook.config import PoolConfigError, load_pool_config

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    try:
        load_pool_config(config)
    except PoolConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if not cluster_id.strip():
        typer.echo("error: --cluster-id: must not be empty", err=True)
        raise typer.Exit(2)

    channel_factory = _channels[0]()

    async def main() -> None:
        task = asyncio.create_task(
            serve(
                config,
                rest_listen=rest_listen,
                grpc_listen=grpc_listen,
                shard=shard,
                cluster_id=cluster_id,
                channel_factory=channel_factory,
            )
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


@app.command("check-config")
def check_config(
    path: Annotated[Path, typer.Argument(help="The pool configuration file.")],
) -> None:
    """Validate a pool file and print what it asks BigFleet for per worker."""
    from nanook.config import PoolConfigError, load_pool_config

    try:
        cfg = load_pool_config(path)
    except PoolConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        json.dumps(
            {
                "worker": dict(cfg.worker),
                "requirements": [
                    {"key": r.key, "operator": r.operator, "values": list(r.values)}
                    for r in cfg.requirements
                ],
                "priority": cfg.priority,
                "min": cfg.min,
                "max": cfg.max,
            },
            indent=2,
        )
    )


def _client(rest: str | None, grpc_address: str | None) -> ScalingClient:
    if bool(rest) == bool(grpc_address):
        typer.echo("error: give exactly one of --rest URL or --grpc HOST:PORT", err=True)
        raise typer.Exit(2)
    if rest:
        return RestScalingClient(rest)
    assert grpc_address is not None
    return GrpcScalingClient(grpc_address)


RestOpt = Annotated[str | None, typer.Option("--rest", help="REST base URL, e.g. http://h:8480")]
GrpcOpt = Annotated[str | None, typer.Option("--grpc", help="gRPC address HOST:PORT")]


@app.command("status")
def status(rest: RestOpt = None, grpc: GrpcOpt = None) -> None:
    """Print the scaling service's configuration and state, as the scheduler reads it."""
    client = _client(rest, grpc)

    async def main() -> None:
        try:
            state = await client.scale_config()
        finally:
            if isinstance(client, GrpcScalingClient):
                await client.close()
        typer.echo(json.dumps(state.__dict__))

    try:
        asyncio.run(main())
    except ScalingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


@app.command("scale-to")
def scale_to(
    amount: Annotated[int, typer.Argument(help="Target number of workers.")],
    keep: Annotated[list[str] | None, typer.Option("--keep", help="A worker to keep.")] = None,
    rest: RestOpt = None,
    grpc: GrpcOpt = None,
) -> None:
    """Ask for a pool size the way the scheduler does (with its retries)."""
    client = _client(rest, grpc)

    async def main() -> None:
        try:
            await client.scale_to(amount, keep=keep or [])
        finally:
            if isinstance(client, GrpcScalingClient):
                await client.close()

    try:
        asyncio.run(main())
    except ScalingError as err:
        typer.echo(f"refused: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"accepted: {amount}")
