"""The operator's node view: a ``NodeStateUpdate`` frame per change of a machine's state.

    provider observation / settled outcome -> NodeView.push   -> SessionHub.send(cluster)
    operator Hello (first connect or reconnect) -> NodeView.resync(cluster)

A frame goes to the cluster the machine is bound to, or the cluster it is
being configured for (the engine's in-flight mark), or a hint from the
caller (the cluster an outcome was for). A frame is sent only when the
(state, cluster) pair changed since the last one that reached a session;
frames not yet sent coalesce by ``node:<machine id>`` in the outbox.

Convergence (ADR 0104): the view remembers which cluster each machine was
last shown to. A machine that leaves that cluster — drained to idle,
deleted, failed, moved — gets one final frame there with its new state (a
machine already configuring for another cluster is shown IDLE, the state it
left through); if
the cluster has no session at that moment the frame is owed and sent on its
next Hello. Every Hello, first connect or reconnect, is answered with the
current state of every machine of that cluster (like the Go reference's
resync on reconnect, its ADR-0057), so an operator that missed frames while
disconnected catches up.
"""

from __future__ import annotations

from dataclasses import replace

from bigfleet.shard.convert import resources_to_wire
from bigfleet.shard.sessions import SessionHub
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord, MachineState

__all__ = ["NodeView"]


class NodeView:
    """Pushes machine state changes to the operators of the clusters they serve."""

    def __init__(self, hub: SessionHub, engine: ShardEngine) -> None:
        self._hub = hub
        self._engine = engine
        # machine -> (state, cluster) of the last frame that reached a session.
        self._last_pushed: dict[str, tuple[int, str]] = {}
        # machine -> the cluster it was last shown to; cluster -> those machines.
        self._shown_to: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}
        # cluster -> machine -> the final frame of a machine that left while the
        # cluster had no session (sent on its next Hello).
        self._owed: dict[str, dict[str, MachineRecord]] = {}

    def push(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        """Send the machine's state to its cluster's operator, if it changed.

        A machine that left the cluster it was last shown to gets a final
        frame there first, with its new state.
        """
        cluster = record.cluster or self._engine.in_flight().get(record.id, "") or cluster_hint
        previous = self._shown_to.get(record.id, "")
        if previous and previous != cluster:
            final = _leaving(record)
            self._forget(record.id, previous)
            if not self._send(previous, final):
                self._owed.setdefault(previous, {})[record.id] = final
        if not cluster:
            return
        if previous != cluster:
            self._shown_to[record.id] = cluster
            self._members.setdefault(cluster, set()).add(record.id)
            owed = self._owed.get(cluster)
            if owed is not None:
                owed.pop(record.id, None)
        if self._last_pushed.get(record.id) == (int(record.state), cluster):
            return
        self._send(cluster, record)

    def resync(self, cluster_id: str) -> int:
        """Send the current state of every machine of the cluster, and any frame owed to it.

        Called when the cluster's operator says Hello. Returns the frames queued.
        """
        sent = 0
        for record in self._owed.pop(cluster_id, {}).values():
            sent += self._send(cluster_id, record)
        for machine_id in sorted(self._members.get(cluster_id, ())):
            current = self._engine.machine(machine_id)
            if current is not None:
                sent += self._send(cluster_id, current)
        return sent

    def remember(self, machine_id: str, cluster_id: str) -> None:
        """Take the cluster a machine was last bound to from the ownership record.

        A restarted process starts with an empty view; without this, a machine
        that left its cluster while no process of the shard ran (a spot
        interruption, a drain finished by the previous holder) would never be
        announced as leaving. Seeded before the first observation, the
        observation that finds the machine unbound sends (or owes) the final
        frame like any other departure. Nothing is sent here.
        """
        if not cluster_id or machine_id in self._shown_to:
            return
        self._shown_to[machine_id] = cluster_id
        self._members.setdefault(cluster_id, set()).add(machine_id)

    def shown_to(self, machine_id: str) -> str:
        """The cluster whose operator last heard of the machine ("" for none)."""
        return self._shown_to.get(machine_id, "")

    def _forget(self, machine_id: str, cluster: str) -> None:
        self._shown_to.pop(machine_id, None)
        members = self._members.get(cluster)
        if members is not None:
            members.discard(machine_id)
            if not members:
                del self._members[cluster]

    def _send(self, cluster: str, record: MachineRecord) -> bool:
        """Queue a frame about ``record`` for ``cluster``'s operator."""
        frame = shard_pb2.ShardMessage(
            node_state_update=shard_pb2.NodeStateUpdate(
                supersedes_key=f"node:{record.id}",
                machine_id=record.id,
                cluster_id=cluster,
                state=int(record.state),  # type: ignore[arg-type]
                node_name=record.id if record.state.has_host else "",
                provider_id=f"{record.provider}://{record.zone}/{record.host_ref}"
                if record.host_ref
                else "",
                last_error=record.last_error,
                labels=dict(record.labels),
                resources=resources_to_wire(record.allocatable),
            )
        )
        if self._hub.send(cluster, frame, key=f"node:{record.id}"):
            self._last_pushed[record.id] = (int(record.state), cluster)
            return True
        return False


def _leaving(record: MachineRecord) -> MachineRecord:
    """The final frame for the cluster a machine left: its new state (idle, deleted,
    failed). A machine already bound elsewhere passed through IDLE on the way (a
    provider drains before it configures anew), and that is what the cluster it
    left is told; the frame is addressed to that cluster, as operators expect."""
    if record.cluster:
        return replace(record, state=MachineState.IDLE, cluster="")
    return record
