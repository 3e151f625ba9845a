"""``bigfleet provider ...``: run a capacity provider (a simulation, or EC2).

    bigfleet provider serve --kind sim-cloud --addr 127.0.0.1:50061 \\
        --state .bigfleet/simcloud.json --time-factor 0.05
    bigfleet provider serve --kind ec2 --ec2-config ec2.yaml --state .bigfleet/ec2.json

The process serves until SIGINT or SIGTERM, then stops gracefully (state is
saved either way: every acknowledged change is already journaled). Mutual
TLS comes from the application's configuration (``BIGFLEET_TLS_*``): the
``bigfleet`` command installs the factory that reads it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from bigfleet.metrics import serve as serve_metrics
from providers.config import ProviderConfig
from providers.ec2.settings import SettingsError, load_settings
from providers.server import ServerSecurity, start_provider_server

log = logging.getLogger("providers.cli")

app = typer.Typer(
    help="Capacity providers speaking bigfleet.v1alpha1.CapacityProvider.",
    no_args_is_help=True,
    add_completion=False,
)


def _plaintext() -> ServerSecurity | None:
    return None


_security_factory: list[Callable[[], ServerSecurity | None]] = [_plaintext]


def install_security(factory: Callable[[], ServerSecurity | None]) -> None:
    """Set what ``serve`` calls for its TLS set-up (None from the factory: plaintext)."""
    _security_factory[0] = factory


_EC2 = "EC2 (--kind ec2)"


class Kind(enum.StrEnum):
    """The provider kinds ``serve`` can run."""

    sim_cloud = "sim-cloud"
    bare_metal = "bare-metal"
    ec2 = "ec2"


@app.callback()
def main() -> None:
    """Capacity providers speaking bigfleet.v1alpha1.CapacityProvider."""


@app.command()
def serve(
    kind: Annotated[Kind, typer.Option(help="Which provider to run: a simulation, or real EC2.")],
    addr: Annotated[str, typer.Option(help="HOST:PORT to listen on (port 0: any).")] = (
        "127.0.0.1:50061"
    ),
    state: Annotated[
        Path | None,
        typer.Option(help="State file; a restart with the same file keeps everything."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random choice.")] = 0,
    time_factor: Annotated[
        float, typer.Option(help="Multiplies every simulated latency (0.01: 100x faster).")
    ] = 1.0,
    catalog: Annotated[
        Path | None, typer.Option(help="Catalog JSON instead of the shipped one.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Provider name and machine-id prefix.")] = None,
    quota_scale: Annotated[
        float, typer.Option(help="Scales the catalog's quotas and rack sizes.")
    ] = 1.0,
    interruption_scale: Annotated[
        float, typer.Option(help="Scales spot interruptions (0 disables them).")
    ] = 1.0,
    failed_cleanup: Annotated[
        float | None,
        typer.Option(help="Simulated seconds after which FAILED machines are released."),
    ] = None,
    fsync: Annotated[bool, typer.Option(help="fsync the state journal on every write.")] = False,
    log_level: Annotated[str, typer.Option(help="Python logging level.")] = "INFO",
    ec2_config: Annotated[
        Path | None,
        typer.Option(
            envvar="BIGFLEET_EC2_CONFIG",
            rich_help_panel=_EC2,
            help="YAML/JSON file naming accounts (alias, profile), regions (image_id, zones, "
            "subnets, security_group_ids, instance_profile, interruption_queue_url, "
            "quota_vcpus), instance_types and capacity_types; the options below override "
            "its top-level settings. See providers/ec2/README.md.",
        ),
    ] = None,
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=_EC2, help="An EC2-compatible endpoint instead of AWS (local tests)."
        ),
    ] = None,
    refresh_seconds: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="How often quotas, offerings and spot prices are read again (default 300).",
        ),
    ] = None,
    poll_seconds: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="How often launches, terminations and bootstrap commands in flight are "
            "described (default 5).",
        ),
    ] = None,
    watch_seconds: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="How often every instance holding a machine is described (default 30).",
        ),
    ] = None,
    queue_wait_seconds: Annotated[
        int | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="Long-poll wait of the interruption queue, 0-20 (default 20).",
        ),
    ] = None,
    launches_per_second: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="RunInstances token bucket rate per account and region (default 2).",
        ),
    ] = None,
    launch_burst: Annotated[
        int | None,
        typer.Option(rich_help_panel=_EC2, help="RunInstances token bucket burst (default 20)."),
    ] = None,
    capacity_cooldown_seconds: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="After InsufficientInstanceCapacity, Creates in that zone, type and capacity "
            "type fail at once for this long (default 300).",
        ),
    ] = None,
    spot_interruption_per_hour: Annotated[
        float | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="Hourly interruption probability of spot machines without a notice "
            "(default 0.05).",
        ),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="On-demand price file instead of the shipped providers/ec2/prices.json.",
        ),
    ] = None,
    root_volume_gib: Annotated[
        int | None,
        typer.Option(
            rich_help_panel=_EC2, help="Root volume size of every instance (default 100)."
        ),
    ] = None,
    bootstrap_command: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=_EC2,
            help="Runs on the instance (through SSM) with the bootstrap blob's path as its "
            "argument (default /opt/bigfleet/bootstrap).",
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            envvar="BIGFLEET_METRICS_LISTEN",
            help="HOST:PORT serving Prometheus /metrics (default: none).",
        ),
    ] = None,
) -> None:
    """Serve one provider until SIGINT or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    ec2 = None
    if kind is Kind.ec2:
        if ec2_config is None:
            raise typer.BadParameter(
                "--kind ec2 needs its settings file", param_hint="--ec2-config"
            )
        try:
            ec2 = load_settings(
                ec2_config,
                endpoint_url=endpoint_url,
                refresh_s=refresh_seconds,
                poll_s=poll_seconds,
                watch_s=watch_seconds,
                queue_wait_s=queue_wait_seconds,
                launches_per_second=launches_per_second,
                launch_burst=launch_burst,
                capacity_cooldown_s=capacity_cooldown_seconds,
                spot_interruption_per_hour=spot_interruption_per_hour,
                prices_path=str(prices) if prices else None,
                root_volume_gib=root_volume_gib,
                bootstrap_command=bootstrap_command,
            )
        except SettingsError as err:
            raise typer.BadParameter(str(err), param_hint="--ec2-config") from None
    config = ProviderConfig(
        kind=kind.value,
        name=name or "",
        seed=seed,
        time_factor=time_factor,
        state_path=state,
        catalog_path=catalog,
        quota_scale=quota_scale,
        interruption_scale=interruption_scale,
        failed_cleanup_s=failed_cleanup,
        fsync=fsync,
        ec2=ec2,
    )
    security = _security_factory[0]()
    served = None
    if metrics_listen:
        try:
            served = serve_metrics(metrics_listen)
        except (ValueError, OSError) as err:
            raise typer.BadParameter(str(err), param_hint="--metrics-listen") from None
    # boto3 loads only when a provider is served, not with every bigfleet command.
    from providers.ec2.cloud import CloudError

    try:
        asyncio.run(_serve(config, addr, security))
    except SettingsError as err:
        # Found only once EC2 answers (an unknown instance type, a missing price).
        raise typer.BadParameter(str(err), param_hint="--ec2-config") from None
    except CloudError as err:
        typer.echo(f"EC2 refused to start the provider: {err}", err=True)
        raise typer.Exit(2) from None
    finally:
        if served is not None:
            served.stop()


async def _serve(config: ProviderConfig, addr: str, security: ServerSecurity | None) -> None:
    running = await start_provider_server(config, addr, security=security)
    log.info(
        "provider %s (%s) listening on %s with %d machines",
        running.provider.name,
        config.kind,
        running.address,
        len(running.provider.machine_ids()),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping provider %s", running.provider.name)
    await running.stop(grace=2.0)


__all__ = ["app", "install_security", "serve"]
