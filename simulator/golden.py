"""Golden traces: small traces under version control with their expected summaries.

``python -m simulator.golden`` rewrites the expected summaries after a
deliberate change in behaviour (review the diff: it is the change's effect
on the replay). The tests replay each trace and compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from simulator.driver import POLICIES, RunOptions, simulate
from simulator.trace import load_trace

__all__ = ["GOLDEN", "TRACES", "expected_path", "figures", "replay"]

TRACES = Path(__file__).resolve().parent / "traces"

#: trace name -> (fleet quota scale, shards)
GOLDEN: dict[str, tuple[float, int]] = {"mixed-small": (1.0, 2), "tiers-small": (0.5, 3)}


def expected_path(name: str) -> Path:
    """Where the expected summary of a golden trace lives."""
    return TRACES / f"{name}.expected.json"


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The part of a summary that must not drift (everything but wall time and speed)."""
    return {
        k: v
        for k, v in summary.items()
        if k not in ("wall_seconds", "speedup", "setup_seconds", "cpu_seconds", "setup_cpu_seconds")
    }


def replay(name: str) -> dict[str, dict[str, Any]]:
    """Replay one golden trace under every policy; policy -> figures."""
    quota_scale, shards = GOLDEN[name]
    trace = load_trace(TRACES / f"{name}.jsonl")
    options = RunOptions(quota_scale=quota_scale, seed=7, shards=shards)
    return {r.policy: figures(r.summary) for r in simulate(trace, options, policies=POLICIES)}


def main() -> int:
    """Rewrite every expected summary."""
    for name in GOLDEN:
        path = expected_path(name)
        path.write_text(json.dumps(replay(name), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
