"""The ``bigfleet`` command line: run the stack or one of its parts, inspect, escalate.

This module is the index: it builds the root ``app`` and lists every command
and group in the order ``bigfleet --help`` shows them. Each group lives in a
module of its own (see bigfleet/README.md, "Adding a command"):

    runtime.py      settings, asyncio, signals, failures as one line
    connections.py  --database-url / --address / the dev stack -> bootstrap's store and client
    options.py      options several groups share; durations.py: 10s, 1h30m, ages
    mounts.py       provider, simulate, nanook (groups other packages define)
    dev.py  shard.py  coordinator.py  membership.py  deployment.py
    drains.py  needs.py  machines.py
    adoption.py     pause, dry-run, resume, budgets, why, shadow (issue 19)
"""

from __future__ import annotations

import os
import sys

# gRPC's core reads its log level once, when it loads: below ERROR it prints
# every failed TLS handshake itself, where a command's one line already says it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import typer

from bigfleet.cli import (
    adoption,
    coordinator,
    deployment,
    dev,
    drains,
    machines,
    membership,
    mounts,
    needs,
    shard,
)

__all__ = ["app", "main"]

app = typer.Typer(help="BigFleet: a fleet-level infrastructure autoscaler.", no_args_is_help=True)

mounts.mount_provider(app)
mounts.mount_simulate(app)
mounts.mount_nanook(app)
app.command()(dev.dev)
app.command()(shard.shard)
app.add_typer(coordinator.coordinator_app, name="coordinator")
app.add_typer(membership.shards_app, name="shards")
app.command("decommission")(coordinator.decommission)
app.command("clusters")(membership.clusters_list)
app.command()(deployment.migrate)
app.command("certs")(deployment.certs)
app.command("config")(deployment.show_config)
app.command("health")(deployment.health)
app.command("drains")(drains.drains_list)
app.command("needs")(needs.needs_list)
app.command("machines")(machines.machines_list)
app.add_typer(machines.machine_app, name="machine")
app.command("pause")(adoption.pause)
app.command("dry-run")(adoption.dry_run)
app.command("resume")(adoption.resume)
app.command("budgets")(adoption.budgets_list)
app.add_typer(adoption.why_app, name="why")
app.add_typer(adoption.shadow_app, name="shadow")


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
