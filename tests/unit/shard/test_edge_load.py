"""An edge's report of itself: the LOAD frame, the collector's pauses, counters from totals."""

from __future__ import annotations

import gc
import math

import pytest
from prometheus_client import REGISTRY

from bigfleet.shard import telemetry
from bigfleet.shard.frames import (
    EdgeLoad,
    FrameError,
    Kind,
    decode,
    encode,
    load_body,
    load_from_body,
)
from bigfleet.shard.interpreter import GcPauses


def test_a_load_frame_round_trips_and_bad_figures_are_named() -> None:
    load = EdgeLoad(0.004, 0.25, 0.6, 1.5, 0.02, (("max_sessions", 3), ("loop_lag", 1)))
    frame = encode(Kind.LOAD, load_body(load))
    kind, body = decode(Kind.LOAD, frame[5:])
    assert kind is Kind.LOAD
    assert load_from_body(body) == load
    with pytest.raises(FrameError, match="LOAD frame: figures must be finite"):
        load_from_body((math.nan, 0.0, 0.0, 0.0, 0.0, ()))
    with pytest.raises(FrameError, match="LOAD frame: figures must be finite"):
        load_from_body((0.0, -1.0, 0.0, 0.0, 0.0, ()))
    with pytest.raises(FrameError, match="LOAD frame"):
        load_from_body((0.0, 0.0, "busy", 0.0, 0.0, ()))


def test_collector_pauses_add_up_and_the_worst_is_taken_once() -> None:
    pauses = GcPauses()
    unhook = pauses.install()
    try:
        gc.collect()
        gc.collect()
    finally:
        unhook()
    assert pauses.count >= 2 and pauses.total_s > 0
    worst = pauses.take_worst()
    assert 0 < worst <= pauses.total_s
    assert pauses.take_worst() == 0.0, "taken: the next report starts afresh"
    before = pauses.count
    gc.collect()
    assert pauses.count == before, "unhooked: no longer counted"


def test_running_totals_feed_counters_with_what_is_new_and_survive_a_restart() -> None:
    shard = "shard-load-test"

    def shed() -> float:
        value = REGISTRY.get_sample_value("bigfleet_session_shed_total", {"reason": "test_only"})
        return value or 0.0

    def gc_total() -> float:
        labels = {"shard": shard, "process": "edge-7"}
        return REGISTRY.get_sample_value("bigfleet_gc_pause_seconds_total", labels) or 0.0

    start = shed()
    telemetry.record_shed(shard, "edge-7", (("test_only", 5),))
    telemetry.record_shed(shard, "edge-7", (("test_only", 8),))
    assert shed() - start == 8, "running totals, counted once"
    telemetry.record_shed(shard, "edge-7", (("test_only", 2),))  # the edge restarted
    assert shed() - start == 10
    telemetry.record_gc(shard, "edge-7", total_s=0.5, worst_s=0.1)
    telemetry.record_gc(shard, "edge-7", total_s=0.75, worst_s=0.05)
    assert gc_total() == pytest.approx(0.75)
    labels = {"shard": shard, "process": "edge-7"}
    assert REGISTRY.get_sample_value("bigfleet_gc_pause_max_seconds", labels) == 0.05
