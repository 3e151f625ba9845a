"""Simulator speed: how fast virtual time runs at fleet scale.

``python -m bench simulate [--machines 1000000] [--clusters 2000] [--shards 20]
[--duration 3600] [--policy bigfleet] [--scenario mixed]``

Builds the scenario for ``clusters`` clusters, a fleet of about ``machines``
machines (the shipped catalogs scaled), and replays ``duration`` virtual
seconds under one policy. Prints JSON lines: set-up time (building the
provider cores and loading the engines), replay wall time, the speed-up
over real time, the machines and events, the peak RSS, the process's CPU
time (user + system, trace generation and set-up included, engine workers
included) with the speed-up
it would give on an otherwise idle core, and the 1-minute load average
before and after (on a shared machine wall time is several times CPU time). The goal
(issue 14) is one virtual day of 20 shards, 2,000 clusters and ~1M machines
in under 15 minutes (≥ 100× real time).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from simulator.driver import RunOptions, run_policy
from simulator.engines import default_workers
from simulator.scenarios import build

__all__ = ["main"]

_MACHINES_AT_SCALE_1 = 1496


def main(argv: list[str] | None = None) -> int:
    """Run the speed benchmark; print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench simulate", description=__doc__)
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--policy", default="bigfleet")
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--cycle-interval", type=float, default=10.0)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes running the engines (1: none; default one per core, at most one a shard)",
    )
    args = parser.parse_args(argv)
    quota_scale = args.machines / _MACHINES_AT_SCALE_1
    workers = args.workers if args.workers is not None else default_workers(args.shards)
    load_before = _loadavg()
    started = time.perf_counter()
    scenario = build(
        args.scenario,
        clusters=args.clusters,
        duration=args.duration,
        seed=1,
        scale=args.scale,
        quota_scale=quota_scale,
    )
    generated = time.perf_counter() - started
    options = RunOptions(
        quota_scale=quota_scale,
        shards=args.shards,
        cycle_interval_s=args.cycle_interval,
        workers=workers,
    )
    result = run_policy(scenario.trace, args.policy, options)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the engine workers, joined by now
    rss_gib = usage.ru_maxrss / 2**20
    cpu_s = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime
    base = {"bench": "simulate", "policy": args.policy, "machines": args.machines}
    lines = [
        ("trace_generation_s", round(generated, 1), "s"),
        ("setup_s", result.summary.get("setup_seconds", 0.0), "s"),
        ("setup_cpu_s", result.summary.get("setup_cpu_seconds", 0.0), "s"),
        (
            "replay_cpu_s",
            round(result.summary["cpu_seconds"] - result.summary["setup_cpu_seconds"], 1),
            "s",
        ),
        ("wall_s", round(result.wall_s, 1), "s"),
        ("speedup", result.summary["speedup"], "x"),
        ("virtual_s", args.duration, "s"),
        ("events", len(scenario.trace.events), "events"),
        ("clusters", args.clusters, "clusters"),
        ("shards", args.shards, "shards"),
        ("workers", workers, "processes"),
        ("peak_rss", round(rss_gib, 2), "GiB"),
        ("peak_rss_largest_worker", round(children.ru_maxrss / 2**20, 2), "GiB"),
        ("cpu_s", round(cpu_s, 1), "s"),
        ("cpu_s_main_process", round(usage.ru_utime + usage.ru_stime, 1), "s"),
        ("speedup_on_cpu_time", round(args.duration / max(cpu_s, 1e-9), 1), "x"),
        ("loadavg_before", load_before, "1-min"),
        ("loadavg_after", _loadavg(), "1-min"),
    ]
    for metric, value, unit in lines:
        print(json.dumps({**base, "metric": metric, "value": value, "unit": unit}))
    return 0


def _loadavg() -> float:
    """The 1-minute load average (the machine is shared: every figure names it)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


if __name__ == "__main__":
    raise SystemExit(main())
