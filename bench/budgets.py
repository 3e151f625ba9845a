"""``python -m bench budgets``: what the budgets stage costs a cycle at 100K machines.

One 100K-machine shard (``bench.cycle.build``; 40 clusters of 15 needs,
reclaim at once so every cycle has drains to judge) is built afresh, with
the same seed, for each of three runs of ``--cycles`` measured cycles
after a few unmeasured ones:

- ``none``: no budget;
- ``ten``: ten budgets of the kinds ``docs/budgets.md`` shows — counts and
  percentages, scoped by shape pattern, capacity type, resource, cluster
  pattern, one with a cron window that is open, one naming preemption — so
  every drain is judged by several and some are held;
- ``ten_dealt``: the same ten, the counts replaced by a share of half of
  each (what a shard of two is dealt by the coordinator, ADR 0140).

Reported per run: the whole cycle's wall and CPU time (p50/p99), the
budgets stage's CPU time from the engine's stopwatch laps (p50/p99), and
the actions and holds per cycle. CPU time of this process is given beside
wall time because the machine is shared. Figures go to
``docs/benchmarks.md`` ("Budgets at 100K machines").
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from bench.cycle import RECLAIM_AT_ONCE, advance, build, emit, percentile
from shard_engine.budgets import Budget, CronSchedule, DrainReason, Scope, Window

__all__ = ["TEN_BUDGETS", "main"]

TEN_BUDGETS = (
    Budget("tenth-of-the-shard", percent=10.0, reasons=frozenset(DrainReason)),
    Budget("two-hundred-reclaiming", count=200),
    Budget("gpu-fleet", scope=Scope(resources=("nvidia.com/gpu",)), percent=5.0),
    Budget("spot-churn", scope=Scope(capacity_types=("spot",)), count=50),
    Budget("on-demand", scope=Scope(capacity_types=("on-demand",)), percent=3.0),
    Budget("large-shapes", scope=Scope(instance_types=("*.8xlarge", "*.16xlarge")), count=40),
    Budget("first-clusters", scope=Scope(clusters=("cluster-01*",)), percent=2.0),
    Budget(
        "always-open-window",
        count=300,
        window=Window(CronSchedule.parse("* * * * *"), 3600),
    ),
    Budget(
        "preemption-cap",
        count=100,
        reasons=frozenset({DrainReason.PREEMPT, DrainReason.RECLAIM}),
    ),
    Budget("bare-metal", scope=Scope(capacity_types=("bare-metal",)), count=10),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench budgets", description=__doc__)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    halves = {b.name: b.count // 2 for b in TEN_BUDGETS if b.count is not None}
    runs: tuple[tuple[str, tuple[Budget, ...], dict[str, int] | None], ...] = (
        ("none", (), None),
        ("ten", TEN_BUDGETS, None),
        ("ten_dealt", TEN_BUDGETS, halves),
    )
    for label, budgets, shares in runs:
        world = build(
            machines=100_000,
            clusters=40,
            needs_per_cluster=15,
            types=40,
            zones=6,
            racks=40,
            seed=args.seed,
            config=RECLAIM_AT_ONCE,
        )
        engine = world.engine
        # The engine never reads a clock; a stopwatch given to it times each stage (CPU).
        engine._stopwatch = time.process_time
        engine.budgets = budgets
        engine.budget_shares = shares
        rng = random.Random(args.seed + 1)
        wall: list[float] = []
        cpu: list[float] = []
        stage: list[float] = []
        actions: list[int] = []
        held: list[int] = []
        plan = None
        gc.collect()
        for n in range(args.warmup + args.cycles):
            advance(world, rng, plan, pending=0.18, excess=0.18, grow=40)
            gc.disable()
            started_cpu, started = time.process_time(), time.perf_counter()
            plan = engine.cycle(now=world.now)
            elapsed, spent = time.perf_counter() - started, time.process_time() - started_cpu
            gc.enable()
            if n >= args.warmup:
                wall.append(elapsed)
                cpu.append(spent)
                stage.append(engine.stats.phase_seconds.get("budgets", 0.0))
                actions.append(len(plan.actions))
                held.append(len(engine.holds))
        bench = f"budgets_100k_{label}"
        emit(bench, "budgets", len(budgets), "count")
        emit(bench, "actions_per_cycle_mean", sum(actions) / len(actions), "count")
        emit(bench, "held_per_cycle_mean", sum(held) / len(held), "count")
        emit(bench, "cycle_p50_ms", percentile(wall, 50) * 1e3, "ms")
        emit(bench, "cycle_p99_ms", percentile(wall, 99) * 1e3, "ms")
        emit(bench, "cycle_cpu_p50_ms", percentile(cpu, 50) * 1e3, "ms")
        emit(bench, "cycle_cpu_p99_ms", percentile(cpu, 99) * 1e3, "ms")
        emit(bench, "budgets_stage_cpu_p50_ms", percentile(stage, 50) * 1e3, "ms")
        emit(bench, "budgets_stage_cpu_p99_ms", percentile(stage, 99) * 1e3, "ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
