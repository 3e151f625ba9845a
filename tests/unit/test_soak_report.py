"""The soak's report: each 10-s window says which process stalled in it, and whose memory grew."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from bench import soak


def _window_rows(out: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [line for line in lines if line["metric"] == "window"]


def test_a_stall_lands_in_the_window_of_the_process_that_reported_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    t0 = 1000.0
    # Two windows, (0, 10] and (10, 20]: the engine at 300 then 310 MiB of 500 and 520.
    # CPU seconds so far per group, and the machine's busy seconds (all cores).
    cpu0 = {"engine": 0.0, "edges": 0.0, "loads": 0.0, "bench": 0.0, "machine": 0.0}
    cpu1 = {"engine": 2.0, "edges": 5.0, "loads": 4.0, "bench": 1.0, "machine": 15.0}
    cpu2 = {"engine": 4.0, "edges": 10.0, "loads": 8.0, "bench": 2.0, "machine": 34.0}
    # Seconds each group's threads waited for a core so far: the edge 7 s in the second
    # window (0.7 threads on average), the engine none.
    cpu1 |= {"engine.wait": 1.0, "edges.wait": 2.0, "loads.wait": 1.0}
    cpu2 |= {"engine.wait": 1.0, "edges.wait": 9.0, "loads.wait": 3.0}
    samples = [
        (10.0, 500 * 1024, 40, "1 1 1", 300 * 1024, cpu1),
        (20.0, 520 * 1024, 41, "1 1 1", 310 * 1024, cpu2),
    ]
    # Acks of the first window are quick; those of the second are late.
    results = [
        {
            "start_monotonic": t0,
            "sent_s": [1.0, 2.0, 12.0, 13.0],
            "latencies_ms": [2.0, 3.0, 900.0, 1200.0],
            "scheduled_s": [1.0, 2.0, 12.0, 13.0],
            "lags": [[t0 + 4.0, 25.0]],  # the load process ran late in the first window only
            # Its writes waited in the second window, its loop on time: the transport held them.
            "write_waits": [[t0 + 13.0, 640.0]],
        }
    ]
    stats = {
        # [t, edge, lag max, gc max, gc total, busy]: the edge stalled in the second window.
        "edges_load": [[t0 + 5.0, 0, 3.0, 1.0, 10.0, 0.5], [t0 + 14.0, 0, 1100.0, 40.0, 60.0, 0.9]],
        "gc_long": [[t0 + 15.0, 2, 85.0]],  # [t, generation, ms]
        "cycle_end_s": [t0 + 5.0, t0 + 15.0],
        "cycle_wall_ms": [100.0, 200.0],
    }
    args = argparse.Namespace(minutes=20 / 60, plot="", rate=2.0, clusters=1, edges=1)
    wall0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z, the wall-clock time of t0
    assert soak._report(args, 20.0, t0, samples, results, stats, wall0=wall0) == 0
    first, second = _window_rows(capsys.readouterr().out)
    # Each window carries its end's wall-clock time, to match it with other logs.
    assert (first["at"], second["at"]) == (
        "2026-11-30T00:53:30.000+00:00",
        "2026-11-30T00:53:40.000+00:00",
    )
    assert (first["engine_rss_mib"], first["edges_rss_mib"]) == (300.0, 200.0)
    assert (second["engine_rss_mib"], second["edges_rss_mib"]) == (310.0, 210.0)
    assert first["load_lag_ms"] == 25.0 and second["load_lag_ms"] == 0.0
    assert (first["load_write_ms"], second["load_write_ms"]) == (0.0, 640.0)
    assert (first["edge_lag_ms"], second["edge_lag_ms"]) == (3.0, 1100.0)
    assert (first["edge_gc_ms"], second["edge_gc_ms"]) == (1.0, 40.0)
    assert (first["engine_gc_ms"], second["engine_gc_ms"]) == (0.0, 85.0)
    assert second["ack_p50_ms"] >= 900.0 > first["ack_p99_ms"]
    # The first window has no sample before it; the second says where 1.9 cores went.
    assert first["other_cores"] == 0.0
    assert (second["engine_cores"], second["edges_cores"], second["loads_cores"]) == (0.2, 0.5, 0.4)
    assert (second["bench_cores"], second["other_cores"]) == (0.1, 0.7)
    assert soak._cores(cpu0, cpu1, 10.0)["other_cores"] == 0.3
    # Waiting for a core, per group: none before the first sample, then what each waited.
    assert first["edges_waiting"] == 0.0
    waiting = (second["engine_waiting"], second["edges_waiting"], second["loads_waiting"])
    assert waiting == (0.0, 0.7, 0.2)
    # A group whose process ended (the load, as the run stops) says nothing of its wait.
    ended = soak._cores(cpu2, cpu2 | {"loads.wait": 0.5}, 10.0)
    assert "loads_waiting" not in ended and ended["edges_waiting"] == 0.0
    # A kernel that keeps no scheduler statistics leaves the figure out, not zero.
    plain = {k: v for k, v in cpu1.items() if not k.endswith(".wait")}
    assert not [k for k in soak._cores(cpu0, plain, 10.0) if k.endswith("_waiting")]


def test_a_run_without_edges_or_stalls_reports_zero_stalls() -> None:
    stalls = soak._stalls(0.0, [{"sent_s": []}], {})
    assert stalls == {
        "load_lag_ms": [],
        "load_write_ms": [],
        "edge_lag_ms": [],
        "edge_gc_ms": [],
        "engine_gc_ms": [],
    }
    assert soak._worst([(5.0, 12.0), (10.0, 99.0)], 0.0, 10.0) == 12.0
