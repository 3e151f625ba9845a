"""``bigfleet shard``: one shard process, wired by ``bigfleet.bootstrap`` from BIGFLEET_*."""

from __future__ import annotations

import asyncio

from bigfleet.cli import runtime
from bigfleet.cli.options import VerboseOption

__all__ = ["shard"]


def shard(verbose: VerboseOption = False) -> None:
    """Run one shard process configured from BIGFLEET_* environment variables."""
    from bigfleet import bootstrap

    runtime.configure_logging(verbose)
    settings = runtime.settings()
    if not settings.database_url or not settings.temporal_address:
        runtime.fail(
            "BIGFLEET_DATABASE_URL and BIGFLEET_TEMPORAL_ADDRESS must be set for `bigfleet shard`"
        )
    if not settings.providers:
        runtime.fail("BIGFLEET_PROVIDERS must name at least one provider (NAME=HOST:PORT)")

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

    runtime.run_configured(runtime.until_signalled(main))
