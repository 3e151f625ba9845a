"""Safe adoption from the command line: pause, resume, dry run, budgets, why, shadow report.

    bigfleet pause [--shard S | --all] --reason "..."    durable kill switch (PostgreSQL)
    bigfleet dry-run [--shard S | --all] --reason "..."  plan and record, start nothing
    bigfleet resume [--shard S | --all]                   both switches off
    bigfleet budgets                                      BIGFLEET_BUDGETS_FILE with current use
    bigfleet why machine M [--at T]                       from the decision log
    bigfleet why need CLUSTER/NEED [--at T]
    bigfleet shadow report --incumbent FILE [--since --until --cluster]
    bigfleet shadow convert --kubectl-watch FILE --cluster C

A shard applies a change at its next cycle; ``bigfleet shards`` shows the
switches in force and which shards run in shadow mode.
"""

from __future__ import annotations

import getpass
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.durations import parse_duration, utc
from bigfleet.cli.options import AddressOption, DatabaseOption, NamespaceOption

__all__ = [
    "budgets_list",
    "dry_run",
    "parse_instant",
    "pause",
    "resume",
    "shadow_app",
    "why_app",
]

ShardOption = Annotated[str, typer.Option("--shard", help="The shard to change.")]
AllOption = Annotated[bool, typer.Option("--all", help="Every shard (the row '*').")]
ReasonOption = Annotated[
    str, typer.Option("--reason", help="Why: shown to everyone who looks at the shard.")
]
AtOption = Annotated[
    str,
    typer.Option("--at", help="Answer as of this instant (2026-12-01T03:12:00Z, epoch s); now."),
]


def parse_instant(text: str, *, option: str = "--at") -> datetime:
    """An instant typed by an operator: ISO 8601 with a zone (``Z``), epoch seconds, or an age
    back from now (``2h``); naive ISO times are refused (is it UTC or local?)."""
    raw = text.strip()
    try:
        return datetime.fromtimestamp(float(raw), UTC)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.fromtimestamp(time.time() - parse_duration(raw), UTC)
        except typer.BadParameter:
            raise typer.BadParameter(
                f"{option}: {text!r} is not an instant (2026-12-01T03:12:00Z), epoch seconds "
                "or an age (2h)"
            ) from None
    if moment.tzinfo is None:
        raise typer.BadParameter(f"{option}: {text!r} has no time zone (add Z for UTC)")
    return moment


def _target(shard: str, everyone: bool) -> str:
    from bigfleet.store.controls import ALL_SHARDS

    if bool(shard) == everyone:
        runtime.fail("name one shard with --shard S, or every shard with --all")
    return ALL_SHARDS if everyone else shard


def _set(
    shard_id: str, *, paused: bool | None, dry: bool | None, reason: str, db: str | None
) -> None:
    from bigfleet.store.controls import ControlStore

    async def main() -> None:
        async with connections.open_store(db) as store:
            try:
                control = await ControlStore(store.engine).set(
                    shard_id,
                    paused=paused,
                    dry_run=dry,
                    reason=reason,
                    changed_by=getpass.getuser(),
                )
            except ValueError as err:
                runtime.fail(str(err))
        who = "every shard" if shard_id == "*" else f"shard {shard_id}"
        state = (
            "paused"
            if control.paused
            else "in dry run"
            if control.dry_run
            else "active (no pause, no dry run)"
        )
        typer.echo(f"{who}: {state}" + (f" — {control.reason}" if control.reason else ""))
        typer.echo("takes effect at each shard's next cycle; see `bigfleet shards`")

    runtime.run(main())


def pause(
    shard: ShardOption = "",
    everyone: AllOption = False,
    reason: ReasonOption = "",
    database_url: DatabaseOption = None,
) -> None:
    """Stop a shard (or all) from starting anything new. Durable: survives restarts.

    Cycles still run and record what they would do; work already in flight
    finishes (ADR 0142). `bigfleet resume` lifts it.
    """
    _set(_target(shard, everyone), paused=True, dry=None, reason=reason, db=database_url)


def dry_run(
    shard: ShardOption = "",
    everyone: AllOption = False,
    reason: ReasonOption = "",
    database_url: DatabaseOption = None,
) -> None:
    """Put a shard (or all) in dry run: plan and record every cycle, start nothing."""
    _set(_target(shard, everyone), paused=None, dry=True, reason=reason, db=database_url)


def resume(
    shard: ShardOption = "",
    everyone: AllOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Lift pause and dry run. A shard paused by --all stays paused until --all is resumed."""
    _set(_target(shard, everyone), paused=False, dry=False, reason="", db=database_url)


def budgets_list(
    database_url: DatabaseOption = None,
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Disruption budgets (BIGFLEET_BUDGETS_FILE) with their use now and the drains held.

    Use is counted over the providers' machines and the running drain
    workflows; "held 1h" counts drains the shards held back under the budget
    in the last hour (decision log); "shares" is how the coordinator last
    dealt a count budget to the shards (a count holds fleet-wide).
    """
    settings = runtime.settings()
    if not settings.budgets:
        typer.echo("no budgets (set BIGFLEET_BUDGETS_FILE; see docs/budgets.md)")
        return

    async def main() -> None:
        from bigfleet.store.decisions import DecisionStore
        from shard_engine.budgets import DrainReason, Subject, use_of
        from workflows import search_attributes as sa
        from workflows.coordinator_contracts import COORDINATOR_ID

        found = connections.endpoints(database_url=database_url, address=address)
        subjects: dict[str, Subject] = {}
        for m in await connections.provider_machines(found, settings):
            subjects[m.id] = Subject(
                instance_type=m.instance_type,
                capacity_type=_capacity_label(m.capacity_type),
                resources=frozenset(
                    k for k, v in m.allocatable.resources.items() if v not in ("", "0")
                ),
                cluster_id=m.cluster,
            )
        client = await connections.temporal_client(address, namespace)
        draining: list[tuple[Subject, DrainReason]] = []
        async for wf in client.list_workflows(
            "WorkflowType = 'DrainWorkflow' AND ExecutionStatus = 'Running'"
        ):
            machine_id = wf.typed_search_attributes.get(sa.MACHINE_ID)
            reason = wf.typed_search_attributes.get(sa.REASON) or "reclaim"
            subject = subjects.get(machine_id or "")
            if subject is not None:
                kind = DrainReason.PREEMPT if reason == "preempt" else DrainReason.RECLAIM
                draining.append((subject, kind))
        granted: dict[str, dict[str, int]] = {}
        try:
            status = await client.get_workflow_handle(COORDINATOR_ID).query("status")
            granted = dict(status.get("budget_shares", {}))
        except Exception:  # no coordinator yet: the shards hold their safe default
            granted = {}
        now = time.time()
        async with connections.open_store(database_url) as store:
            recent = await DecisionStore(store.engine).window(
                since=datetime.fromtimestamp(now - 3600, UTC),
                until=datetime.fromtimestamp(now, UTC),
            )
        held: dict[str, int] = {}
        for d in recent:
            if d.kind == "held" and d.inputs.get("budget"):
                held[str(d.inputs["budget"])] = held.get(str(d.inputs["budget"]), 0) + 1
        typer.echo(
            f"{'BUDGET':<20} {'CAP':>6} {'USE':>9} {'HELD 1H':>7}  {'REASONS':<15} "
            f"{'WINDOW':<28} SCOPE"
        )
        for use in use_of(
            settings.budgets, now=now, machines=list(subjects.values()), draining=draining
        ):
            b = use.budget
            if b.window is None:
                window = "always"
            elif use.in_force:
                window = f"open ({b.window.schedule.text})"
            else:
                opens = b.window.opens_next(now)
                window = f"opens {utc(opens)}" if opens is not None else b.window.schedule.text
            typer.echo(
                f"{b.name:<20} {b.describe_cap():>6} {use.draining:>4}/{use.cap:<4} "
                f"{held.get(b.name, 0):>7}  {','.join(sorted(r.value for r in b.reasons)):<15} "
                f"{window:<28} {b.scope.describe()} ({use.machines_in_scope} machines)"
            )
            if b.count is not None:
                dealt = {s: g[b.name] for s, g in sorted(granted.items()) if b.name in g}
                typer.echo(
                    "    shares: "
                    + (
                        " ".join(f"{s}={n}" for s, n in dealt.items())
                        if dealt
                        else "none dealt yet (each shard holds 0 until the coordinator deals)"
                    )
                )

    runtime.run(main())


def _capacity_label(value: int) -> str:
    from shard_engine.catalog import capacity_type_label
    from shard_engine.model import CapacityType

    try:
        return capacity_type_label(CapacityType(value))
    except ValueError:
        return "unspecified"


why_app = typer.Typer(
    help="Why a machine or a need fared as it did (decision log).", no_args_is_help=True
)


def _print(rows: list[object]) -> None:
    from bigfleet.decisions import Decision

    if not rows:
        typer.echo("no decision recorded (the log keeps 7 days and 1,000,000 rows per shard)")
        return
    for row in rows:
        assert isinstance(row, Decision)
        inputs = ", ".join(
            f"{k}={v}" for k, v in sorted(row.inputs.items()) if v not in ("", 0, None)
        )
        typer.echo(f"{utc(row.decided_at)}  {row.shard_id} cycle {row.cycle}  {row.describe()}")
        if inputs:
            typer.echo(f"    inputs: {inputs}")


@why_app.command("machine")
def why_machine(
    machine_id: Annotated[str, typer.Argument(help="The machine id (its node name).")],
    at: AtOption = "",
    limit: Annotated[int, typer.Option(help="How many decisions, newest first.")] = 10,
    database_url: DatabaseOption = None,
) -> None:
    """What the shards decided about a machine up to --at, newest first, with the inputs."""
    when = parse_instant(at) if at else None

    async def main() -> None:
        from bigfleet.store.decisions import DecisionStore

        async with connections.open_store(database_url) as store:
            rows = await DecisionStore(store.engine).about_machine(machine_id, at=when, limit=limit)
        _print(list(rows))

    runtime.run(main())


@why_app.command("need")
def why_need(
    need: Annotated[str, typer.Argument(help="CLUSTER/NEED_KEY (a key prefix is enough).")],
    at: AtOption = "",
    limit: Annotated[int, typer.Option(help="How many decisions, newest first.")] = 10,
    database_url: DatabaseOption = None,
) -> None:
    """What the shards decided about a need up to --at: its actions, holds and unmet verdicts."""
    cluster, sep, key = need.partition("/")
    if not sep or not cluster or not key:
        runtime.fail(f"need: {need!r} is not CLUSTER/NEED_KEY (see `bigfleet needs`)")
    when = parse_instant(at) if at else None

    async def main() -> None:
        from bigfleet.store.decisions import DecisionStore

        async with connections.open_store(database_url) as store:
            rows = await DecisionStore(store.engine).about_need(cluster, key, at=when, limit=limit)
        _print(list(rows))

    runtime.run(main())


shadow_app = typer.Typer(help="Shadow mode: compare with the incumbent.", no_args_is_help=True)


@shadow_app.command("report")
def shadow_report(
    incumbent: Annotated[
        Path, typer.Option("--incumbent", help="Node joins/leaves: JSON lines or CSV (docs).")
    ],
    since: Annotated[str, typer.Option(help="Window start (instant or age back: 24h).")] = "24h",
    until: Annotated[str, typer.Option(help="Window end (default now).")] = "",
    cluster: Annotated[str, typer.Option(help="One cluster only.")] = "",
    database_url: DatabaseOption = None,
) -> None:
    """What BigFleet would have run against what the incumbent ran, per cluster.

    Machine-hours and cost by shape and capacity type, and for each unmet
    interval which side covered it first (docs/shadow-mode.md).
    """
    from bigfleet.shadow import IncumbentError, compare, parse_incumbent

    start = parse_instant(since, option="--since")
    end = parse_instant(until, option="--until") if until else datetime.now(UTC)
    try:
        events = parse_incumbent(incumbent.read_text())
    except OSError as err:
        runtime.fail(f"--incumbent: {incumbent} cannot be read ({err.strerror})")
    except IncumbentError as err:
        runtime.fail(f"--incumbent {incumbent}: {err}")

    async def main() -> None:
        from bigfleet.store.decisions import DecisionStore

        async with connections.open_store(database_url) as store:
            # Reach back a week: machines placed before the window still count in it.
            rows = await DecisionStore(store.engine).window(
                since=datetime.fromtimestamp(start.timestamp() - 7 * 86400, UTC), until=end
            )
        try:
            report = compare(
                rows, events, since=start.timestamp(), until=end.timestamp(), cluster=cluster
            )
        except ValueError as err:
            runtime.fail(str(err))
        typer.echo(report.render())

    runtime.run(main())


@shadow_app.command("convert")
def shadow_convert(
    kubectl_watch: Annotated[
        Path,
        typer.Option(
            "--kubectl-watch",
            help="Output of `kubectl get nodes --watch --output-watch-events -o json`.",
        ),
    ],
    cluster: Annotated[str, typer.Option(help="The cluster id the export is from.")],
) -> None:
    """Convert a kubectl node watch into the incumbent format (JSON lines on stdout)."""
    from bigfleet.shadow import IncumbentError, from_kubectl_watch, to_json_lines

    try:
        events = from_kubectl_watch(kubectl_watch.read_text(), cluster=cluster)
    except OSError as err:
        runtime.fail(f"--kubectl-watch: {kubectl_watch} cannot be read ({err.strerror})")
    except IncumbentError as err:
        runtime.fail(f"--kubectl-watch {kubectl_watch}: {err}")
    typer.echo(to_json_lines(events), nl=False)
