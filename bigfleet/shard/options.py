"""Tunables of one shard process, and the name of its task queue."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from bigfleet.shard.interpreter import InterpreterSettings
from bigfleet.shard.sessions import SessionLimits
from bigfleet.shard.virtual import ShadowDelays
from shard_engine.budgets import Budget
from shard_engine.engine import EngineConfig
from workflows.contracts import Deadlines, PollPolicy, default_deadline_overrides

__all__ = [
    "ShardOptions",
    "advertised",
    "task_queue",
]


def task_queue(shard_id: str) -> str:
    """The Temporal task queue served only by the holder of ``shard_id``'s lease."""
    return f"shard-{shard_id}"


@dataclass(frozen=True)
class ShardOptions:
    """Tunables of one shard process."""

    shard_id: str = "shard-0"
    listen: str = "127.0.0.1:0"
    # Where operators are told to dial this shard (a moved cluster's redirect target);
    # empty: the listen address, with a wildcard host replaced by this host's name.
    advertise: str = ""
    holder: str = "local"
    lease_ttl_s: float = 30.0
    # Stop acting this long before the lease can expire (None: a quarter of the ttl; ADR 0100).
    lease_margin_s: float | None = None
    cycle_interval_s: float = 5.0
    observe_interval_s: float = 2.0
    deadlines: Deadlines = field(default_factory=Deadlines)
    poll: PollPolicy = field(default_factory=PollPolicy)
    # Deadline overrides per provider and capacity type (see workflows.contracts.DeadlinePolicy).
    deadline_overrides: dict[str, dict[str, float]] = field(
        default_factory=default_deadline_overrides
    )
    engine: EngineConfig = field(default_factory=EngineConfig)
    # How often the reconcile loop compares providers, PostgreSQL and the engine (ADR 0103).
    reconcile_interval_s: float = 60.0
    # How often the shard reports to the coordinator (summary + shortfalls).
    report_interval_s: float = 30.0
    # A cycle that finds a shortfall not yet reported, or more idle machines than last
    # reported, reports at once, no sooner than this after the last report (ADR 0184).
    # At or above report_interval_s, reports keep to the interval.
    early_report_gap_s: float = 10.0
    # No coordinator instruction may move more than this share of our machines.
    max_instruction_share: float = 0.05
    # When the Session port sheds load (RESOURCE_EXHAUSTED with a retry hint).
    session_limits: SessionLimits = field(default_factory=SessionLimits)
    # Staged roll-ups are applied in slices of at most this long, between other work,
    # at most this long after they arrive (newer roll-ups of a cluster replace older).
    apply_slice_s: float = 0.002
    apply_coalesce_s: float = 0.25
    # Switch interval and garbage collector, set while the process runs (ADR 0066).
    interpreter: InterpreterSettings = field(default_factory=InterpreterSettings)
    # Shadow mode: decide and record, never act (BIGFLEET_MODE=shadow; bigfleet/shard/gate.py).
    shadow: bool = False
    # How long a shadow shard's would-be operations take before they settle in memory.
    shadow_delays: ShadowDelays = field(default_factory=ShadowDelays)
    # Fleet disruption budgets this shard enforces on its drains (shard_engine/budgets.py).
    budgets: tuple[Budget, ...] = ()
    # Edge processes serving the Session port (BIGFLEET_SHARD_EDGES; ADR 0147). 0: the
    # port is a thread of this process, as before.
    edges: int = 0
    # The Unix-domain socket the edges join ('' : one in the temporary directory).
    edge_socket: str = ""
    # Start the edges that do not rejoin (False: someone else starts them, as tests do).
    spawn_edges: bool = True
    # An edge whose engine process stays away this long closes its sessions and ends.
    edge_orphan_s: float = 120.0
    # With no edges configured and the Session port held while this shard's edge socket is
    # on disk, edges of an earlier run are told to stop and the port is tried this long.
    edge_dismiss_s: float = 10.0

    @property
    def task_queue(self) -> str:
        return task_queue(self.shard_id)


def advertised(listening: str, advertise: str = "") -> str:
    """The address to publish for a shard listening on ``listening`` (see ``advertise``)."""
    if advertise:
        return advertise
    host, _, port = listening.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        return f"{socket.gethostname()}:{port}"
    return listening
