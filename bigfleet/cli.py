"""The ``bigfleet`` command line: run the stack or one of its parts, inspect, escalate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

# gRPC's core reads its log level once, when it loads: below ERROR it prints
# every failed TLS handshake itself, where a command's one line already says it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import typer

from bigfleet.config import ConfigError, Settings
from bigfleet.endpoints import Endpoints, EndpointsMissing

if TYPE_CHECKING:
    from temporalio.service import TLSConfig

    from bigfleet.store import Store
    from providers.server import ServerSecurity

app = typer.Typer(help="BigFleet: a fleet-level infrastructure autoscaler.", no_args_is_help=True)


def _mount_provider_commands() -> None:
    from providers.cli import app as provider_app
    from providers.cli import install_security

    install_security(_provider_security)
    app.add_typer(provider_app, name="provider", help="Run a simulated capacity provider.")


def _provider_security() -> ServerSecurity | None:
    """Mutual TLS for ``bigfleet provider serve`` when BIGFLEET_TLS_* is set."""
    from bigfleet.identity import KeyPairSource, provider_security

    files = _settings().tls
    return provider_security(KeyPairSource(files)) if files is not None else None


_mount_provider_commands()


def _mount_simulate_command() -> None:
    from simulator.cli import simulate_command

    app.command(name="simulate")(simulate_command)


_mount_simulate_command()


def _mount_nanook_commands() -> None:
    from nanook.cli import app as nanook_app
    from nanook.cli import install_channel_factory

    install_channel_factory(_nanook_channels)
    app.add_typer(nanook_app, name="nanook", help="Serve a Polars Nanook worker pool.")


def _nanook_channels() -> Callable[[str], Any]:
    """Session channels for ``bigfleet nanook serve``: mutual TLS when BIGFLEET_TLS_* is set
    (the certificate must be the pool's ``bigfleet://cluster/<id>``)."""
    from bigfleet.identity import channel, client_security

    security = client_security(_settings().tls)

    def open_channel(address: str) -> Any:
        return channel(address, security)

    return open_channel


_mount_nanook_commands()


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # pgserver logs initdb's whole output at INFO; the others chatter likewise.
    for noisy in ("temporalio", "sqlalchemy", "alembic", "asyncio", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await main(stop)


@app.command()
def dev(
    data_dir: Annotated[Path, typer.Option(help="Where local state lives.")] = Path(".bigfleet"),
    time_factor: Annotated[
        float,
        typer.Option(help="Scales simulated provider latencies (0.05: a 60 s boot takes 3 s)."),
    ] = 0.05,
    fresh: Annotated[bool, typer.Option(help="Delete local state first.")] = False,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
    temporal_port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    shard_port: Annotated[int, typer.Option(help="Shard.Session port.")] = 7443,
    summary_every: Annotated[float, typer.Option(help="Seconds between summaries.")] = 5.0,
    drain_seconds: Annotated[
        float | None,
        typer.Option(
            help="Rehearse escalation: drains take about this many seconds (default: a few)."
        ),
    ] = None,
    stuck_drain: Annotated[
        bool,
        typer.Option(
            "--stuck-drain",
            help="Rehearse an operator's work: one demo machine's drain never finishes and "
            "ends in AwaitingOperator (bigfleet machine show/force/abandon).",
        ),
    ] = False,
    metrics_port: Annotated[
        int, typer.Option(help="Prometheus /metrics of the whole stack (0: not served).")
    ] = 9464,
    temporal_metrics_port: Annotated[
        int, typer.Option(help="The Temporal SDK's own Prometheus metrics (0: not served).")
    ] = 9465,
    shards: Annotated[int, typer.Option(min=1, max=16, help="Shard processes to run.")] = 1,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Mutual TLS on every gRPC edge, with dev certificates in DATA_DIR/certs.",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the full stack on embedded defaults with a demo fleet (Ctrl-C stops it)."""
    from bigfleet.devstack import DevStack, DevStackOptions

    _logging(verbose)
    if fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    settings = Settings.from_env()
    options = DevStackOptions(
        data_dir=data_dir,
        database_url=settings.database_url,
        temporal_address=settings.temporal_address,
        temporal_port=temporal_port,
        ui_port=ui_port,
        shard_listen=f"127.0.0.1:{shard_port}",
        time_factor=time_factor,
        shards=shards,
        tls=tls,
        metrics_listen=f"127.0.0.1:{metrics_port}" if metrics_port else None,
        drain_seconds=drain_seconds,
        stuck_drain=stuck_drain,
        temporal_metrics_listen=(
            f"127.0.0.1:{temporal_metrics_port}" if temporal_metrics_port else None
        ),
        connect_timeout_s=settings.connect_timeout_s,
    )

    async def main(stop: asyncio.Event) -> None:
        stack = DevStack(options)
        try:
            await stack.start()
            assert stack.shard is not None
            print(
                "\nBigFleet dev stack is up\n"
                f"  Temporal UI      http://localhost:{ui_port}  "
                "(search: BigFleetClusterId='demo-web')\n"
                f"  Temporal         {stack.temporal_address}\n"
                "  Shard.Session    "
                + ", ".join(f"{p.shard_id}={p.address}" for p in stack.shards)
                + "\n"
                "  Providers        "
                + ", ".join(
                    f"{n}={p.address}"
                    for n, p in zip(stack.provider_clients, stack.providers, strict=True)
                )
                + f"\n  PostgreSQL       {stack.database_url}\n"
                + (
                    f"  Metrics          http://{stack.metrics.address}/metrics\n"
                    if stack.metrics is not None
                    else ""
                )
                + (
                    f"  Temporal SDK     http://{stack.temporal_metrics_address}/metrics\n"
                    if stack.temporal_metrics_address
                    else ""
                )
                + (
                    f"  mTLS             certificates in {stack.certs_dir} "
                    "(admin.pem, readonly.pem, ca.pem)\n"
                    if stack.certs_dir is not None
                    else ""
                )
                + "  Ctrl-C stops everything.\n",
                flush=True,
            )
            while not stop.is_set():
                print(stack.summary() + "\n", flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=summary_every)
        finally:
            # A deliberate stop: every part saying it stopped is not news (-v keeps it).
            if not verbose:
                logging.disable(logging.CRITICAL)
            await stack.stop()
            print("stopped", flush=True)

    _run(_until_signalled(main))


@app.command()
def shard(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run one shard process configured from BIGFLEET_* environment variables."""
    from bigfleet import bootstrap

    _logging(verbose)
    settings = _settings()
    if not settings.database_url or not settings.temporal_address:
        _fail(
            "BIGFLEET_DATABASE_URL and BIGFLEET_TEMPORAL_ADDRESS must be set for `bigfleet shard`"
        )
    if not settings.providers:
        _fail("BIGFLEET_PROVIDERS must name at least one provider (NAME=HOST:PORT)")

    async def main(stop: asyncio.Event) -> None:
        async with bootstrap.connect(settings) as wiring:
            process = bootstrap.shard_process(
                bootstrap.shard_options(settings),
                store=wiring.store,
                temporal=wiring.temporal,
                providers=wiring.providers,
                tls=wiring.tls,
            )
            try:
                await process.start()
                await stop.wait()
            finally:
                await process.stop()

    _run_configured(_until_signalled(main))


coordinator_app = typer.Typer(help="The global coordinator.", no_args_is_help=True)
app.add_typer(coordinator_app, name="coordinator")


@coordinator_app.command("run")
def coordinator_run(
    interval: Annotated[float, typer.Option(help="Seconds between planning rounds.")] = 30.0,
    max_share: Annotated[
        float, typer.Option(help="Largest share of a shard's machines one instruction may move.")
    ] = 0.05,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the coordinator: a new term, its worker, and the singleton workflow."""
    from bigfleet import bootstrap

    _logging(verbose)
    settings = _settings()
    if not settings.database_url or not settings.temporal_address:
        _fail("BIGFLEET_DATABASE_URL and BIGFLEET_TEMPORAL_ADDRESS must be set")

    async def main(stop: asyncio.Event) -> None:
        async with bootstrap.connect(settings, search_attributes=False) as wiring:
            process = bootstrap.coordinator_process(
                store=wiring.store,
                temporal=wiring.temporal,
                providers=wiring.providers,
                interval_s=interval,
                max_share=max_share,
            )
            try:
                await process.start()
                await stop.wait()
            finally:
                await process.stop()

    _run_configured(_until_signalled(main))


@coordinator_app.command("status")
def coordinator_status(
    limit: Annotated[int, typer.Option(help="Instructions to show.")] = 20,
    database_url: _DatabaseOption = None,
) -> None:
    """The coordinator's term, pending instructions, and recent outcomes."""

    async def main() -> None:
        async with _open_store(database_url) as store:
            typer.echo(f"term {await store.term()}")
            rows = await store.instructions(limit=limit)
            if not rows:
                typer.echo("no instructions yet")
            for r in rows:
                typer.echo(
                    f"{r.term}/{r.seq:<5} {r.kind:<12} {r.donor_shard or '-':>10} -> "
                    f"{r.receiver_shard or '-':<10} {r.status:<8} {r.outcome or ''}"
                )

    _run(main())


shards_app = typer.Typer(help="Shard membership: list (no subcommand), drain, remove.")
app.add_typer(shards_app, name="shards")


@shards_app.callback(invoke_without_command=True)
def shards_list(ctx: typer.Context, database_url: _DatabaseOption = None) -> None:
    """Shard membership: leases, epochs, clusters and machines per shard."""
    if ctx.invoked_subcommand is not None:
        return

    async def main() -> None:
        async with _open_store(database_url) as store:
            rows = await store.shards()
        typer.echo(
            f"{'shard':<12} {'state':<9} {'epoch':>5} {'clusters':>8} {'machines':>8}  lease"
        )
        for r in rows:
            lease = (
                f"{r.lease_holder} until {r.lease_expires_at:%H:%M:%S}"
                if r.lease_holder and r.lease_expires_at
                else "free"
            )
            typer.echo(
                f"{r.id:<12} {r.state:<9} {r.epoch:>5} {r.clusters:>8} {r.machines:>8}  {lease}"
            )

    _run(main())


@shards_app.command("drain")
def shards_drain(
    shard_id: Annotated[str, typer.Argument(help="The shard to drain.")],
    wait: Annotated[
        bool, typer.Option(help="Wait until it owns no cluster and no machine.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    database_url: _DatabaseOption = None,
) -> None:
    """Drain a shard: it takes nothing new and gives all it owns to active shards.

    The coordinator moves each of its clusters with the machines bound to it
    (the operator is told to reconnect to the new shard), hands its other
    machines over rack by rack, and rebalances its quota away.
    """
    from bigfleet.store.repository import MembershipError

    async def main() -> str:
        async with _open_store(database_url) as store:
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

    error = _result(main())
    if error:
        _fail(error)


@shards_app.command("remove")
def shards_remove(
    shard_id: Annotated[str, typer.Argument(help="The drained shard to remove.")],
    database_url: _DatabaseOption = None,
) -> None:
    """Remove a drained shard. Refused while it still owns clusters or machines."""
    from bigfleet.store.repository import MembershipError

    async def main() -> str:
        async with _open_store(database_url) as store:
            try:
                await store.remove_shard(shard_id)
            except KeyError as err:
                return str(err.args[0])
            except MembershipError as err:
                return str(err)
        return ""

    error = _result(main())
    if error:
        _fail(error)
    typer.echo(f"shard {shard_id} removed")


@app.command("decommission")
def decommission(
    provider: Annotated[str, typer.Option(help="The provider whose machines retire.")],
    label: Annotated[
        str, typer.Option(help="The domain's label, e.g. topology.kubernetes.io/rack.")
    ],
    value: Annotated[str, typer.Option(help="The domain's label value.")],
    count: Annotated[int, typer.Option(min=1, help="How many machines of the domain retire.")],
    reason: Annotated[str, typer.Option(help="Kept with each retired machine.")] = "decommissioned",
    address: _AddressOption = None,
) -> None:
    """Retire machines of a domain, the same share from every shard that holds some.

    Runs as a workflow on the coordinator's task queue (the coordinator must
    be running); unbound machines are quarantined at once, configured ones are
    drained first. Retired machines stay out across restarts.
    """
    from bigfleet import temporal
    from workflows import coordinator as co

    settings = _settings()

    async def main() -> None:
        client = await temporal.connect(
            _temporal_address(address), settings.temporal_namespace, tls=_temporal_tls(settings)
        )
        result = await client.execute_workflow(
            co.DecommissionWorkflow.run,
            co.DecommissionInput(provider, label, value, count, reason),
            id=f"{co.COORDINATOR_ID}/decommission/{provider}/{label}={value}/{int(time.time())}",
            task_queue=co.COORDINATOR_QUEUE,
        )
        for shard_id, retired in sorted(result.retired.items()):
            typer.echo(f"{shard_id:<12} retired {retired}")
        if not result.retired:
            typer.echo(f"no machine of {provider} has {label}={value}")

    _run(main())


@app.command("clusters")
def clusters_list(database_url: _DatabaseOption = None) -> None:
    """Which shard serves each cluster (assigned on first contact, permanent)."""

    async def main() -> None:
        async with _open_store(database_url) as store:
            for c in await store.clusters():
                typer.echo(
                    f"{c.cluster_id:<32} {c.shard_id:<12} since {c.first_seen_at:%Y-%m-%d %H:%M:%S}"
                )

    _run(main())


@app.command()
def migrate(revision: str = "head") -> None:
    """Upgrade the database named by BIGFLEET_DATABASE_URL to ``revision``."""
    from bigfleet.store import Database

    settings = _settings()
    if not settings.database_url:
        _fail("BIGFLEET_DATABASE_URL is not set")

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

    _run(main())
    typer.echo(f"database at {revision}")


@app.command("certs")
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
        _fail(str(err))
    if admin:
        wanted.append(Identity(Role.ADMIN))
    if readonly:
        wanted.append(Identity(Role.READONLY))
    if not wanted:
        _fail("nothing to issue: name at least one --cluster, --shard or --provider")
    hosts = (*DEFAULT_HOSTS, *(host or ()))
    for path in write_bundle(out, wanted, hosts=hosts, days=days):
        typer.echo(f"wrote {path} and {path.with_suffix('.key')}")
    typer.echo(f"CA: {out / 'ca.pem'}")


@app.command("config")
def show_config() -> None:
    """List the environment variables BigFleet reads."""
    for name, meaning in Settings.describe().items():
        typer.echo(f"{name:<28} {meaning}")


@app.command("health")
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

    settings = _settings()

    async def main() -> str:
        if temporal_frontend:
            return await probe_temporal(
                address,
                namespace=settings.temporal_namespace,
                tls=_temporal_tls(settings),
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


# ------------------------------------------------------------ machine lifecycle
#
# Drains, deletes and failed machines each have their own workflow (found by
# BigFleetMachineId); these commands find it, read its ``view`` query and send
# the operator signals (escalate, force, retry, abandon, resolve).

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PER_MACHINE = ("DrainWorkflow", "DeleteWorkflow", "RecoverWorkflow", "VerifyWorkflow")


def parse_duration(text: str) -> float:
    """``90``, ``10s``, ``30m``, ``2h``, ``1h30m`` -> seconds."""
    cleaned = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise typer.BadParameter(f"{text!r} is not a duration like 90, 10s, 30m or 1h30m")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _temporal_address(address: str | None) -> str:
    """``--address``, BIGFLEET_TEMPORAL_ADDRESS or the running dev stack's Temporal."""
    found = _endpoints(address=address).need_temporal()
    _REACHING.append(f"Temporal at {found}")
    return found


def stuck_drains_query(older_than_s: float | None, *, now: float | None = None) -> str:
    """The visibility query for running drains (started more than ``older_than_s`` ago).

    The query itself is ``workflows.search_attributes.stuck_drains_query``, the
    one the README and the UI docs show.
    """
    from workflows.search_attributes import stuck_drains_query as query_for

    if older_than_s is None:
        return query_for()
    moment = datetime.fromtimestamp((time.time() if now is None else now) - older_than_s, tz=UTC)
    return query_for(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))


_DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL URL (default: $BIGFLEET_DATABASE_URL, else the running dev stack's).",
    ),
]
_AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Temporal frontend host:port (default: $BIGFLEET_TEMPORAL_ADDRESS, "
        "else the running dev stack's).",
    ),
]
_NamespaceOption = Annotated[str, typer.Option("--namespace", help="Temporal namespace.")]


@app.command("drains")
def drains_list(
    stuck: Annotated[
        bool, typer.Option("--stuck", help="Only drains running longer than --older-than.")
    ] = False,
    older_than: Annotated[
        str, typer.Option("--older-than", help="With --stuck: 30m, 2h, 90s ...")
    ] = "30m",
    show_query: Annotated[
        bool, typer.Option("--query", help="Print the Temporal UI query instead of running it.")
    ] = False,
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Running drains (each is its own workflow), oldest first."""
    query = stuck_drains_query(parse_duration(older_than) if stuck else None)
    if show_query:
        typer.echo(query)
        return

    async def main() -> None:
        from bigfleet import temporal
        from workflows import search_attributes as sa

        client = await temporal.connect(
            _temporal_address(address), namespace, tls=_temporal_tls(_settings())
        )
        rows = [wf async for wf in client.list_workflows(query)]
        rows.sort(key=lambda wf: wf.start_time)
        if not rows:
            typer.echo("no stuck drains" if stuck else "no drains running")
            return
        typer.echo(
            f"{'MACHINE':<44} {'CLUSTER':<16} {'REASON':<14} {'PHASE':<17} {'GRACE':>6} "
            f"{'PRIORITY':>9} {'AGE':>7}  WORKFLOW"
        )
        now = time.time()
        for wf in rows:
            attrs = wf.typed_search_attributes
            grace = attrs.get(sa.GRACE_SECONDS)
            typer.echo(
                f"{attrs.get(sa.MACHINE_ID) or '?':<44} {attrs.get(sa.CLUSTER_ID) or '':<16} "
                f"{attrs.get(sa.REASON) or '-':<14} "
                f"{attrs.get(sa.PHASE) or '':<17} {'-' if grace is None else f'{grace}s':>6} "
                f"{attrs.get(sa.PRIORITY) or 0:>9} "
                f"{_age(now - wf.start_time.timestamp()):>7}  {wf.id}"
            )
        typer.echo(
            "REASON: why the drain runs; PRIORITY: the drained workload's; "
            "AGE: since it started; GRACE: what the operator was given"
        )

    _run(main())


@app.command("needs")
def needs_list(
    cluster: Annotated[str, typer.Option("--cluster", help="Only this cluster's needs.")] = "",
    unmet: Annotated[bool, typer.Option("--unmet", help="Only needs still short.")] = False,
    shard: Annotated[
        list[str] | None,
        typer.Option(
            "--shard", help="A shard's Session address HOST:PORT (default: every live shard)."
        ),
    ] = None,
    database_url: _DatabaseOption = None,
) -> None:
    """Why-not: every need and what the last cycle made of it (ShardRead/InspectNeeds).

    Columns: SHARD, CLUSTER, NEED (its key), PRIORITY, STATUS (ok, or what is
    still missing), REASON (why it is short), SUPPLY (matching machines
    idle/configured/speculative; + when capped), VICTIMS (lower-priority
    machines preempted for it), AGE (cycles short).
    """
    from bigfleet.identity import channel, client_security
    from bigfleet.v1alpha1 import shardread_pb2, shardread_pb2_grpc

    settings = _settings()

    async def addresses() -> dict[str, str]:
        if shard:
            return {address: address for address in shard}
        found = _endpoints(database_url=database_url)
        if found.shards and not database_url:
            return dict(found.shards)
        async with _open_store(database_url) as store:
            rows = await store.shards()
        return {r.id: r.address for r in rows if r.address and r.lease_holder}

    async def main() -> None:
        targets = await addresses()
        if not targets:
            _fail("no shard is serving (no live lease with an address); is `make dev` running?")
        security = client_security(settings.tls)
        typer.echo(
            f"{'SHARD':<10} {'CLUSTER':<18} {'NEED':<16} {'PRIORITY':>9} {'STATUS':<22} "
            f"{'REASON':<24} {'SUPPLY':<14} {'VICTIMS':>7} {'AGE':>4}"
        )
        shown = 0
        for shard_id, address in sorted(targets.items()):
            _REACHING.append(f"shard {shard_id} at {address}")
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

    _run(main())


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


@app.command("machines")
def machines_list(
    cluster: Annotated[str, typer.Option("--cluster", help="Only machines bound to it.")] = "",
    state: Annotated[
        str, typer.Option("--state", help="Only machines in this provider state (CONFIGURED...).")
    ] = "",
    database_url: _DatabaseOption = None,
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Machines the shards own: provider state, binding, owner shard, the workflow running.

    Ownership and binding come from PostgreSQL, states from the providers
    (those of the running dev stack or BIGFLEET_PROVIDERS), running
    workflows from Temporal.
    """
    from bigfleet import temporal
    from bigfleet.identity import client_security
    from bigfleet.v1alpha1 import provider_pb2
    from providers.client import ProviderClient
    from workflows import search_attributes as sa

    settings = _settings()
    wanted = state.strip().upper().removeprefix("MACHINE_STATE_")
    names = set(provider_pb2.MachineState.keys())
    if wanted and f"MACHINE_STATE_{wanted}" not in names:
        _fail(f"--state: {state!r} is not a machine state (CONFIGURED, IDLE, DRAINING, ...)")

    async def main() -> None:
        found = _endpoints(database_url=database_url, address=address)
        async with _open_store(database_url) as store:
            rows = await store.machines(cluster_id=cluster or None)
        providers = dict(found.providers) or {p.name: p.address for p in settings.providers}
        states: dict[str, str] = {}
        security = client_security(settings.tls)
        for name, provider_address in sorted(providers.items()):
            _REACHING.append(f"provider {name} at {provider_address}")
            provider = ProviderClient(provider_address, security=security, name=name)
            try:
                listing = await provider.list_all()
            finally:
                await provider.close()
            for m in listing.machines:
                states[m.id] = provider_pb2.MachineState.Name(m.state).removeprefix(
                    "MACHINE_STATE_"
                )
        client = await temporal.connect(
            _temporal_address(address), namespace, tls=_temporal_tls(settings)
        )
        running: dict[str, str] = {}
        async for wf in client.list_workflows("ExecutionStatus = 'Running'"):
            for machine_id in wf.typed_search_attributes.get(sa.MACHINE_IDS) or []:
                running.setdefault(machine_id, f"{wf.workflow_type} {wf.id}")
        typer.echo(
            f"{'MACHINE':<44} {'STATE':<12} {'CLUSTER':<18} {'SHARD':<10} {'PROVIDER':<10} WORKFLOW"
        )
        listed = 0
        for row in rows:
            current = states.get(row.machine_id, "?")
            if wanted and current != wanted:
                continue
            typer.echo(
                f"{row.machine_id:<44} {current:<12} {row.cluster_id or '-':<18} "
                f"{row.shard_id:<10} {row.provider:<10} {running.get(row.machine_id, '-')}"
            )
            listed += 1
        if not listed:
            typer.echo("no machines match")

    _run(main())


machine_app = typer.Typer(
    help="One machine's workflow: show it, or push it with a signal.", no_args_is_help=True
)
app.add_typer(machine_app, name="machine")


@machine_app.command("show")
def machine_show(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """The machine's running workflows and their current view (or its last finished one)."""

    async def main() -> None:
        from bigfleet import temporal

        client = await temporal.connect(
            _temporal_address(address), namespace, tls=_temporal_tls(_settings())
        )
        running, recent = await _machine_workflows(client, machine_id)
        if not running and not recent:
            _fail(f"no workflow has touched machine {machine_id}")
        for wf in running or recent[:1]:
            typer.echo(await _describe_workflow(client, wf, machine_id))

    _run(main())


@machine_app.command("escalate")
def machine_escalate(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    grace: Annotated[str, typer.Option("--grace", help="The new, shorter grace: 10s, 2m ...")],
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Shorten a running drain's grace period (the operator and provider are told again)."""
    from workflows.contracts import EscalateSignal

    seconds = int(parse_duration(grace))
    _signal_machine(machine_id, "escalate", EscalateSignal(seconds), address, namespace)


@machine_app.command("force")
def machine_force(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Forced termination now (a drain with zero grace)."""
    _signal_machine(machine_id, "force", None, address, namespace)


@machine_app.command("retry")
def machine_retry(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Try the corrective action again (a parked drain, delete or recovery)."""
    _signal_machine(machine_id, "retry", None, address, namespace)


@machine_app.command("abandon")
def machine_abandon(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """Give up: the machine is marked FAILED and kept out of use for investigation."""
    _signal_machine(machine_id, "abandon", None, address, namespace)


@machine_app.command("resolve")
def machine_resolve(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    note: Annotated[str, typer.Option("--note", help="What was done out of band.")] = "",
    address: _AddressOption = None,
    namespace: _NamespaceOption = "default",
) -> None:
    """It was fixed out of band: the workflow re-reads the provider and continues."""
    from workflows.contracts import ResolveSignal

    _signal_machine(machine_id, "resolve", ResolveSignal(note), address, namespace)


def _signal_machine(
    machine_id: str, name: str, arg: Any, address: str | None, namespace: str
) -> None:
    """Send ``name`` to the machine's running per-machine workflow and print what changed."""

    async def main() -> None:
        from bigfleet import temporal

        client = await temporal.connect(
            _temporal_address(address), namespace, tls=_temporal_tls(_settings())
        )
        running, _ = await _machine_workflows(client, machine_id)
        mine = [wf for wf in running if wf.workflow_type in _PER_MACHINE]
        if not mine:
            where = ", ".join(f"{wf.id} ({wf.workflow_type})" for wf in running)
            _fail(
                f"machine {machine_id} has no running drain, delete or recovery workflow"
                + (f"; it is in {where}" if where else "")
            )
        wf = mine[0]
        handle = client.get_workflow_handle(wf.id)
        before = await _view(handle)
        if arg is None:
            await handle.signal(name)
        else:
            await handle.signal(name, arg)
        typer.echo(f"sent {name} to {wf.id} ({wf.workflow_type})")
        after = before
        for _ in range(100):  # the workflow reacts within a task or two (10 s at most)
            await asyncio.sleep(0.1)
            after = await _view(handle)
            if after is None or before is None or _changed(before, after):
                break
        # A reaction can take several steps (an error noted, an outcome recorded,
        # then the new phase): report the view once two reads a moment apart agree.
        for _ in range(50):
            if after is None or before is None or not _changed(before, after):
                break
            await asyncio.sleep(0.2)
            again = await _view(handle)
            if again is None or again == after:
                break
            after = again
        if before is None or after is None:
            typer.echo("  (the workflow did not answer its view query; is its shard running?)")
            return
        changes = _changed(before, after)
        if not changes:
            typer.echo("  no change yet (the signal is queued; `bigfleet machine show` later)")
        for line in changes:
            typer.echo(f"  {line}")

    _run(main())


async def _machine_workflows(client: Any, machine_id: str) -> tuple[list[Any], list[Any]]:
    """(running, recently closed) workflows that list ``machine_id``, newest first."""
    found = [
        wf
        async for wf in client.list_workflows(
            f"BigFleetMachineIds = '{machine_id}' OR BigFleetMachineId = '{machine_id}'",
            limit=50,
        )
    ]
    found.sort(key=lambda wf: wf.start_time, reverse=True)
    running = [wf for wf in found if wf.status is not None and wf.status.name == "RUNNING"]
    return running, [wf for wf in found if wf not in running]


async def _view(handle: Any) -> dict[str, Any] | None:
    from temporalio.service import RPCError

    try:
        view: dict[str, Any] = await handle.query("view")
    except RPCError:
        return None
    return view


_SHOWN_FIELDS = (
    "phase",
    "machine_state",
    "grace_seconds",
    "deadline_unix",
    "attempts",
    "awaiting_operator",
    "last_error",
)


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    lines = [
        f"{key}: {_fmt(key, before.get(key))} -> {_fmt(key, after.get(key))}"
        for key in _SHOWN_FIELDS
        if before.get(key) != after.get(key)
    ]
    seen = set(before.get("notes", []))
    lines += [f"note: {n}" for n in after.get("notes", []) if n not in seen]
    return lines


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_unix"):
        return datetime.fromtimestamp(float(value), tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return str(value)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


async def _describe_workflow(client: Any, wf: Any, machine_id: str) -> str:
    from workflows import search_attributes as sa

    status = wf.status.name.lower() if wf.status is not None else "?"
    lines = [f"workflow   {wf.id}  ({wf.workflow_type}, {status})"]
    view = await _view(client.get_workflow_handle(wf.id))
    if view is None:
        lines.append("  (no answer to the view query; is the shard's worker running?)")
        return "\n".join(lines)
    if "machines" in view:  # a provisioning batch
        mine = [m for m in view["machines"] if m.get("machine_id") == machine_id]
        lines.append(
            f"batch      {view.get('operation')} for {view.get('cluster_id')} "
            f"(priority {view.get('priority')}), phase {view.get('phase')}, "
            f"deadline {_fmt('deadline_unix', view.get('deadline_unix'))}"
        )
        for m in mine:
            lines.append(f"machine    {machine_id}: {m.get('state')} {m.get('last_error') or ''}")
        return "\n".join(lines)
    now = time.time()
    waiting = view.get("waiting")
    reason = view.get("reason") or (wf.typed_search_attributes.get(sa.REASON) or "")
    lines += [
        f"machine    {view['machine_id']} ({view['provider']}), shard {view['shard_id']}, "
        f"cluster {view['cluster_id'] or '-'}",
        f"operation  {view['operation']} #{view['operation_seq']}, phase {view['phase']}"
        + (" (awaiting an operator)" if view["awaiting_operator"] else "")
        + f", provider reports {view['machine_state'] or '?'}",
        f"started    {_fmt('started_unix', view['started_unix'])} "
        f"({_age(now - view['started_unix'])} ago), attempts {view['attempts']}",
        f"deadline   {_fmt('deadline_unix', view['deadline_unix'])}"
        + ("" if view["grace_seconds"] is None else f", grace {view['grace_seconds']} s"),
    ]
    if reason:
        lines.append(
            f"reason     {reason}"
            + (
                f" (the workload it serves has priority {view['priority']})"
                if view.get("priority")
                else ""
            )
        )
    if waiting:
        lines.append(
            f"waiting    priority {waiting['priority']} of {waiting['cluster_id']} "
            f"(need {waiting['need_key']})"
            + (
                f", blocked since {_fmt('blocked_since_unix', view['blocked_since_unix'])}"
                if view.get("blocked_since_unix")
                else ""
            )
        )
    if view["last_error"]:
        lines.append(f"last error {view['last_error']}")
    if view["provider_operation_ids"]:
        lines.append(f"provider   operations {', '.join(view['provider_operation_ids'])}")
    for signal_line in view["signals"][-5:]:
        lines.append(f"signal     {signal_line}")
    for note in view["notes"][-8:]:
        lines.append(f"note       {note}")
    return "\n".join(lines)


def _endpoints(database_url: str | None = None, address: str | None = None) -> Endpoints:
    """Flags, then BIGFLEET_* variables, then a running ``make dev`` stack (bigfleet.endpoints)."""
    return Endpoints.resolve(
        data_dir=_settings().data_dir,
        environment=os.environ,
        database_url=database_url,
        temporal_address=address,
    )


@contextlib.asynccontextmanager
async def _open_store(database_url: str | None = None) -> AsyncIterator[Store]:
    """The store of ``--database-url``, BIGFLEET_DATABASE_URL or the running dev stack."""
    from bigfleet.store import Database, Store

    url = _endpoints(database_url=database_url).need_database()
    _REACHING.append(f"PostgreSQL at {_without_password(url)}")
    db = Database.connect(url)
    try:
        yield Store(db.engine)
    finally:
        await db.close()


# What a command is trying to reach, for the one-line error when it cannot.
_REACHING: list[str] = []


def _without_password(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _hint(err: BaseException) -> str | None:
    """One line for an error from reaching PostgreSQL, Temporal or a gRPC peer, else None."""
    import grpc
    from sqlalchemy.exc import SQLAlchemyError

    what = _REACHING[-1] if _REACHING else "a BigFleet endpoint"
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, RuntimeError) and "client connect" in detail:
        detail = "connection refused" if "Connection refused" in str(err) else detail
    elif isinstance(err, SQLAlchemyError):
        detail = str(getattr(err, "orig", err)).strip().splitlines()[0]
    elif isinstance(err, grpc.aio.AioRpcError):
        detail = f"{err.code().name}: {err.details()}"
    elif not isinstance(err, OSError | TimeoutError):
        return None
    return f"cannot reach {what}: {detail[:200]} ({_where_to_look()})"


def _where_to_look() -> str:
    """The hint after "cannot reach": a deployment's settings, or the local dev stack."""
    configured = [
        v for v in ("BIGFLEET_DATABASE_URL", "BIGFLEET_TEMPORAL_ADDRESS") if os.environ.get(v)
    ]
    if configured:
        return f"check {' / '.join(configured)}, or --database-url / --address"
    return "is `make dev` running? --database-url / --address point elsewhere"


def _temporal_tls(settings: Settings) -> TLSConfig | None:
    """The process's certificate for Temporal, when BIGFLEET_TEMPORAL_TLS asks for it."""
    from bigfleet.bootstrap import temporal_tls_of

    try:
        return temporal_tls_of(settings)
    except ConfigError as err:
        _fail(str(err))


def _run_configured(coro: Awaitable[None]) -> None:
    """Run a process; a configuration error found while wiring it is a clear failure."""
    try:
        _run(coro)
    except ConfigError as err:
        _fail(str(err))


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as err:
        _fail(str(err))


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _run(coro: Awaitable[None]) -> None:
    _result(coro)  # type: ignore[arg-type]


def _result(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a command's body; a missing endpoint or an unreachable peer is one line."""
    from bigfleet.extras import MissingExtra

    try:
        return asyncio.run(coro)
    except (EndpointsMissing, MissingExtra) as err:
        _fail(str(err))
    except Exception as err:
        line = _hint(err)
        if line is None:
            raise
        _fail(line)


def main() -> None:
    """Console entry point.

    grpcio's and the Temporal core's native threads can abort the interpreter
    during finalisation after a clean run, so exit without finalising.
    """
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
