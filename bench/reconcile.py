"""Reconcile benchmark: the cost of one comparison of providers, record and engine.

``python -m bench reconcile [--machines 100000] [--drift 0.01] [--runs 5]``

Builds a fleet of ``machines`` (a fifth speculative, the rest idle or
configured for one of 200 clusters), the matching ownership rows and engine
records, then breaks ``drift`` of them the ways the reconcile loop repairs
(bindings missing or stale, stale in-flight marks, engine views behind) and
times ``shard_engine.drift.find_drift`` over them. The loop's own I/O (a
full List per provider, two PostgreSQL queries, one visibility query) is not
in the figure: it is measured end to end by ``tests/integration/test_reconcile.py``.

Prints one JSON line per metric: ``seconds`` (median of ``runs``),
``repairs`` and ``machines_per_second``, with the load average.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from shard_engine.drift import Believed, Listed, Recorded, find_drift
from shard_engine.model import MachineState

__all__ = ["main", "run"]


Fleet = tuple[
    list[Listed], dict[str, Recorded], dict[str, str], dict[str, Believed], dict[str, float]
]


def _fleet(machines: int, drift: float, seed: int = 7) -> Fleet:
    rng = random.Random(seed)
    listed: list[Listed] = []
    recorded: dict[str, Recorded] = {}
    owners: dict[str, str] = {}
    believed: dict[str, Believed] = {}
    flights: dict[str, float] = {}
    for i in range(machines):
        mid = f"m-{i:07d}"
        roll = rng.random()
        if roll < 0.2:
            state, cluster = MachineState.SPECULATIVE, ""
        elif roll < 0.4:
            state, cluster = MachineState.IDLE, ""
        else:
            state, cluster = MachineState.CONFIGURED, f"c-{rng.randrange(200)}"
        listed.append(Listed(mid, "p", state, cluster))
        owners[mid] = "s1"
        recorded[mid] = Recorded(mid, "p", cluster or None)
        believed[mid] = Believed(state, cluster)
        if rng.random() < drift:
            kind = rng.randrange(4)
            if kind == 0:
                recorded[mid] = Recorded(mid, "p", None if cluster else "c-gone")
            elif kind == 1:
                flights[mid] = 0.0
            elif kind == 2:
                believed[mid] = Believed(MachineState.CONFIGURING, cluster)
            else:
                del owners[mid], recorded[mid], believed[mid]
    return listed, recorded, owners, believed, flights


def run(*, machines: int = 100_000, drift: float = 0.01, runs: int = 5) -> dict[str, float]:
    listed, recorded, owners, believed, flights = _fleet(machines, drift)
    times: list[float] = []
    repairs = 0
    for _ in range(runs):
        started = time.perf_counter()
        found = find_drift(
            listed=listed,
            listed_providers={"p"},
            recorded=recorded,
            owners=owners,
            believed=believed,
            in_flight_since=flights,
            busy=(),
            now=1_000.0,
            stale_after_s=30.0,
        )
        times.append(time.perf_counter() - started)
        repairs = len(found)
    seconds = statistics.median(times)
    return {"seconds": seconds, "repairs": repairs, "machines_per_second": machines / seconds}


def main(argv: list[str] | None = None) -> int:
    """Run the reconcile benchmark; print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench reconcile")
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--drift", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    figures = run(machines=args.machines, drift=args.drift, runs=args.runs)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    units = {"seconds": "s", "repairs": "count", "machines_per_second": "1/s"}
    for metric, value in figures.items():
        print(
            json.dumps(
                {
                    "bench": "reconcile",
                    "metric": metric,
                    "value": round(value, 4),
                    "unit": units[metric],
                    "machines": args.machines,
                    "drift": args.drift,
                    "loadavg": load,
                }
            )
        )
    return 0
