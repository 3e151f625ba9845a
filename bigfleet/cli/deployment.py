"""What a deployment runs around its processes: ``migrate``, ``certs``, ``config``, ``health``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from bigfleet.cli import connections, runtime
from bigfleet.config import Settings

__all__ = ["certs", "health", "migrate", "show_config"]


def migrate(revision: str = "head") -> None:
    """Upgrade the database named by BIGFLEET_DATABASE_URL to ``revision``."""
    from bigfleet.store import Database

    settings = runtime.settings()
    if not settings.database_url:
        runtime.fail("BIGFLEET_DATABASE_URL is not set")

    async def main() -> None:
        from bigfleet.backoff import retrying

        assert settings.database_url
        db = Database.connect(settings.database_url)
        try:
            await retrying(
                "PostgreSQL", lambda: db.migrate(revision), within_s=settings.connect_timeout_s
            )
        finally:
            await db.close()

    runtime.run(main())
    typer.echo(f"database at {revision}")


def certs(
    out: Annotated[Path, typer.Argument(help="Directory to write into (created if missing).")],
    cluster: Annotated[
        list[str] | None, typer.Option("--cluster", help="A cluster id (repeatable).")
    ] = None,
    shard: Annotated[list[str] | None, typer.Option("--shard", help="A shard id (repeatable).")] = (
        None
    ),
    provider: Annotated[
        list[str] | None, typer.Option("--provider", help="A provider name (repeatable).")
    ] = None,
    admin: Annotated[bool, typer.Option(help="Issue an admin certificate.")] = True,
    readonly: Annotated[bool, typer.Option(help="Issue a readonly certificate.")] = True,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="Extra DNS name or IP every leaf answers to (repeatable; "
            "localhost, 127.0.0.1 and ::1 are always included).",
        ),
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of new certificates.")] = 365,
) -> None:
    """Create a development CA and one certificate per role and name.

    Writes ca.pem/ca.key (reused if present) and <role>[-<name>].pem/.key,
    each leaf with one bigfleet:// URI SAN. Point BIGFLEET_TLS_CERT,
    BIGFLEET_TLS_KEY and BIGFLEET_TLS_CA at a leaf, its key and ca.pem.
    """
    from bigfleet.certs import DEFAULT_HOSTS, write_bundle
    from bigfleet.identity import Identity, IdentityError, Role

    wanted: list[Identity] = []
    try:
        for role, names in (
            (Role.CLUSTER, cluster),
            (Role.SHARD, shard),
            (Role.PROVIDER, provider),
        ):
            for name in names or ():
                wanted.append(Identity.parse(f"bigfleet://{role.value}/{name}"))
    except IdentityError as err:
        runtime.fail(str(err))
    if admin:
        wanted.append(Identity(Role.ADMIN))
    if readonly:
        wanted.append(Identity(Role.READONLY))
    if not wanted:
        runtime.fail("nothing to issue: name at least one --cluster, --shard or --provider")
    hosts = (*DEFAULT_HOSTS, *(host or ()))
    for path in write_bundle(out, wanted, hosts=hosts, days=days):
        typer.echo(f"wrote {path} and {path.with_suffix('.key')}")
    typer.echo(f"CA: {out / 'ca.pem'}")


def show_config() -> None:
    """List the environment variables BigFleet reads."""
    for name, meaning in Settings.describe().items():
        typer.echo(f"{name:<28} {meaning}")


def health(
    address: Annotated[str, typer.Argument(help="HOST:PORT of the server to probe.")],
    service: Annotated[
        str, typer.Option(help="gRPC service whose status to ask ('' is the whole server).")
    ] = "",
    temporal_frontend: Annotated[
        bool,
        typer.Option(
            "--temporal",
            help="Probe a Temporal frontend: it answers and knows BIGFLEET_TEMPORAL_NAMESPACE.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for an answer.")] = 5.0,
) -> None:
    """Exit 0 when ADDRESS is ready, 1 (with one line saying why) when it is not.

    A shard or provider is asked grpc.health.v1 with the process's own TLS
    settings (BIGFLEET_TLS_*: mutual TLS; unset: plaintext). For container
    healthchecks and start-up scripts.
    """
    from bigfleet.health import NotReady, probe_grpc, probe_temporal

    settings = runtime.settings()

    async def main() -> str:
        if temporal_frontend:
            return await probe_temporal(
                address,
                namespace=settings.temporal_namespace,
                tls=connections.temporal_tls(settings),
                timeout_s=timeout,
            )
        from bigfleet.identity import client_security

        return await probe_grpc(
            address, security=client_security(settings.tls), service=service, timeout_s=timeout
        )

    try:
        status = asyncio.run(main())
    except NotReady as err:
        typer.echo(f"not ready: {err}", err=True)
        raise typer.Exit(1) from None
    except (OSError, ValueError) as err:  # unreadable TLS files, a malformed address
        typer.echo(f"not ready: {address}: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{address}: {status}")
