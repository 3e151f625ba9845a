"""``python -m bench NAME``: run a benchmark suite; each prints JSON lines.

Suites: ``cycle`` (the shard engine), ``lifecycle`` (machine transitions
through Temporal), ``packing`` (vector bin packing heuristics), ``simulate``
(the simulator's speed at fleet scale), ``nanook`` (the Nanook adapter's
answers), ``ingest`` (roll-up acks and sessions on one shard process),
``churn`` (reclaims and flaps under changing demand), ``soak`` (minutes of
fleet-rate ingestion on one shard: RSS, descriptors, ack latency and cycle
time every 10 s, with a plot), ``reconcile`` (one
comparison of providers, record and engine), ``probe`` (one container
healthcheck, ``bigfleet health``), ``adoption`` (what budgets and the
decision log cost a burst cycle), ``budgets`` (cycle time with 0 and
10 budgets at 100K machines), ``reads`` (a shard reading a batch of
machines one Get after another or several at once), ``all`` (every suite
in turn).
Each line is
``{"bench": ..., "metric": ..., "value": ..., "unit": ...}``.
"""

from __future__ import annotations

import importlib
import sys

SUITES = {
    "cycle": "bench.cycle",
    "lifecycle": "bench.lifecycle",
    "packing": "bench.packing",
    "simulate": "bench.simulate",
    "nanook": "bench.nanook",
    "ingest": "bench.ingest",
    "churn": "bench.churn",
    "soak": "bench.soak",
    "reconcile": "bench.reconcile",
    "probe": "bench.probe",
    "adoption": "bench.adoption",
    "budgets": "bench.budgets",
    "reads": "bench.reads",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    names = list(SUITES) if name == "all" else [name]
    status = 0
    for suite in names:
        if suite not in SUITES:
            print(
                f"unknown suite {suite!r}; choose from {', '.join(SUITES)} or all", file=sys.stderr
            )
            return 2
        try:
            module = importlib.import_module(SUITES[suite])
        except ModuleNotFoundError as err:
            print(f"suite {suite!r} is not available: {err}", file=sys.stderr)
            status = 1
            continue
        status |= int(module.main(rest))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
