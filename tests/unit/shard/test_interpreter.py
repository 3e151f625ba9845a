"""The shard's interpreter settings are applied while it runs and undone when it stops."""

from __future__ import annotations

import gc
import sys

from bigfleet.shard.interpreter import InterpreterSettings


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
