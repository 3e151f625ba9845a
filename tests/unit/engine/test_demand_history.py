"""Window peaks computed for all of a cluster's needs at once equal the need-by-need rule."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from shard_engine.demand_history import DemandHistory, Peaks
from shard_engine.needs import Demand
from tests.unit.engine.plan_history import History


def need_by_need(history: DemandHistory, demand: Demand, now: float) -> Peaks:
    """The peaks rule stated one track at a time (``_Track.span`` / ``expires``), read-only."""
    dims = demand.aggregate.shape[1]
    profiles = demand.matrix.shape[1]
    aggregate = demand.aggregate.reshape(-1, dims).copy()
    swing = np.zeros_like(aggregate)
    entry = history._clusters.get(demand.cluster)
    if entry is None or history.window <= 0:
        return Peaks(demand.matrix, aggregate, swing, len(demand.keys), math.inf)
    epoch = history._epoch(now)
    recheck = math.inf
    for i, key in enumerate(demand.keys):
        track = entry.tracks.get(key)
        span = None if track is None else track.span(epoch, dims)
        if track is None or span is None:
            continue
        high, low = span
        swing[i] = np.maximum(high, aggregate[i]) - np.minimum(low, aggregate[i])
        if (high > aggregate[i]).any() or (swing[i] > 0).any():
            aggregate[i] = np.maximum(aggregate[i], high)
            ends = track.expires(epoch)
            if ends is not None:
                recheck = min(recheck, ends * history._width)
    rows, highs, swings = [], [], []
    for key, track in entry.tracks.items():
        if key in set(demand.keys):
            continue
        span = track.span(epoch, dims)
        ends = track.expires(epoch)
        if span is None or ends is None:
            continue
        mask = np.zeros(profiles, dtype=np.bool_)
        width = min(profiles, len(track.mask))
        mask[:width] = track.mask[:width]
        rows.append(mask)
        highs.append(span[0])
        swings.append(span[0] - span[1])
        recheck = min(recheck, ends * history._width)
    if rows:
        return Peaks(
            np.vstack([demand.matrix, np.array(rows)]),
            np.vstack([aggregate, np.array(highs)]),
            np.vstack([swing, np.array(swings)]),
            len(demand.keys),
            recheck,
        )
    return Peaks(demand.matrix, aggregate, swing, len(demand.keys), recheck)


@pytest.mark.parametrize("seed", range(6))
def test_peaks_of_all_needs_at_once_equal_the_need_by_need_rule(seed: int) -> None:
    rng = random.Random(seed)
    history = History(seed)
    history.populate()
    engine = history.engine
    table = engine._table
    window = engine._reclaim.history
    checked = 0
    for _ in range(120):
        if rng.random() < 0.6:
            history.change_needs()
        history.now += rng.choice((0.0, 5.0, 30.0, 61.0, 200.0))
        for entry in table.entries():
            demand = table.demand(entry)
            expected = need_by_need(window, demand, history.now)
            found = window.peaks(demand, now=history.now)
            assert np.array_equal(found.matrix, expected.matrix)
            assert np.array_equal(found.aggregate, expected.aggregate)
            assert np.array_equal(found.swing, expected.swing)
            assert (found.current, found.recheck_at) == (expected.current, expected.recheck_at)
            checked += int((found.swing > 0).any())
    assert checked > 0, "no need ever moved within the window"
