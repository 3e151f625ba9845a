"""``bigfleet provider ...``: run a simulated capacity provider.

    bigfleet provider serve --kind sim-cloud --addr 127.0.0.1:50061 \\
        --state .bigfleet/simcloud.json --time-factor 0.05

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


class Kind(enum.StrEnum):
    """The provider kinds ``serve`` can run."""

    sim_cloud = "sim-cloud"
    bare_metal = "bare-metal"


@app.callback()
def main() -> None:
    """Capacity providers speaking bigfleet.v1alpha1.CapacityProvider."""


@app.command()
def serve(
    kind: Annotated[Kind, typer.Option(help="Which simulated provider to run.")],
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
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            envvar="BIGFLEET_METRICS_LISTEN",
            help="HOST:PORT serving Prometheus /metrics (default: none).",
        ),
    ] = None,
) -> None:
    """Serve one simulated provider until SIGINT or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
    )
    security = _security_factory[0]()
    served = None
    if metrics_listen:
        try:
            served = serve_metrics(metrics_listen)
        except (ValueError, OSError) as err:
            raise typer.BadParameter(str(err), param_hint="--metrics-listen") from None
    try:
        asyncio.run(_serve(config, addr, security))
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
