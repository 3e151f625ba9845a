"""Health-probe benchmark: what one container healthcheck costs.

``python -m bench probe [--runs 5]``

Each compose healthcheck of a shard or provider starts ``bigfleet health``
as a new process. This runs it ``runs`` times against a plaintext provider
server on loopback (SERVING) and reports the median wall time and CPU time
(user + system of the child, from ``resource.getrusage``) per probe, plus
the CPU time of importing the ``bigfleet`` command alone, which every
command pays. The machine is shared, so the 1-minute load average is printed
with each line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from providers.config import ProviderConfig
from providers.server import start_provider_server

__all__ = ["main"]


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and exit code of one child process."""
    cpu0, wall0 = _child_cpu(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - wall0, _child_cpu() - cpu0, done.returncode


def _line(metric: str, value: float, unit: str) -> None:
    print(
        json.dumps(
            {
                "bench": "probe",
                "metric": metric,
                "value": round(value, 4),
                "unit": unit,
                "load_1m": round(os.getloadavg()[0], 2),
            }
        ),
        flush=True,
    )


async def _run(runs: int) -> None:
    running = await start_provider_server(
        ProviderConfig(kind="sim-cloud", name="bench", time_factor=0.01), "127.0.0.1:0"
    )
    bigfleet = str(Path(sys.executable).parent / "bigfleet")
    import_only = [sys.executable, "-c", "import bigfleet.cli"]
    try:
        probe = [bigfleet, "health", running.address]
        probes = [await asyncio.to_thread(_timed, probe) for _ in range(runs)]
        imports = [await asyncio.to_thread(_timed, import_only) for _ in range(runs)]
    finally:
        await running.stop()
    assert all(code == 0 for _, _, code in probes), probes
    _line("probe_wall_seconds", statistics.median(w for w, _, _ in probes), "s")
    _line("probe_cpu_seconds", statistics.median(c for _, c, _ in probes), "s")
    _line("cli_import_cpu_seconds", statistics.median(c for _, c, _ in imports), "s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench probe")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    asyncio.run(_run(max(1, args.runs)))
    return 0
