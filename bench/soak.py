"""A long run of fleet-rate ingestion on one shard: does anything grow?

``python -m bench soak [--minutes N] [--rate R] [--clusters C] [--plot PATH]``

    Temporal dev server · PostgreSQL · simulated cloud (some quota, so
    machines are created, configured and released as demand moves)
    one real shard process (``bench ingest``'s shard child)
    two load processes: C clusters, together R roll-ups/s, open loop, each
    roll-up a changed 5-need demand; a stream shed with RESOURCE_EXHAUSTED
    comes back after the retry hint, as an operator does

Every 10 s the shard's resident memory (engine process and edges apart)
and open descriptors are sampled; ack latency (p50, p99, from the
scheduled send), decision-cycle wall time and the stalls each process
reports of itself (edge loop lateness and collector pauses, the engine's
long collector pauses, a load process's own loop lateness and how long
its writes waited) are binned into the same 10-s windows afterwards
(every process uses the system-wide monotonic clock), beside the cores
each process group used in the window (engine, edges, load, the bench
itself, and the rest of the machine: Temporal, PostgreSQL, the system)
and how many of each group's threads waited for a core, so a window of
late acks says which process, if any, stalled in it, where the cores
went, and whether anyone was short of one. Prints one JSON line per
window and a summary; writes a PNG plot. The shard is its engine process
and its edge processes (``--edges``, by default the product's: one per
core beyond the engine's). ``memory_growth`` compares the last window's
RSS with the RSS when warm-up ends (the first fifth of the run, at least
one minute): issue 20 asks at most 5 % over an hour. ``make bench`` runs
the 5-minute version; the hour is ``--minutes 60`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stack import (
    Stack,
    cpu_seconds,
    json_line,
    loadavg,
    machine_busy_seconds,
    percentile,
    rss_kib,
    runqueue_seconds,
    services,
    split_load,
    start_shard,
    stop_loads,
    stop_shard,
)
from bigfleet.config import auto_edges

WINDOW_S = 10.0
# A group's key in a CPU sample for the seconds its threads waited for a core.
WAIT = ".wait"


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _emit(metric: str, value: Any, unit: str, **extra: Any) -> None:
    line = {"bench": "soak", "metric": metric, "value": value, "unit": unit, **extra}
    line["loadavg"] = loadavg()
    print(json.dumps(line), flush=True)


async def soak(args: argparse.Namespace) -> int:
    seconds = args.minutes * 60.0
    samples: list[tuple[float, int, int, str, int, dict[str, float]]] = []
    async with services(quota_scale=0.2) as (temporal, provider):
        shard, drop = await start_shard(Stack(temporal, provider, args.pg, edges=args.edges))
        assert shard.stdout is not None
        loads: list[Any] = []
        try:
            ready = await json_line(shard.stdout, 120)
            address, pid = ready["address"], int(ready["pid"])
            # The shard is its engine process and its edges: memory and descriptors of all.
            pids = [pid, *(int(p) for p in ready.get("edge_pids", []))]
            start_at = time.time() + 10.0 + args.clusters / 400
            loads = await split_load(
                address,
                "soak",
                clusters=args.clusters,
                mode="open",
                seconds=seconds,
                needs=5,
                rate=args.rate,
                start_at=start_at,
                reconnect=True,  # a shed stream comes back after its hint
            )
            for proc in loads:
                await json_line(proc.stdout, 300)
            t0 = time.monotonic() + max(0.0, start_at - time.time())
            await asyncio.sleep(max(0.0, t0 - time.monotonic()))
            # The wall-clock time of t0, so a window can be matched with other logs
            # (PostgreSQL's checkpoints, the system's journal).
            wall0 = time.time() - (time.monotonic() - t0)

            async def sample() -> None:
                groups = {
                    "engine": [pid],
                    "edges": pids[1:],
                    "loads": [proc.pid for proc in loads],
                    "bench": [os.getpid()],  # the sampler and the simulated cloud
                }
                while True:
                    engine_rss = rss_kib(pid)
                    rss = engine_rss + sum(rss_kib(p) for p in pids[1:])
                    fds = sum(_fds(p) for p in pids)
                    cpu = {name: _cpu(group) for name, group in groups.items()}
                    for name, group in groups.items():
                        waited = runqueue_seconds(group)
                        if waited is not None:
                            cpu[f"{name}{WAIT}"] = waited
                    cpu["machine"] = machine_busy_seconds()
                    samples.append((time.monotonic() - t0, rss, fds, loadavg(), engine_rss, cpu))
                    await asyncio.sleep(WINDOW_S)

            sampler = asyncio.create_task(sample())
            results = [await json_line(proc.stdout, seconds + 300) for proc in loads]
            for proc in loads:
                await proc.wait()
            sampler.cancel()
            shard.send_signal(signal.SIGTERM)
            stats = await json_line(shard.stdout, 60)
        finally:
            await stop_loads(loads)
            await stop_shard(shard, drop)
    return _report(args, seconds, t0, samples, results, stats, wall0=wall0)


def _report(
    args: argparse.Namespace,
    seconds: float,
    t0: float,
    samples: list[tuple[float, int, int, str, int, dict[str, float]]],
    results: list[dict[str, Any]],
    stats: dict[str, Any],
    *,
    wall0: float,
) -> int:
    acks = [
        (r["start_monotonic"] - t0 + sent, ms)
        for r in results
        for sent, ms in zip(r["sent_s"], r["latencies_ms"], strict=True)
    ]
    scheduled = [r["start_monotonic"] - t0 + t for r in results for t in r["scheduled_s"]]
    cycles = [
        (end - t0, wall)
        for end, wall in zip(
            stats.get("cycle_end_s", []), stats.get("cycle_wall_ms", []), strict=False
        )
    ]
    # What each process said of its own stalls, on the shared clock (see _stalls).
    stalls = _stalls(t0, results, stats)
    rows: list[dict[str, Any]] = []
    previous: dict[str, float] | None = None
    for t, rss, fds, load, engine_rss, cpu in samples:
        lo, hi = t - WINDOW_S, t
        cores = _cores(previous, cpu, WINDOW_S)
        previous = cpu
        lat = [ms for when, ms in acks if lo <= when < hi]
        cyc = [ms for when, ms in cycles if lo <= when < hi]
        due = sum(1 for when in scheduled if lo <= when < hi)
        rows.append(
            {
                "t_s": round(t, 1),
                "at": _utc(wall0 + t),
                "rss_mib": round(rss / 1024, 1),
                "engine_rss_mib": round(engine_rss / 1024, 1),
                "edges_rss_mib": round((rss - engine_rss) / 1024, 1),
                "fds": fds,
                "acked": len(lat),
                "due": due,
                "ack_p50_ms": round(percentile(lat, 50), 1),
                "ack_p99_ms": round(percentile(lat, 99), 1),
                "cycle_mean_ms": round(sum(cyc) / len(cyc), 1) if cyc else None,
                "cycle_max_ms": max(cyc) if cyc else None,
                **{name: _worst(points, lo, hi) for name, points in stalls.items()},
                **cores,
                "loadavg": load,
            }
        )
        _emit("window", rows[-1]["t_s"], "s", **rows[-1])
    warm = max(60.0, seconds / 5)
    after = [r for r in rows if r["t_s"] >= warm]
    growth = float("nan")
    if len(after) >= 2:
        growth = 100.0 * (after[-1]["rss_mib"] - after[0]["rss_mib"]) / after[0]["rss_mib"]
    all_lat = [ms for _, ms in acks]
    _emit(
        "memory_growth",
        round(growth, 2),
        "%",
        after_warmup_s=warm,
        rss_first_mib=after[0]["rss_mib"] if after else None,
        rss_last_mib=after[-1]["rss_mib"] if after else None,
        minutes=args.minutes,
    )
    _emit("fds_max", max((r["fds"] for r in rows), default=0), "fds", edges=args.edges)
    _emit(
        "acked",
        len(all_lat),
        "rollups",
        scheduled=len(scheduled),
        ack_p50_ms=round(percentile(all_lat, 50), 1),
        ack_p99_ms=round(percentile(all_lat, 99), 1),
        rate=args.rate,
        clusters=args.clusters,
    )
    walls = [w for _, w in cycles]
    if walls:
        _emit("cycle_wall_mean", round(sum(walls) / len(walls), 1), "ms", max_ms=max(walls))
    if args.plot:
        title = f"soak: {args.minutes:g} min, {args.rate:g} roll-ups/s, {args.edges} edge(s)"
        _plot(rows, Path(args.plot), title=title)
        _emit("plot", args.plot, "png")
    return 0


def _stalls(
    t0: float, results: list[dict[str, Any]], stats: dict[str, Any]
) -> dict[str, list[tuple[float, float]]]:
    """Per source, (seconds after ``t0``, ms) of each stall it reported of itself.

    ``load_lag_ms``: a load process's loop ran late (its sends, and so its
    acks' latencies, are late with it); ``load_write_ms``: the longest a
    load process's roll-up waited, from its scheduled time, for its
    session's write to be taken (well past ``load_lag_ms``, a writer held
    back by the transport: the shard not reading, HTTP/2 flow control);
    ``edge_lag_ms`` / ``edge_gc_ms``: an
    edge's loop lateness and collector pause, each the worst of a second
    (its LOAD reports); ``engine_gc_ms``: a collector pause of the engine
    process of at least ``bench.ingest.LONG_GC_MS``. A window whose acks
    are late shows here which process stalled in it, if any did.
    """
    edges = stats.get("edges_load", [])
    return {
        "load_lag_ms": [(t - t0, ms) for r in results for t, ms in r.get("lags", [])],
        "load_write_ms": [(t - t0, ms) for r in results for t, ms in r.get("write_waits", [])],
        "edge_lag_ms": [(r[0] - t0, r[2]) for r in edges],
        "edge_gc_ms": [(r[0] - t0, r[3]) for r in edges],
        "engine_gc_ms": [(t - t0, ms) for t, _, ms in stats.get("gc_long", [])],
    }


def _utc(wall: float) -> str:
    """``wall`` (seconds since the epoch) as an ISO 8601 UTC time to the millisecond."""
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


def _cpu(pids: list[int]) -> float:
    """CPU seconds of ``pids`` together (a process that has ended counts nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def _cores(
    previous: dict[str, float] | None, now: dict[str, float], seconds: float
) -> dict[str, float]:
    """Cores each group used over the window, and ``other_cores``: the rest of the machine.

    "Other" is every process outside the shard, its load and the bench
    itself: the Temporal server, PostgreSQL, the system. A window of late
    acks in which no process of the shard stalled but "other" rose says
    the machine's cores went elsewhere. ``<group>_waiting`` (where the kernel
    keeps scheduler statistics) is how many of the group's threads were,
    on average, runnable but given no core: a late window whose processes
    waited here was short of CPU, one whose processes did not was held by
    something else.
    """
    names = [name for name in now if name != "machine" and not name.endswith(WAIT)]
    waits = [name.removesuffix(WAIT) for name in now if name.endswith(WAIT)]
    if previous is None:
        return {f"{name}_cores": 0.0 for name in [*names, "other"]} | {
            f"{name}_waiting": 0.0 for name in waits
        }
    used = {name: (now[name] - previous[name]) / seconds for name in names}
    machine = (now["machine"] - previous["machine"]) / seconds
    out = {f"{name}_cores": round(value, 2) for name, value in used.items()}
    out["other_cores"] = round(max(0.0, machine - sum(used.values())), 2)
    for name in waits:
        before = previous.get(name + WAIT)
        # Less than before: a process of the group ended and took its count with it.
        if before is not None and now[name + WAIT] >= before:
            out[f"{name}_waiting"] = round((now[name + WAIT] - before) / seconds, 2)
    return out


def _worst(points: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The largest value reported within [lo, hi) (0 when none was)."""
    return max((ms for when, ms in points if lo <= when < hi), default=0.0)


def _plot(rows: list[dict[str, Any]], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(6, 1, figsize=(8, 14), sharex=True)
    axes[0].plot(minutes, [r["rss_mib"] for r in rows], label="engine + edges")
    axes[0].plot(minutes, [r["engine_rss_mib"] for r in rows], label="engine")
    axes[0].plot(minutes, [r["edges_rss_mib"] for r in rows], label="edges")
    axes[0].set_ylabel("shard RSS (MiB)")
    axes[0].legend()
    axes[1].plot(minutes, [r["fds"] for r in rows])
    axes[1].set_ylabel("open fds")
    axes[2].plot(minutes, [r["ack_p50_ms"] for r in rows], label="p50")
    axes[2].plot(minutes, [r["ack_p99_ms"] for r in rows], label="p99")
    axes[2].set_ylabel("ack latency (ms)")
    axes[2].set_yscale("log")
    axes[2].legend()
    axes[3].plot(minutes, [r["cycle_mean_ms"] or float("nan") for r in rows], label="mean")
    axes[3].plot(minutes, [r["cycle_max_ms"] or float("nan") for r in rows], label="max")
    axes[3].set_ylabel("cycle wall (ms)")
    axes[3].legend()
    for name, label in (
        ("edge_lag_ms", "edge loop late"),
        ("edge_gc_ms", "edge collector"),
        ("engine_gc_ms", "engine collector"),
        ("load_lag_ms", "load loop late"),
        ("load_write_ms", "load write waited"),
    ):
        axes[4].plot(minutes, [r[name] for r in rows], label=label)
    axes[4].set_ylabel("worst stall in window (ms)")
    axes[4].legend()
    for name in ("engine", "edges", "loads", "bench", "other"):
        axes[5].plot(minutes, [r[f"{name}_cores"] for r in rows], label=name)
    for name in ("engine", "edges", "loads"):
        key = f"{name}_waiting"
        if any(key in r for r in rows):
            values = [r.get(key, float("nan")) for r in rows]
            axes[5].plot(minutes, values, linestyle="--", label=f"{name} waiting")
    axes[5].set_ylabel("cores used;\nthreads waiting (dashed)")
    axes[5].set_xlabel("minutes")
    axes[5].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the run")
    parser.add_argument("--rate", type=float, default=2000.0, help="roll-ups/s offered")
    parser.add_argument("--clusters", type=int, default=2000, help="clusters (sessions)")
    parser.add_argument("--plot", default=".bigfleet/soak.png", help="PNG to write ('' for none)")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (default: machine's)")
    parser.add_argument(
        "--edges",
        type=int,
        default=auto_edges(),
        help="edge processes serving the Session port (default: the product's, ADR 0147)",
    )
    args = parser.parse_args(argv)
    status = asyncio.run(soak(args))
    sys.stdout.flush()
    return status
