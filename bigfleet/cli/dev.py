"""``bigfleet dev``: the whole stack in one process on embedded defaults, with a demo fleet."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Annotated

import typer

from bigfleet.aio import wait_set
from bigfleet.cli import runtime
from bigfleet.cli.options import VerboseOption
from bigfleet.config import Settings

__all__ = ["dev"]


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
    ec2: Annotated[
        bool,
        typer.Option(
            "--ec2",
            help="The cloud is the EC2 provider against a local EC2 API server (moto) "
            "instead of the simulated cloud.",
        ),
    ] = False,
    shadow: Annotated[
        bool,
        typer.Option(
            "--shadow",
            help="One more shard in shadow mode, serving a demo cluster of its own beside "
            "the active ones: it decides and records, never acts (bigfleet why, shadow report).",
        ),
    ] = False,
    verbose: VerboseOption = False,
) -> None:
    """Run the full stack on embedded defaults with a demo fleet (Ctrl-C stops it)."""
    from bigfleet.devstack import DEMO_SHADOW_CLUSTERS, DevStack, DevStackOptions

    runtime.configure_logging(verbose)
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
        ec2=ec2,
        shadow_clusters=DEMO_SHADOW_CLUSTERS if shadow else (),
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
                await wait_set(stop, summary_every)
        finally:
            # A deliberate stop: every part saying it stopped is not news (-v keeps it).
            if not verbose:
                logging.disable(logging.CRITICAL)
            await stack.stop()
            print("stopped", flush=True)

    runtime.run(runtime.until_signalled(main))
