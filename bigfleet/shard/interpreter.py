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
  less often and a full one less often still (each young collection walks
  at most that many new objects: about a millisecond).

Process-wide, so :meth:`InterpreterSettings.apply` returns what undoes it
(a shard started and stopped inside a test leaves the interpreter as it was).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["GcPauses", "InterpreterSettings"]


@dataclass(frozen=True)
class InterpreterSettings:
    """Interpreter-wide settings a shard process applies while it runs (None: leave it)."""

    switch_interval_s: float | None = 0.001
    # New objects tracked before a young collection (Python's default: 700).
    gc_young_threshold: int | None = 7_000
    # Collect, then freeze what survives, once the shard has started.
    freeze_after_start: bool = True

    def apply(self) -> Callable[[], None]:
        """Set the switch interval and the collector's threshold; returns the undo."""
        interval = sys.getswitchinterval()
        thresholds = gc.get_threshold()
        if self.switch_interval_s is not None:
            sys.setswitchinterval(self.switch_interval_s)
        if self.gc_young_threshold is not None:
            gc.set_threshold(self.gc_young_threshold, *thresholds[1:])

        def undo() -> None:
            sys.setswitchinterval(interval)
            gc.set_threshold(*thresholds)
            gc.unfreeze()

        return undo

    def started(self) -> None:
        """The shard has started: collect once, and freeze the survivors."""
        if self.freeze_after_start:
            gc.collect()
            gc.freeze()


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
