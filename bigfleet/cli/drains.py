"""``bigfleet drains``: running drains (each its own workflow), and the stuck ones.

The query is ``workflows.search_attributes.stuck_drains_query``, the one the
README and the Temporal UI docs show; ``--query`` prints it instead of running it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.durations import age, parse_duration
from bigfleet.cli.options import AddressOption, NamespaceOption

__all__ = ["drains_list", "stuck_drains_query"]


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
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Running drains (each is its own workflow), oldest first."""
    query = stuck_drains_query(parse_duration(older_than) if stuck else None)
    if show_query:
        typer.echo(query)
        return

    async def main() -> None:
        from workflows import search_attributes as sa

        client = await connections.temporal_client(address, namespace)
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
                f"{age(now - wf.start_time.timestamp()):>7}  {wf.id}"
            )
        typer.echo(
            "REASON: why the drain runs; PRIORITY: the drained workload's; "
            "AGE: since it started; GRACE: what the operator was given"
        )

    runtime.run(main())
