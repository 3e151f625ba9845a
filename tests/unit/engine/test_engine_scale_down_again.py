"""Scale-downs that are asked for happen every time, on default settings (issue 18 item 4).

A Nanook-style pool lowers its demand and names the workers that may go
(ADR 0070). That is an explicit request, not excess: the named machines go
within a few cycles whatever the anti-churn window (ADR 0125). A cluster
without a list is held to the anti-churn rules (ADR 0090), but its second
scale-down must not stall behind what its first left in the hysteresis record.
"""

from __future__ import annotations

from collections.abc import Callable

from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState, Reclaim, Rollup
from tests.rollups import apply
from tests.unit.engine.engine_fleet import GI, Carrier, fleet, machine_ids, need, of_kind, rollup

CYCLE = 10.0  # seconds between cycles, as a shard runs them by default


def configured(engine: ShardEngine, cluster: str) -> list[str]:
    return sorted(
        m.id
        for m in engine.machines()
        if m.cluster == cluster and m.state == MachineState.CONFIGURED
    )


def pool_rollup(stamp: int, workers: int, release: list[str]) -> Rollup:
    """What the Nanook adapter sends: ``workers`` 4-core workers, ``release`` offered."""
    base = rollup("pool", stamp, need(cpu=4.0 * workers, min_cpu=4))
    return Rollup(base.cluster_id, base.timestamp_ns, base.needs, release=frozenset(release))


def cycles_until(
    engine: ShardEngine, carrier: Carrier, start: float, done: Callable[[], bool], *, limit: int
) -> tuple[int, float]:
    """Cycle every ``CYCLE`` s from ``start`` until ``done()``; return (cycles, next time)."""
    now = start
    for n in range(1, limit + 1):
        carrier.carry(engine.cycle(now=now), now=now)
        now += CYCLE
        if done():
            return n, now
    raise AssertionError(f"not done within {limit} cycles: {configured(engine, 'pool')}")


def test_a_pool_scales_down_up_and_down_again_each_within_a_few_cycles() -> None:
    engine = ShardEngine(EngineConfig())
    carrier = Carrier(engine)
    fleet(engine, 10)  # idle 4-core machines
    apply(engine, pool_rollup(1, 7, []), now=0)
    _, now = cycles_until(
        engine, carrier, 1.0, lambda: len(configured(engine, "pool")) == 7, limit=3
    )

    workers = configured(engine, "pool")
    apply(engine, pool_rollup(2, 2, workers[2:]), now=now)
    down, now = cycles_until(
        engine, carrier, now, lambda: configured(engine, "pool") == workers[:2], limit=3
    )

    apply(engine, pool_rollup(3, 7, []), now=now)
    up, now = cycles_until(
        engine, carrier, now, lambda: len(configured(engine, "pool")) == 7, limit=3
    )

    workers = configured(engine, "pool")
    keep = workers[:1] + workers[-1:]
    apply(engine, pool_rollup(4, 2, workers[1:-1]), now=now)
    again, now = cycles_until(
        engine, carrier, now, lambda: configured(engine, "pool") == keep, limit=3
    )
    assert (down, up, again) == (1, 1, 1)


def test_named_machines_younger_than_the_minimum_age_go_when_named() -> None:
    engine = ShardEngine(EngineConfig(reclaim_min_age_seconds=3600, reclaim_window_seconds=3600))
    carrier = Carrier(engine)
    fleet(engine, 4)
    apply(engine, pool_rollup(1, 4, []), now=0)
    _, now = cycles_until(
        engine, carrier, 1.0, lambda: len(configured(engine, "pool")) == 4, limit=2
    )
    workers = configured(engine, "pool")

    apply(engine, pool_rollup(2, 1, workers[1:]), now=now)
    plan = engine.cycle(now=now)

    assert sorted(machine_ids(of_kind(plan, Reclaim))) == workers[1:]


def test_a_named_machine_the_current_demand_still_needs_stays() -> None:
    engine = ShardEngine(EngineConfig())
    carrier = Carrier(engine)
    fleet(engine, 3)
    apply(engine, pool_rollup(1, 3, []), now=0)
    _, now = cycles_until(
        engine, carrier, 1.0, lambda: len(configured(engine, "pool")) == 3, limit=2
    )
    workers = configured(engine, "pool")

    # Three workers wanted, all three named: the list says which may go, the demand how many.
    apply(engine, pool_rollup(2, 3, workers), now=now)
    plans = [engine.cycle(now=now + CYCLE * i) for i in range(5)]

    assert [a for p in plans for a in of_kind(p, Reclaim)] == []


def test_an_implicit_scale_down_after_a_scale_up_is_not_stalled_by_the_first() -> None:
    # No release list: the anti-churn rules apply (window, age, hysteresis), so each
    # scale-down waits for them, and then happens. The first reclaim drives the
    # hysteresis record's least excess to zero; it must not be carried into the next.
    config = EngineConfig()
    engine = ShardEngine(config)
    carrier = Carrier(engine)
    fleet(engine, 6)
    patience = int(
        (config.reclaim_window_seconds + config.reclaim_min_age_seconds) / CYCLE
        + config.reclaim_hysteresis_cycles
        + 6
    )
    apply(engine, rollup("web", 1, need(cpu=24)), now=0)
    _, now = cycles_until(
        engine, carrier, 1.0, lambda: len(configured(engine, "web")) == 6, limit=3
    )
    for stamp, cpu, machines in ((2, 4, 1), (3, 24, 6), (4, 4, 1), (5, 24, 6), (6, 4, 1)):
        apply(engine, rollup("web", stamp, need(cpu=cpu)), now=now)
        _, now = cycles_until(
            engine,
            carrier,
            now,
            lambda m=machines: len(configured(engine, "web")) == m,  # type: ignore[misc]
            limit=patience,
        )


def small_worker_pool(stamp: int, workers: int, release: list[str] | None) -> Rollup:
    """Workers of 4 cores and 2 GiB on 4-core, 16 GiB machines: one each, 14 GiB stranded."""
    base = rollup(
        "pool",
        stamp,
        need(cpu=4.0 * workers, memory=2.0 * GI * workers, min_cpu=4, min_memory=2 * GI),
    )
    if release is None:
        return base
    return Rollup(base.cluster_id, base.timestamp_ns, base.needs, release=frozenset(release))


def test_a_pool_whose_unit_strands_memory_scales_down_when_named_and_when_not() -> None:
    # A machine counts for the units it holds (one worker: 4 cores, 2 GiB), and it
    # must leave the surplus at that too: taken off at its allocatable (16 GiB), one
    # machine would eat seven machines' worth of memory surplus and none could go.
    config = EngineConfig()
    engine = ShardEngine(config)
    carrier = Carrier(engine)
    fleet(engine, 8)
    apply(engine, small_worker_pool(1, 6, []), now=0)
    _, now = cycles_until(
        engine, carrier, 1.0, lambda: len(configured(engine, "pool")) == 6, limit=3
    )
    workers = configured(engine, "pool")

    apply(engine, small_worker_pool(2, 2, workers[2:]), now=now)
    named, now = cycles_until(
        engine, carrier, now, lambda: configured(engine, "pool") == workers[:2], limit=3
    )
    assert named == 1

    apply(engine, small_worker_pool(3, 6, []), now=now)
    _, now = cycles_until(
        engine, carrier, now, lambda: len(configured(engine, "pool")) == 6, limit=3
    )
    patience = int(
        (config.reclaim_window_seconds + config.reclaim_min_age_seconds) / CYCLE
        + config.reclaim_hysteresis_cycles
        + 6
    )
    apply(engine, small_worker_pool(4, 1, None), now=now)
    cycles_until(engine, carrier, now, lambda: len(configured(engine, "pool")) == 1, limit=patience)
