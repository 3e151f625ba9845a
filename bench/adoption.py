"""``python -m bench adoption``: what budgets and the decision log cost a burst cycle.

The world is ``cycle_burst_500k``'s (500K machines, ~2,000 actions a cycle,
reclaim at once). The same world runs three ways in turn, ``--cycles``
measured cycles each after a few unmeasured ones:

- ``plain``: no budgets;
- ``budgets``: two budgets that apply to every drain — one generous
  (10 % of every machine), one that holds most reclaims (at most 50
  reclaiming at once) — so enforcement and the plan's rewrite both run;
- and for every cycle, outside the engine, what the shard process adds:
  handing the cycle's rows to the decision log (``DecisionLog.defer``, on
  the cycle loop) and building and buffering them (``DecisionLog.build``,
  in the writer task between other work), per cycle and per row; the sink
  discards.

The budgets stage is timed on its own from the engine's stopwatch laps.

CPU time of this process is reported beside wall time: the machine is
shared. The figures, and the load they were taken at, go to
``docs/benchmarks.md`` ("Safe adoption").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time

from bench.cycle import RECLAIM_AT_ONCE, advance, emit, percentile, world_500k
from bigfleet.decisions import Decision, DecisionLog, Mode, decisions_of
from shard_engine.budgets import Budget, DrainReason, Scope

__all__ = ["main"]

BUDGETS = (
    Budget("tenth-of-the-shard", percent=10.0, reasons=frozenset(DrainReason)),
    Budget("fifty-reclaiming", scope=Scope(), count=50),
)


class _Discard:
    """A decision sink that keeps nothing (the bench measures the cycle side only)."""

    async def append(self, entries: list[Decision]) -> int:
        return len(entries)

    async def prune(self, shard_id: str, *, retention_seconds: float, max_rows: int) -> int:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench adoption", description=__doc__)
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    world = world_500k(seed=args.seed, config=RECLAIM_AT_ONCE)
    engine = world.engine
    # The engine never reads a clock; a stopwatch given to it times each stage (CPU here).
    engine._stopwatch = time.process_time  # what bench.cycle.build does not pass in
    rng = random.Random(args.seed + 1)
    log = DecisionLog("bench", _Discard(), clock=time.time)
    for label, budgets in (("plain", ()), ("budgets", BUDGETS)):
        engine.budgets = budgets
        wall: list[float] = []
        cpu: list[float] = []
        actions: list[int] = []
        held: list[int] = []
        record_cpu: list[float] = []
        handover: list[float] = []
        stage: list[float] = []
        rows: list[int] = []
        plan = None
        for n in range(5 + args.cycles):
            advance(world, rng, plan, pending=0.18, excess=0.18, grow=40)
            gc.disable()
            started_cpu, started = time.process_time(), time.perf_counter()
            plan = engine.cycle(now=world.now)
            elapsed, spent = time.perf_counter() - started, time.process_time() - started_cpu
            count = len(plan.actions)
            handed = time.process_time()
            log.defer(
                decisions_of(
                    plan,
                    shard_id="bench",
                    cycle=n,
                    mode=Mode.ACTIVE,
                    holds=engine.holds,
                    profile_of=engine.profile_of,
                )
            )
            handed = time.process_time() - handed
            recorded_cpu = time.process_time()
            buffered = asyncio.run(log.build())
            recorded_cpu = time.process_time() - recorded_cpu
            gc.enable()
            asyncio.run(log.flush())
            if n >= 5:
                wall.append(elapsed)
                cpu.append(spent)
                actions.append(count)
                held.append(len(engine.holds))
                record_cpu.append(recorded_cpu)
                handover.append(handed)
                stage.append(engine.stats.phase_seconds.get("budgets", 0.0))
                rows.append(buffered)
        bench = f"adoption_burst_500k_{label}"
        emit(bench, "actions_per_cycle_mean", sum(actions) / len(actions), "count")
        emit(bench, "held_per_cycle_mean", sum(held) / len(held), "count")
        emit(bench, "cycle_p50_ms", percentile(wall, 50) * 1e3, "ms")
        emit(bench, "cycle_p99_ms", percentile(wall, 99) * 1e3, "ms")
        emit(bench, "cycle_cpu_p50_ms", percentile(cpu, 50) * 1e3, "ms")
        emit(bench, "cycle_cpu_p99_ms", percentile(cpu, 99) * 1e3, "ms")
        emit(bench, "budgets_stage_cpu_p50_ms", percentile(stage, 50) * 1e3, "ms")
        emit(bench, "budgets_stage_cpu_p99_ms", percentile(stage, 99) * 1e3, "ms")
        emit(bench, "decision_handover_cpu_p99_us", percentile(handover, 99) * 1e6, "us")
        emit(bench, "decision_rows_per_cycle_mean", sum(rows) / len(rows), "count")
        emit(bench, "decision_build_cpu_p50_ms", percentile(record_cpu, 50) * 1e3, "ms")
        emit(bench, "decision_build_cpu_p99_ms", percentile(record_cpu, 99) * 1e3, "ms")
        per_row = [c / r for c, r in zip(record_cpu, rows, strict=True) if r]
        if per_row:
            emit(bench, "decision_build_cpu_per_row_us", percentile(per_row, 50) * 1e6, "us")
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
