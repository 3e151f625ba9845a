"""Packing benchmark: seed 004's construction, every heuristic side by side.

``python -m bench packing [--runs 200] [--pods 80] [--sigma 0.5] [--mean 0.25]``

Each run draws ``pods`` pods whose CPU and memory are fully anti-correlated:
``z ~ N(0, 1)``, CPU ``= m·e^{σz}``, memory ``= m·e^{−σz}`` (a Gaussian copula
with correlation −1 and log-normal marginals, in units of one node), with
``m`` chosen so the mean demand per dimension is ``mean`` of a node — about
21 nodes' worth of the busier dimension, the lower bound of the seed's
panel. Every heuristic packs the same pods; run ``k`` uses seed ``k``.

Prints one JSON line per heuristic (``metric`` ``mean_nodes``), one with the
mean lower bound, and a last line with every heuristic's mean side by side
and the default's name (``docs/adr/0080-packing-heuristic-and-benchmark.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from clusters.packing import DEFAULT_HEURISTIC, FloatArray, Heuristic, lower_bound, pack

__all__ = ["anticorrelated_pods", "main", "run"]


def anticorrelated_pods(
    rng: np.random.Generator, pods: int = 80, *, sigma: float = 0.5, mean: float = 0.25
) -> FloatArray:
    """``pods`` × 2 demands (CPU, memory) as fractions of a node, correlation −1."""
    scale = mean / math.exp(sigma * sigma / 2)
    z = rng.standard_normal(pods)
    items = np.stack([scale * np.exp(sigma * z), scale * np.exp(-sigma * z)], axis=1)
    out: FloatArray = np.clip(items, 0.0, 1.0)
    return out


def run(
    *, runs: int = 200, pods: int = 80, sigma: float = 0.5, mean: float = 0.25
) -> dict[str, float]:
    """Mean node count per heuristic (and ``lower-bound``) over ``runs`` seeded draws."""
    totals = {h.value: 0 for h in Heuristic}
    bound = 0
    capacity = np.ones(2)
    for seed in range(runs):
        items = anticorrelated_pods(np.random.default_rng(seed), pods, sigma=sigma, mean=mean)
        bound += lower_bound(items, capacity)
        for heuristic in Heuristic:
            totals[heuristic.value] += pack(items, capacity, heuristic).nodes
    out = {name: total / runs for name, total in totals.items()}
    out["lower-bound"] = bound / runs
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the packing benchmark; print JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m bench packing", description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pods", type=int, default=80)
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--mean", type=float, default=0.25)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    means = run(runs=args.runs, pods=args.pods, sigma=args.sigma, mean=args.mean)
    elapsed = time.perf_counter() - started
    for name, value in means.items():
        metric = "mean_lower_bound" if name == "lower-bound" else "mean_nodes"
        line = {"bench": "packing", "metric": metric, "heuristic": name, "value": round(value, 3)}
        print(json.dumps({**line, "unit": "nodes"}))
    side_by_side = {name: round(value, 3) for name, value in means.items()}
    print(
        json.dumps(
            {
                "bench": "packing",
                "metric": "mean_nodes_by_heuristic",
                "value": side_by_side,
                "unit": "nodes",
                "default": DEFAULT_HEURISTIC.value,
                "runs": args.runs,
                "pods": args.pods,
                "seconds": round(elapsed, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
