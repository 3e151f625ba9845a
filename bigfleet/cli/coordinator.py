"""``bigfleet coordinator run | status`` and ``bigfleet decommission`` (a coordinator workflow)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.options import AddressOption, DatabaseOption, VerboseOption

__all__ = ["coordinator_app", "decommission"]


coordinator_app = typer.Typer(help="The global coordinator.", no_args_is_help=True)


@coordinator_app.command("run")
def coordinator_run(
    interval: Annotated[float, typer.Option(help="Seconds between planning rounds.")] = 30.0,
    max_share: Annotated[
        float, typer.Option(help="Largest share of a shard's machines one instruction may move.")
    ] = 0.05,
    verbose: VerboseOption = False,
) -> None:
    """Run the coordinator: a new term, its worker, and the singleton workflow."""
    from bigfleet import bootstrap

    runtime.configure_logging(verbose)
    settings = runtime.settings()
    if not settings.database_url or not settings.temporal_address:
        runtime.fail("BIGFLEET_DATABASE_URL and BIGFLEET_TEMPORAL_ADDRESS must be set")

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

    runtime.run_configured(runtime.until_signalled(main))


@coordinator_app.command("status")
def coordinator_status(
    limit: Annotated[int, typer.Option(help="Instructions to show.")] = 20,
    database_url: DatabaseOption = None,
) -> None:
    """The coordinator's term, pending instructions, and recent outcomes."""

    async def main() -> None:
        async with connections.open_store(database_url) as store:
            typer.echo(f"term {await store.term()}")
            rows = await store.instructions(limit=limit)
            if not rows:
                typer.echo("no instructions yet")
            for r in rows:
                typer.echo(
                    f"{r.term}/{r.seq:<5} {r.kind:<12} {r.donor_shard or '-':>10} -> "
                    f"{r.receiver_shard or '-':<10} {r.status:<8} {r.outcome or ''}"
                )

    runtime.run(main())


def decommission(
    provider: Annotated[str, typer.Option(help="The provider whose machines retire.")],
    label: Annotated[
        str, typer.Option(help="The domain's label, e.g. topology.kubernetes.io/rack.")
    ],
    value: Annotated[str, typer.Option(help="The domain's label value.")],
    count: Annotated[int, typer.Option(min=1, help="How many machines of the domain retire.")],
    reason: Annotated[str, typer.Option(help="Kept with each retired machine.")] = "decommissioned",
    address: AddressOption = None,
) -> None:
    """Retire machines of a domain, the same share from every shard that holds some.

    Runs as a workflow on the coordinator's task queue (the coordinator must
    be running); unbound machines are quarantined at once, configured ones are
    drained first. Retired machines stay out across restarts.
    """
    from workflows import coordinator as co

    settings = runtime.settings()

    async def main() -> None:
        client = await connections.temporal_client(address, settings.temporal_namespace)
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

    runtime.run(main())
