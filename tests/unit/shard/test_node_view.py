"""The operator's node view converges: resync on every Hello, a final frame on leaving."""

from __future__ import annotations

from dataclasses import replace

from bigfleet.shard.nodes import NodeView
from bigfleet.shard.sessions import SessionHub
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState
from tests.unit.engine.engine_fleet import machine


def _drain_outbox(hub: SessionHub, cluster: str) -> list[shard_pb2.NodeStateUpdate]:
    """Every node frame queued for the cluster's session, oldest first."""
    session = hub._sessions[cluster]
    frames: dict[str, shard_pb2.ShardMessage] = dict(session.outbox._frames)
    session.outbox._frames.clear()
    return [f.node_state_update for f in frames.values() if f.HasField("node_state_update")]


def _rig() -> tuple[SessionHub, ShardEngine, NodeView]:
    hub = SessionHub()
    engine = ShardEngine()
    return hub, engine, NodeView(hub, engine)


def test_a_machine_drained_to_idle_gets_a_final_update_in_the_cluster_it_left() -> None:
    hub, engine, view = _rig()
    hub.open("c1", "v1")
    bound = machine("m1", state=MachineState.CONFIGURED, cluster="c1")
    engine.upsert_machine(bound, now=0)
    view.push(bound)
    idle = replace(bound, state=MachineState.IDLE, cluster="")
    engine.upsert_machine(idle, now=1)
    view.push(idle)
    frames = _drain_outbox(hub, "c1")
    # Coalesced by machine: the operator's last word on m1 is that it is idle now.
    assert [(f.machine_id, f.cluster_id, f.state) for f in frames] == [
        ("m1", "c1", int(MachineState.IDLE))
    ]
    assert view.shown_to("m1") == ""


def test_a_failed_machine_tells_its_cluster_with_the_error() -> None:
    hub, _engine, view = _rig()
    hub.open("c1", "v1")
    bound = machine("m1", state=MachineState.CONFIGURED, cluster="c1")
    view.push(bound)
    _drain_outbox(hub, "c1")
    failed = replace(bound, state=MachineState.FAILED, cluster="", last_error="disk gone")
    view.push(failed)
    [frame] = _drain_outbox(hub, "c1")
    assert (frame.state, frame.last_error) == (int(MachineState.FAILED), "disk gone")


def test_a_departure_while_the_operator_is_away_is_sent_on_its_next_hello() -> None:
    hub, _engine, view = _rig()
    session = hub.open("c1", "v1")
    bound = machine("m1", state=MachineState.CONFIGURED, cluster="c1")
    view.push(bound)
    hub.close(session)
    view.push(replace(bound, state=MachineState.IDLE, cluster=""))
    hub.open("c1", "v1")
    assert view.resync("c1") == 1
    [frame] = _drain_outbox(hub, "c1")
    assert (frame.machine_id, frame.state) == ("m1", int(MachineState.IDLE))
    # Owed once: a second Hello has nothing more to say about m1.
    assert view.resync("c1") == 0


def test_every_hello_gets_the_current_state_of_every_machine_of_the_cluster() -> None:
    hub, engine, view = _rig()
    for i, state in enumerate((MachineState.CONFIGURED, MachineState.DRAINING)):
        record = machine(f"m{i}", state=state, cluster="c1")
        engine.upsert_machine(record, now=0)
        view.push(record)  # no session yet: nothing delivered
    other = machine("x", state=MachineState.CONFIGURED, cluster="c2")
    engine.upsert_machine(other, now=0)
    view.push(other)
    hub.open("c1", "v1")
    assert view.resync("c1") == 2
    first = {(f.machine_id, f.state) for f in _drain_outbox(hub, "c1")}
    assert first == {("m0", int(MachineState.CONFIGURED)), ("m1", int(MachineState.DRAINING))}
    # A reconnect gets the full picture again, even though nothing changed.
    hub.open("c1", "v1")
    assert view.resync("c1") == 2
    assert {f.machine_id for f in _drain_outbox(hub, "c1")} == {"m0", "m1"}


def test_a_machine_moving_between_clusters_is_shown_leaving_one_and_joining_the_other() -> None:
    hub, _engine, view = _rig()
    hub.open("c1", "v1")
    hub.open("c2", "v1")
    record = machine("m1", state=MachineState.CONFIGURED, cluster="c1")
    view.push(record)
    moved = replace(record, state=MachineState.CONFIGURING, cluster="c2")
    view.push(moved)
    [left] = _drain_outbox(hub, "c1")
    [joined] = _drain_outbox(hub, "c2")
    # c1 is told the machine left (through IDLE); c2 that it is coming.
    assert (left.cluster_id, left.state) == ("c1", int(MachineState.IDLE))
    assert (joined.cluster_id, joined.state) == ("c2", int(MachineState.CONFIGURING))
    assert view.shown_to("m1") == "c2"


def test_an_unchanged_state_is_not_sent_twice() -> None:
    hub, _engine, view = _rig()
    hub.open("c1", "v1")
    record = machine("m1", state=MachineState.CONFIGURED, cluster="c1")
    view.push(record)
    _drain_outbox(hub, "c1")
    view.push(record)
    assert _drain_outbox(hub, "c1") == []


def test_a_machine_remembered_from_the_record_gets_a_final_update_when_seen_unbound() -> None:
    hub, _engine, view = _rig()
    hub.open("c1", "v1")
    # A restarted process: PostgreSQL says m1 serves c1, nothing was pushed yet.
    view.remember("m1", "c1")
    view.push(machine("m1", state=MachineState.IDLE))
    [frame] = _drain_outbox(hub, "c1")
    assert (frame.machine_id, frame.cluster_id, frame.state) == ("m1", "c1", int(MachineState.IDLE))
    assert view.shown_to("m1") == ""


def test_remembering_never_overrides_what_this_process_has_shown() -> None:
    hub, _engine, view = _rig()
    hub.open("c2", "v1")
    view.push(machine("m1", state=MachineState.CONFIGURED, cluster="c2"))
    view.remember("m1", "c1")
    assert view.shown_to("m1") == "c2"
