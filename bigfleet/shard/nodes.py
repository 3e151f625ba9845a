"""The operator's node view: a ``NodeStateUpdate`` frame per change of a machine's state.

    provider observation / settled outcome -> NodeView.push -> SessionHub.send(cluster)

A frame goes to the cluster the machine is bound to, or the cluster it is
being configured for (the engine's in-flight mark), or a hint from the
caller (the cluster an outcome was for). A frame is sent only when the
(state, cluster) pair changed since the last one that reached a session;
frames not yet sent coalesce by ``node:<machine id>`` in the outbox.
"""

from __future__ import annotations

from bigfleet.shard.convert import resources_to_wire
from bigfleet.shard.sessions import SessionHub
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord

__all__ = ["NodeView"]


class NodeView:
    """Pushes machine state changes to the operators of the clusters they serve."""

    def __init__(self, hub: SessionHub, engine: ShardEngine) -> None:
        self._hub = hub
        self._engine = engine
        self._last_pushed: dict[str, tuple[int, str]] = {}

    def push(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        """Send the machine's state to its cluster's operator, if it changed."""
        cluster = record.cluster or self._engine.in_flight().get(record.id, "") or cluster_hint
        if not cluster:
            return
        stamp = (int(record.state), cluster)
        if self._last_pushed.get(record.id) == stamp:
            return
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
            self._last_pushed[record.id] = stamp
