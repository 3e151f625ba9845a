"""``bigfleet machines``, and ``bigfleet machine show | escalate | force | retry | abandon |
resolve``: one machine's workflow, shown or pushed with a signal.

Drains, deletes and failed machines each have their own workflow (found by
BigFleetMachineId); these commands find it, read its ``view`` query and send
the operator signals (escalate, force, retry, abandon, resolve).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Annotated, Any, assert_never

import typer

from bigfleet.cli import connections, runtime
from bigfleet.cli.durations import age, parse_duration, utc
from bigfleet.cli.options import AddressOption, DatabaseOption, NamespaceOption

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from workflows.contracts import EscalateSignal, OperatorSignal, ResolveSignal

__all__ = ["machine_app", "machines_list"]

_PER_MACHINE = ("DrainWorkflow", "DeleteWorkflow", "RecoverWorkflow", "VerifyWorkflow")


def machines_list(
    cluster: Annotated[str, typer.Option("--cluster", help="Only machines bound to it.")] = "",
    state: Annotated[
        str, typer.Option("--state", help="Only machines in this provider state (CONFIGURED...).")
    ] = "",
    database_url: DatabaseOption = None,
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Machines the shards own: provider state, binding, owner shard, the workflow running.

    Ownership and binding come from PostgreSQL, states from the providers
    (those of the running dev stack or BIGFLEET_PROVIDERS), running
    workflows from Temporal.
    """
    from bigfleet.v1alpha1 import provider_pb2
    from workflows import search_attributes as sa

    settings = runtime.settings()
    wanted = state.strip().upper().removeprefix("MACHINE_STATE_")
    names = set(provider_pb2.MachineState.keys())
    if wanted and f"MACHINE_STATE_{wanted}" not in names:
        runtime.fail(f"--state: {state!r} is not a machine state (CONFIGURED, IDLE, DRAINING, ...)")

    async def main() -> None:
        found = connections.endpoints(database_url=database_url, address=address)
        async with connections.open_store(database_url) as store:
            rows = await store.machines(cluster_id=cluster or None)
        states: dict[str, str] = {}
        for m in await connections.provider_machines(found, settings):
            states[m.id] = provider_pb2.MachineState.Name(m.state).removeprefix("MACHINE_STATE_")
        client = await connections.temporal_client(address, namespace)
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

    runtime.run(main())


machine_app = typer.Typer(
    help="One machine's workflow: show it, or push it with a signal.", no_args_is_help=True
)


@machine_app.command("show")
def machine_show(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """The machine's running workflows and their current view (or its last finished one)."""

    async def main() -> None:
        client = await connections.temporal_client(address, namespace)
        running, recent = await _machine_workflows(client, machine_id)
        if not running and not recent:
            runtime.fail(f"no workflow has touched machine {machine_id}")
        for wf in running or recent[:1]:
            typer.echo(await _describe_workflow(client, wf, machine_id))

    runtime.run(main())


@machine_app.command("escalate")
def machine_escalate(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    grace: Annotated[str, typer.Option("--grace", help="The new, shorter grace: 10s, 2m ...")],
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Shorten a running drain's grace period (the operator and provider are told again)."""
    from workflows.contracts import EscalateSignal, OperatorSignal

    seconds = int(parse_duration(grace))
    _signal_machine(
        machine_id, OperatorSignal.ESCALATE, address, namespace, escalate=EscalateSignal(seconds)
    )


@machine_app.command("force")
def machine_force(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Forced termination now (a drain with zero grace)."""
    from workflows.contracts import OperatorSignal

    _signal_machine(machine_id, OperatorSignal.FORCE, address, namespace)


@machine_app.command("retry")
def machine_retry(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Try the corrective action again (a parked drain, delete or recovery)."""
    from workflows.contracts import OperatorSignal

    _signal_machine(machine_id, OperatorSignal.RETRY, address, namespace)


@machine_app.command("abandon")
def machine_abandon(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """Give up: the machine is marked FAILED and kept out of use for investigation."""
    from workflows.contracts import OperatorSignal

    _signal_machine(machine_id, OperatorSignal.ABANDON, address, namespace)


@machine_app.command("resolve")
def machine_resolve(
    machine_id: Annotated[str, typer.Argument(help="The machine id.")],
    note: Annotated[str, typer.Option("--note", help="What was done out of band.")] = "",
    address: AddressOption = None,
    namespace: NamespaceOption = "default",
) -> None:
    """It was fixed out of band: the workflow re-reads the provider and continues."""
    from workflows.contracts import OperatorSignal, ResolveSignal

    _signal_machine(
        machine_id, OperatorSignal.RESOLVE, address, namespace, resolve=ResolveSignal(note)
    )


def _signal_machine(
    machine_id: str,
    signal: OperatorSignal,
    address: str | None,
    namespace: str,
    *,
    escalate: EscalateSignal | None = None,
    resolve: ResolveSignal | None = None,
) -> None:
    """Send ``signal`` to the machine's running per-machine workflow and print what changed."""

    async def main() -> None:
        client = await connections.temporal_client(address, namespace)
        running, _ = await _machine_workflows(client, machine_id)
        mine = [wf for wf in running if wf.workflow_type in _PER_MACHINE]
        if not mine:
            where = ", ".join(f"{wf.id} ({wf.workflow_type})" for wf in running)
            runtime.fail(
                f"machine {machine_id} has no running drain, delete or recovery workflow"
                + (f"; it is in {where}" if where else "")
            )
        wf = mine[0]
        handle = client.get_workflow_handle(wf.id)
        before = await _view(handle)
        await _send(handle, signal, escalate=escalate, resolve=resolve)
        typer.echo(f"sent {signal.value} to {wf.id} ({wf.workflow_type})")
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

    runtime.run(main())


async def _send(
    handle: WorkflowHandle[Any, Any],
    signal: OperatorSignal,
    *,
    escalate: EscalateSignal | None,
    resolve: ResolveSignal | None,
) -> None:
    """``signal`` by method reference (drain, delete, recovery and verify share them)."""
    from workflows.contracts import OperatorSignal
    from workflows.machine import MachineWorkflow

    match signal:
        case OperatorSignal.ESCALATE:
            assert escalate is not None
            await handle.signal(MachineWorkflow.escalate, escalate)
        case OperatorSignal.FORCE:
            await handle.signal(MachineWorkflow.force)
        case OperatorSignal.RETRY:
            await handle.signal(MachineWorkflow.retry)
        case OperatorSignal.ABANDON:
            await handle.signal(MachineWorkflow.abandon)
        case OperatorSignal.RESOLVE:
            assert resolve is not None
            await handle.signal(MachineWorkflow.resolve, resolve)
        case _:
            assert_never(signal)


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
    """The ``view`` query's answer as plain data (a provisioning batch's view has other fields)."""
    from temporalio.service import RPCError

    from workflows.contracts import WorkflowQuery

    try:
        view: dict[str, Any] = await handle.query(WorkflowQuery.VIEW.value)
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
        return utc(float(value))
    return str(value)


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
        f"({age(now - view['started_unix'])} ago), attempts {view['attempts']}",
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
