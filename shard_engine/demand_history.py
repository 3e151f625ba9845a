"""Recent demand: each need's peak aggregate over a sliding window, for Phase 3.

Phase 3 must not give back what a cluster will ask for again in minutes.
Roll-ups are noisy (pods come and go between two of them) and demand moves
in waves; judged against the latest roll-up alone, every dip looks like
excess and every machine reclaimed on a dip is provisioned again at the next
rise — churn. So excess is judged against the *peak* of each need's
aggregate over the last ``window`` seconds, the way a Kubernetes HPA
stabilises its scale-down on the highest recommendation in its window.

A need that vanished from the roll-ups within the window still counts, with
the profiles it matched when last seen: a batch job that finished three
minutes ago and is resubmitted in five keeps its machines.

Bookkeeping is bounded: per need, ``BUCKETS`` time buckets of
``window / BUCKETS`` seconds, each holding the largest aggregate in force
during it. A value counts until its bucket leaves the window, so the window
is honoured to within one bucket (it may hold a peak up to ``window /
BUCKETS`` longer, never shorter). Only a roll-up that changes a cluster's
needs costs anything; a re-sent, unchanged one is a version comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shard_engine.needs import Demand

__all__ = ["BUCKETS", "DemandHistory", "Peaks"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

BUCKETS = 10
# One slot more than buckets: the window is BUCKETS whole buckets plus the current one.
_SLOTS = BUCKETS + 1


def _fit(vector: FloatArray, dims: int) -> FloatArray:
    """``vector`` padded with zeros (or cut) to ``dims`` resources."""
    if len(vector) == dims:
        return vector
    if len(vector) > dims:
        return vector[:dims]
    return np.pad(vector, (0, dims - len(vector)))


def _fit_rows(rows: FloatArray, dims: int) -> FloatArray:
    """Per-bucket rows padded with zeros (or cut) to ``dims`` resources, as :func:`_fit` does."""
    width = rows.shape[1]
    if width == dims:
        return rows
    if width > dims:
        return rows[:, :dims]
    return np.pad(rows, ((0, 0), (0, dims - width)))


@dataclass(slots=True)
class _Track:
    """One need's recent aggregates: the value in force and the per-bucket maxima."""

    mask: BoolArray
    current: FloatArray | None
    maxima: FloatArray
    minima: FloatArray
    epochs: npt.NDArray[np.int64]
    # The bucket epoch in which ``current`` was last recorded: recording it
    # again in that bucket changes nothing, so it is skipped.
    current_epoch: int | None = None
    # ``current`` as Python floats: what a re-sent row is compared with.
    values: list[float] | None = None

    def record(self, vector: FloatArray, epoch: int) -> None:
        slot = epoch % _SLOTS
        dims = max(self.maxima.shape[1], len(vector))
        if dims > self.maxima.shape[1]:
            pad = ((0, 0), (0, dims - self.maxima.shape[1]))
            self.maxima = np.pad(self.maxima, pad)
            self.minima = np.pad(self.minima, pad)
        if self.epochs[slot] != epoch:
            self.epochs[slot] = epoch
            self.maxima[slot] = 0.0
            self.minima[slot] = np.inf
        value = _fit(vector, dims)
        high = self.maxima[slot]
        np.maximum(high, value, out=high)
        low = self.minima[slot]
        np.minimum(low, value, out=low)

    def span(self, epoch: int, dims: int) -> tuple[FloatArray, FloatArray] | None:
        """(largest, smallest) aggregate in force within the window ending in bucket ``epoch``.

        A need no longer in the roll-ups is at zero now, so its smallest is zero.
        """
        live = self.epochs >= epoch - BUCKETS
        high: FloatArray | None = None
        low: FloatArray | None = None
        if live.any():
            high = _fit(self.maxima[live].max(axis=0), dims)
            low = _fit(self.minima[live].min(axis=0), dims)
        now = np.zeros(dims) if self.current is None else _fit(self.current, dims)
        if high is None or low is None:
            return (now, now) if self.current is not None else None
        return np.maximum(high, now), np.minimum(low, now)

    def expires(self, epoch: int) -> int | None:
        """The first bucket epoch at which this track's window peak may fall, if any."""
        live = self.epochs[self.epochs >= epoch - BUCKETS]
        if len(live) == 0:
            return None
        return int(live.min()) + BUCKETS + 1


@dataclass(slots=True)
class _Cluster:
    version: int = -1
    tracks: dict[str, _Track] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Peaks:
    """A cluster's needs as Phase 3 judges them: one row per need, current or recent.

    ``matrix[i, p]``: profile ``p`` may serve row ``i``; ``aggregate[i]``:
    the row's peak over the window, ``swing[i]`` its peak minus its trough
    (how much it moved); ``current`` is the number of current needs (they
    come first, in the compiled demand's order), the rest vanished within
    the window. ``recheck_at``: the earliest instant a peak may fall
    (``inf`` when none can).
    """

    matrix: BoolArray
    aggregate: FloatArray
    swing: FloatArray
    current: int
    recheck_at: float


class DemandHistory:
    """Per cluster and need, the peak aggregate over the last ``window`` seconds."""

    def __init__(self, window_seconds: float) -> None:
        if not window_seconds >= 0:
            raise ValueError("window_seconds: must not be negative")
        self.window = float(window_seconds)
        self._width = self.window / BUCKETS if self.window > 0 else 0.0
        self._clusters: dict[int, _Cluster] = {}

    def _epoch(self, now: float) -> int:
        return math.floor(now / self._width) if self._width > 0 else 0

    def observe(self, demand: Demand, *, now: float) -> None:
        """Note a cluster's (possibly changed) needs at ``now``; unchanged needs cost nothing."""
        if self.window <= 0:
            return
        entry = self._clusters.setdefault(demand.cluster, _Cluster())
        if entry.version == demand.version:
            return
        entry.version = demand.version
        epoch = self._epoch(now)
        tracks = entry.tracks
        seen = set(demand.keys)
        for key, track in list(tracks.items()):
            if track.current is not None and track.current_epoch != epoch:
                # The value in force until now counts in this bucket too.
                track.record(track.current, epoch)
                track.current_epoch = epoch
            if key not in seen:
                track.current = None
                if track.expires(epoch) is None:
                    del tracks[key]
        matrix = demand.matrix
        # One conversion for all rows: most rows of a changed roll-up are as they were.
        rows = demand.aggregate.tolist()
        for i, key in enumerate(demand.keys):
            row = rows[i]
            found = tracks.get(key)
            if found is None:
                track = _Track(
                    mask=matrix[i],  # a view: compiled matrices never change once built
                    current=None,
                    maxima=np.zeros((_SLOTS, len(row))),
                    minima=np.full((_SLOTS, len(row)), np.inf),
                    epochs=np.full(_SLOTS, -(2**62), dtype=np.int64),
                )
                tracks[key] = track
            else:
                track = found
                track.mask = matrix[i]
                if (
                    track.current_epoch == epoch
                    and track.current is not None
                    and track.values == row
                ):
                    continue  # the same value, already recorded in this bucket
            vector = np.array(row, dtype=np.float64)
            track.current = vector
            track.values = row
            track.record(vector, epoch)
            track.current_epoch = epoch

    def peaks(self, demand: Demand, *, now: float) -> Peaks:
        """The cluster's needs, each aggregate raised to its recent peak (see :class:`Peaks`)."""
        dims = demand.aggregate.shape[1] if demand.aggregate.ndim == 2 else 0
        profiles = demand.matrix.shape[1] if demand.matrix.ndim == 2 else 0
        aggregate = demand.aggregate.reshape(-1, dims).copy()
        swing = np.zeros_like(aggregate)
        entry = self._clusters.get(demand.cluster)
        if entry is None or self.window <= 0:
            return Peaks(demand.matrix, aggregate, swing, len(demand.keys), math.inf)
        epoch = self._epoch(now)
        recheck = math.inf
        rows: list[int] = []
        found: list[_Track] = []
        for i, key in enumerate(demand.keys):
            track = entry.tracks.get(key)
            if track is not None:
                rows.append(i)
                found.append(track)
        if found:
            recheck = self._raise_to_peaks(found, rows, aggregate, swing, epoch, dims)
        current = set(demand.keys)
        extra_rows: list[BoolArray] = []
        extra_high: list[FloatArray] = []
        extra_swing: list[FloatArray] = []
        for key, track in list(entry.tracks.items()):
            if key in current:
                continue
            span = track.span(epoch, dims)
            ends = track.expires(epoch)
            if span is None or ends is None:
                del entry.tracks[key]
                continue
            mask = np.zeros(profiles, dtype=np.bool_)
            width = min(profiles, len(track.mask))
            mask[:width] = track.mask[:width]
            extra_rows.append(mask)
            extra_high.append(span[0])
            extra_swing.append(span[0] - span[1])
            recheck = min(recheck, ends * self._width)
        if not extra_rows:
            return Peaks(demand.matrix, aggregate, swing, len(demand.keys), recheck)
        matrix = np.vstack([demand.matrix.reshape(-1, profiles), np.array(extra_rows)])
        return Peaks(
            matrix,
            np.vstack([aggregate, np.array(extra_high)]),
            np.vstack([swing, np.array(extra_swing)]),
            len(demand.keys),
            recheck,
        )

    def _raise_to_peaks(
        self,
        tracks: list[_Track],
        rows: list[int],
        aggregate: FloatArray,
        swing: FloatArray,
        epoch: int,
        dims: int,
    ) -> float:
        """Raise current needs to their window peaks in place; returns the earliest recheck.

        The rule of :meth:`_Track.span` and :meth:`_Track.expires`, applied
        to every track of the cluster at once: buckets outside the window
        are masked out (``-inf`` for maxima, ``inf`` for minima) instead of
        selected, which leaves every maximum and minimum the same. A track
        whose buckets all left the window and whose need is gone has no
        span; the rows here are current needs, whose value in force always
        counts.
        """
        maxima = np.stack([_fit_rows(t.maxima, dims) for t in tracks])
        minima = np.stack([_fit_rows(t.minima, dims) for t in tracks])
        epochs = np.stack([t.epochs for t in tracks])
        present = np.array([t.current is not None for t in tracks])
        now = np.stack(
            [np.zeros(dims) if t.current is None else _fit(t.current, dims) for t in tracks]
        )
        live = epochs >= epoch - BUCKETS
        spanned = live.any(axis=1) | present
        high = np.maximum(np.where(live[:, :, None], maxima, -np.inf).max(axis=1), now)
        low = np.minimum(np.where(live[:, :, None], minima, np.inf).min(axis=1), now)
        at = np.array(rows, dtype=np.int64)
        current = aggregate[at]
        moved = np.maximum(high, current) - np.minimum(low, current)
        raised = spanned & ((high > current).any(axis=1) | (moved > 0).any(axis=1))
        swing[at[spanned]] = moved[spanned]
        aggregate[at[raised]] = np.maximum(current[raised], high[raised])
        ending = raised & live.any(axis=1)
        if not ending.any():
            return math.inf
        first = np.where(live, epochs, np.iinfo(np.int64).max).min(axis=1)[ending]
        return float(min((int(e) + BUCKETS + 1) * self._width for e in first.tolist()))

    def forget(self, cluster: int) -> None:
        """Drop everything remembered about ``cluster`` (it left this shard)."""
        self._clusters.pop(cluster, None)
