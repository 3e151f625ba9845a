"""Capacity hints published on the shard's loop reach sessions served on another thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from bigfleet.shard.capacity_hints import CapacityHints
from bigfleet.shard.sessions import OperatorSession, SessionHub
from bigfleet.v1alpha1 import shard_pb2
from shard_engine.engine import ShardEngine
from tests.unit.engine.engine_fleet import machine


class SessionsThread:
    """A hub bound to an event loop on its own thread, as the shard's Session port runs."""

    def __init__(self) -> None:
        self.hub = SessionHub()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sessions")
        self.thread.start()
        self.call(self.hub.bind, self.loop)

    def call(self, fn: object, *args: object) -> object:
        async def run() -> object:
            return fn(*args)  # type: ignore[operator]

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def sessions() -> Iterator[SessionsThread]:
    rig = SessionsThread()
    try:
        yield rig
    finally:
        rig.stop()


def test_hints_are_queued_on_the_sessions_thread_not_the_publishing_one(
    sessions: SessionsThread,
) -> None:
    session = sessions.call(sessions.hub.open, "c1", "v1")
    assert isinstance(session, OperatorSession)
    queued_on: list[str] = []
    put = session.outbox.put

    def recording_put(frame: shard_pb2.ShardMessage, key: str = "") -> None:
        queued_on.append(threading.current_thread().name)
        put(frame, key)

    session.outbox.put = recording_put  # type: ignore[method-assign]
    engine = ShardEngine()
    engine.upsert_machine(machine("m1"), now=0)
    hints = CapacityHints(sessions.hub, engine)

    assert hints.publish() == 1  # from this (the shard's) thread
    sessions.call(lambda: None)  # everything handed to the sessions' loop has run

    assert queued_on == ["sessions"]
    frames = list(session.outbox._frames.values())
    assert len(frames) == 1
    assert isinstance(frames[0], shard_pb2.ShardMessage)
    assert frames[0].HasField("available_capacity")
