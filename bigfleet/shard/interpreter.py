"""How the shard process sets up the Python interpreter for short acknowledgements.

Two threads share one interpreter lock (ADR 0066): the Session port's and
the shard's loop, whose decision cycle runs for hundreds of milliseconds.
Two interpreter-wide pauses reach the acknowledgements:

- **the switch interval**: a thread that wants the lock waits this long for
  the holder to hand it over (Python's default is 5 ms); an ack needs the
  lock several times (read, convert, write), so the shard uses 1 ms;
- **the cyclic garbage collector**: a full collection holds the lock while
  it walks every tracked object. Most of a shard's objects are made at
  start-up (modules, the inventory, the catalog) and live as long as the
  process, so once started the shard collects and then *freezes* them
  (``gc.freeze``): later full collections walk only what came after. The
  young generation's threshold is raised, so collections come ten times
  less often and a full one less often still. (The threshold counts
  objects made *less those freed*, so it bounds a young pass only while
  the process mostly adds objects; see the edge below.)

  An edge process (``bigfleet.edge``) collects by the clock instead
  (:class:`CollectorPacer`, ADR 0170): under load it mostly *replaces*
  objects, which defeats the count that starts a collection, so the
  collections that did come walked 100,000 and more objects at once.
  Its loop runs a young pass every 50 ms and a full one every 30 s, and
  freezes what each full pass leaves (:class:`SurvivorFreezer`): each
  session's gRPC call state and outbox, which live for hours, are then
  walked once, not every time.

Process-wide, so :meth:`InterpreterSettings.apply` returns what undoes it
(a shard started and stopped inside a test leaves the interpreter as it was).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CollectorClock",
    "CollectorPacer",
    "GcPauses",
    "InterpreterSettings",
    "SurvivorFreezer",
]


@dataclass(frozen=True)
class CollectorClock:
    """Collect on a clock instead of by count (:class:`CollectorPacer`; ADR 0170)."""

    # The young generation: what the last interval made and still holds.
    young_s: float = 0.05
    # Everything not frozen; what survives is frozen (SurvivorFreezer).
    full_s: float = 30.0


@dataclass(frozen=True)
class InterpreterSettings:
    """Interpreter-wide settings a shard process applies while it runs (None: leave it)."""

    switch_interval_s: float | None = 0.001
    # New objects tracked before a young collection (Python's default: 700).
    gc_young_threshold: int | None = 7_000
    # Collect, then freeze what survives, once the shard has started.
    freeze_after_start: bool = True
    # Once started, collect by the clock alone (an edge process); None: by count.
    gc_clock: CollectorClock | None = None

    def apply(self) -> Callable[[], None]:
        """Set the switch interval and the collector's threshold; returns the undo."""
        interval = sys.getswitchinterval()
        thresholds = gc.get_threshold()
        enabled = gc.isenabled()
        if self.switch_interval_s is not None:
            sys.setswitchinterval(self.switch_interval_s)
        if self.gc_young_threshold is not None:
            gc.set_threshold(self.gc_young_threshold, *thresholds[1:])
        unhook = SURVIVORS.install() if self.gc_clock is not None else None

        def undo() -> None:
            PACER.stop()
            if unhook is not None:
                unhook()
            sys.setswitchinterval(interval)
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            if enabled:
                gc.enable()

        return undo

    def started(self) -> None:
        """The shard has started: collect once, and freeze the survivors.

        With a ``gc_clock``, the running loop collects from now on
        (:class:`CollectorPacer`) and the collector's own trigger is off.
        """
        if self.freeze_after_start:
            gc.collect()
            gc.freeze()
        if self.gc_clock is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # started outside a loop (a test): counts alone, as before
            return
        SURVIVORS.arm()
        PACER.start(loop, self.gc_clock)


class SurvivorFreezer:
    """Freezes what survives each full collection; thaws when the frozen set has doubled.

    Hooked on ``gc.callbacks`` (:meth:`install`), it does nothing until
    :meth:`arm`, which the process calls once started. From then on, at the
    end of every full collection, whatever survived is frozen
    (``gc.freeze``), so the next full collection walks only the objects
    promoted since: its pause is bounded by what the last seconds made, not
    by everything the process holds.

    Freezing delays one thing: a reference cycle whose objects are frozen
    is not collected while they stay frozen (an object freed by reference
    counting is freed as always). So the frozen set is measured against
    its size when last armed or thawed (``baseline``): once it is more than
    ``growth`` times that, it is thawed (``gc.unfreeze``), the next full
    collection walks everything once, frees any such cycle, and the
    survivors become the new baseline. A process whose live set is steady
    therefore never pays a full walk again, and one that leaks cycles holds
    at most ``growth`` times its live objects before it does.
    """

    def __init__(self, growth: float = 2.0) -> None:
        self.growth = growth
        self.baseline = 0
        self.armed = False
        self.freezes = 0
        self.thaws = 0

    def arm(self) -> None:
        """Start freezing survivors, measured against what is frozen now."""
        self.baseline = gc.get_freeze_count()
        self.armed = True

    def install(self) -> Callable[[], None]:
        """Hook the collector; the returned call unhooks it and disarms."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

        def remove() -> None:
            self.armed = False
            if self._on_gc in gc.callbacks:
                gc.callbacks.remove(self._on_gc)

        return remove

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # After a full collection its lists are settled (the collector updates its
        # long-lived counts before the "stop" callbacks), so moving them is safe here.
        if not self.armed or phase != "stop" or info.get("generation") != 2:
            return
        frozen = gc.get_freeze_count()
        if self.baseline and frozen > self.growth * self.baseline:
            gc.unfreeze()  # the next full collection walks everything once
            self.baseline = 0
            self.thaws += 1
            return
        gc.freeze()
        self.freezes += 1
        if not self.baseline:
            self.baseline = gc.get_freeze_count()


SURVIVORS = SurvivorFreezer()
"""The process's one freezer (the collector is process-wide too)."""


class CollectorPacer:
    """Runs the collector on the loop's clock, so that no pass walks more than a moment's objects.

    Python starts a young collection when the count of tracked objects
    made *less those freed* passes its threshold. An edge under load mostly
    replaces objects: each roll-up's messages and needs free the previous
    one's, which by then sit in an older generation. The count then hovers
    near zero while the young generation fills (an edge serving 2,000
    sessions held 100,732 young objects, its count at 28 against a
    threshold of 7,000), and the collections that do come walk them all:
    its worst pause was 137–210 ms in every 10-s window of a soak, though
    the passes found no garbage (docs/benchmarks.md, "Issue 20: the soak
    says who stalled; the edge collects by the clock").

    So an edge turns the collector's own trigger off (``gc.disable``) and
    its loop collects instead: the young generation every ``young_s``
    (what the last interval made and still holds: about a millisecond),
    and everything every ``full_s``, whose survivors the
    :class:`SurvivorFreezer` freezes, so the next full pass walks only
    what is newer. Objects that survive a young pass wait in the middle
    generation for the full one: freed by reference counting as they are
    replaced, or by the full pass if they form a cycle.
    """

    def __init__(self) -> None:
        self.young = 0
        self.full = 0
        self._handle: asyncio.TimerHandle | None = None
        self._clock = CollectorClock()
        self._next_full = 0.0
        self._trigger_was_on = True

    def start(self, loop: asyncio.AbstractEventLoop, clock: CollectorClock) -> None:
        """Collect on ``loop`` by ``clock`` until :meth:`stop` (the trigger off meanwhile)."""
        self.stop()
        self._clock = clock
        self._next_full = loop.time() + clock.full_s
        self._trigger_was_on = gc.isenabled()
        gc.disable()
        self._handle = loop.call_later(clock.young_s, self._tick, loop)

    def stop(self) -> None:
        """No more passes; the collector's own trigger is as it was before :meth:`start`."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            if self._trigger_was_on:
                gc.enable()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() >= self._next_full:
            gc.collect()
            self.full += 1
            self._next_full = loop.time() + self._clock.full_s
        else:
            gc.collect(0)
            self.young += 1
        self._handle = loop.call_later(self._clock.young_s, self._tick, loop)


PACER = CollectorPacer()
"""The process's one pacer."""


class GcPauses:
    """The cyclic collector's pauses in this process: their total, and the longest lately.

    A pause holds the interpreter: every loop of the process stalls for it.
    :meth:`install` hooks ``gc.callbacks`` and returns what unhooks it.
    """

    def __init__(self) -> None:
        self.total_s = 0.0
        self.count = 0
        self._worst_s = 0.0
        self._started = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            pause = time.perf_counter() - self._started
            self._started = 0.0
            self.total_s += pause
            self.count += 1
            self._worst_s = max(self._worst_s, pause)

    def install(self) -> Callable[[], None]:
        gc.callbacks.append(self._on_gc)

        def remove() -> None:
            if self._on_gc in gc.callbacks:
                gc.callbacks.remove(self._on_gc)

        return remove

    def take_worst(self) -> float:
        """The longest pause since the last call (0 if none)."""
        worst, self._worst_s = self._worst_s, 0.0
        return worst
