"""The shard's interpreter settings are applied while it runs and undone when it stops."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref

from bigfleet.shard.interpreter import (
    PACER,
    CollectorClock,
    InterpreterSettings,
    SurvivorFreezer,
)


def test_settings_apply_while_the_shard_runs_and_are_undone_after() -> None:
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    undo = InterpreterSettings(switch_interval_s=0.002, gc_young_threshold=1234).apply()
    try:
        assert sys.getswitchinterval() == 0.002
        assert gc.get_threshold() == (1234, *thresholds[1:])
    finally:
        undo()
    assert sys.getswitchinterval() == interval
    assert gc.get_threshold() == thresholds


def test_objects_alive_after_start_are_frozen_until_the_shard_stops() -> None:
    undo = InterpreterSettings(switch_interval_s=None, gc_young_threshold=None).apply()
    try:
        InterpreterSettings().started()
        assert gc.get_freeze_count() > 0
    finally:
        undo()
    assert gc.get_freeze_count() == 0


def test_none_leaves_the_interpreter_as_it_is() -> None:
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    settings = InterpreterSettings(
        switch_interval_s=None, gc_young_threshold=None, freeze_after_start=False
    )
    undo = settings.apply()
    settings.started()
    assert (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count()) == (
        interval,
        thresholds,
        0,
    )
    undo()


def test_an_edge_collects_by_the_clock_and_freezes_what_each_full_pass_leaves() -> None:
    clock = CollectorClock(young_s=0.005, full_s=0.05)
    settings = InterpreterSettings(switch_interval_s=None, gc_young_threshold=None, gc_clock=clock)
    young, full = PACER.young, PACER.full

    async def run() -> tuple[bool, int]:
        settings.started()
        await asyncio.sleep(0.3)
        return gc.isenabled(), gc.get_freeze_count()

    undo = settings.apply()
    try:
        trigger_on, frozen = asyncio.run(run())
    finally:
        undo()
    assert not trigger_on  # the loop collects; the collector's own trigger is off
    assert PACER.young > young and PACER.full > full
    assert frozen > 0  # what the full passes left is frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0  # undone with the shard


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_cycle_frozen_with_the_survivors_is_collected_once_the_frozen_set_doubles() -> None:
    freezer = SurvivorFreezer(growth=2.0)
    enabled = gc.isenabled()
    gc.disable()  # only this test's collections, in this order
    unhook = freezer.install()
    try:
        gc.collect()
        gc.freeze()
        freezer.arm()
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        gc.collect()  # survivors of a full collection are frozen: the cycle with them
        assert (freezer.freezes, freezer.thaws) == (1, 0)
        del a, b
        gc.collect()
        assert gone() is not None  # a frozen cycle waits ...
        keep: list[list[int]] = [[] for _ in range(2 * freezer.baseline)]
        gc.collect()  # the new objects survive and are frozen: more than twice the baseline
        assert (freezer.freezes, freezer.thaws) == (3, 0)
        gc.collect()  # ... so the frozen set is thawed
        assert freezer.thaws == 1 and gc.get_freeze_count() == 0
        gc.collect()  # and the next full collection walks everything once
        assert gone() is None
        # Its survivors are the new baseline. A frozen object that dies by reference
        # counting leaves the frozen set, and the suite's other threads may drop a few
        # between the freeze and this read (9 of 2.8 million in one full run): the set
        # may only have shrunk since, by far less than what this test froze.
        frozen = gc.get_freeze_count()
        assert frozen <= freezer.baseline < frozen + len(keep)
        assert frozen > len(keep)
    finally:
        unhook()
        gc.unfreeze()
        if enabled:
            gc.enable()


def test_the_freezer_does_nothing_until_armed() -> None:
    freezer = SurvivorFreezer()
    unhook = freezer.install()
    try:
        gc.collect()
        assert freezer.freezes == 0 and gc.get_freeze_count() == 0
    finally:
        unhook()


def test_the_pacer_leaves_a_trigger_that_was_off_off() -> None:
    async def run() -> None:
        PACER.start(asyncio.get_running_loop(), CollectorClock(young_s=0.005, full_s=10.0))
        await asyncio.sleep(0.02)
        PACER.stop()

    gc.disable()
    try:
        asyncio.run(run())
        assert not gc.isenabled()
    finally:
        gc.enable()
