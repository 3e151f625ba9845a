"""The session outbox keeps order and coalesces frames that supersede each other."""

from __future__ import annotations

from bigfleet.shard.sessions import Outbox
from bigfleet.v1alpha1 import shard_pb2


def _node(machine: str, state: int) -> shard_pb2.ShardMessage:
    return shard_pb2.ShardMessage(
        node_state_update=shard_pb2.NodeStateUpdate(machine_id=machine, state=state)  # type: ignore[arg-type]
    )


async def test_a_newer_frame_replaces_a_queued_one_with_the_same_key_in_place() -> None:
    box = Outbox()
    box.put(_node("a", 2), "node:a")
    box.put(_node("b", 2), "node:b")
    box.put(_node("a", 3), "node:a")
    first, second = await box.get(), await box.get()
    assert first is not None and second is not None
    assert (first.node_state_update.machine_id, first.node_state_update.state) == ("a", 3)
    assert second.node_state_update.machine_id == "b"
    assert len(box) == 0


async def test_frames_without_a_key_are_never_dropped() -> None:
    box = Outbox()
    for _ in range(3):
        box.put(shard_pb2.ShardMessage(ack=shard_pb2.Acknowledgement(echo="rollup")))
    assert len(box) == 3


async def test_a_closed_outbox_drains_then_ends() -> None:
    box = Outbox()
    box.put(_node("a", 1), "node:a")
    box.close()
    assert await box.get() is not None
    assert await box.get() is None
