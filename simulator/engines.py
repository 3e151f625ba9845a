"""The shards' engines, in this process or spread over worker processes.

The BigFleet policy never holds a ``ShardEngine`` itself: it sends every
engine call through :class:`Engines` as an *operation* (a module-level
function of this file taking the engine first). Each engine sees its calls
in exactly the order the policy issued them, with the same arguments, so it
decides exactly as if it were called directly; what differs between the two
implementations is only where the engine lives:

* :class:`LocalEngines` calls the engine at once (the default; tests);
* :class:`WorkerEngines` forks worker processes after the fleet is built,
  each of which loads and keeps the engines of some shards (shard ``i`` on
  worker ``i mod workers``) and serves their operations in order.

Three ways to call, by what the caller needs back::

    post(shard, op, *args)              fire and forget (upsert, settle, remove)
    post(shard, op, *args, then=f)      f(result) runs before the next call returns
                                        (in posting order per shard, not across shards)
    call(shard, op, *args)              wait for the result
    call_each(shards, op, *args)        start op on every shard, yield results in shard order

``call_each`` is what makes the workers pay: the 20 shards' cycles run on
both cores at once while the caller carries out the first shard's plan. Ops
posted between two calls are sent in batches; a worker answers only the ops
that want an answer, in order, once per batch, from a sender thread (so a
worker never blocks on a full pipe while the caller is blocked sending to
it).

Why the engines are independent between calls (so this is safe): the
engines share nothing; the provider cores, the cluster models and the
coordinator stay in the calling process, and every provider call is still
made there, in the order the sequential loop made it (ADR 0085).
"""

from __future__ import annotations

import abc
import contextlib
import gc
import multiprocessing
import os
import queue
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from bigfleet.shard import choices, supply
from bigfleet.shard.choices import CrossShardVictim, TransferProfile, VictimTerms
from bigfleet.shard.convert import InvalidRollup, rollup_from_wire
from bigfleet.shard.supply import Free, ProfileKey, profile_key
from bigfleet.v1alpha1 import capacity_pb2
from shard_engine.catalog import Profile
from shard_engine.coordination import ProfileSupply, RemoteIdle, RemoteWant
from shard_engine.engine import EngineConfig, RollupRejected, ShardEngine
from shard_engine.model import Action, MachineRecord, MachineState, Need, Shortfall
from shard_engine.report_news import ReportNews

__all__ = [
    "Applied",
    "EngineHandle",
    "Engines",
    "Loader",
    "LocalEngines",
    "Result",
    "SupplyChanges",
    "SupplyMirror",
    "WorkerEngines",
    "WorkerFailed",
    "apply_wire",
    "busy",
    "cycle",
    "default_workers",
    "donations",
    "free_supply",
    "free_supply_changes",
    "in_flight",
    "lacking",
    "machines",
    "needs_of",
    "promised",
    "remove",
    "settle",
    "shortfalls",
    "upsert",
    "victims",
]

Op = Callable[..., Any]
Loader = Callable[[Sequence[str]], dict[str, ShardEngine]]
"""Builds the engines of the given shards (runs in the worker, after the fork)."""


@dataclass(frozen=True, slots=True)
class Result:
    """What a posted operation returned."""

    value: Any


def default_workers(shards: int) -> int:
    """Worker processes for ``shards`` engines: one per core, at most one per shard (1: none).

    1 where processes cannot be forked (the workers inherit the fleet).
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(shards, os.cpu_count() or 1))


# -- operations (run where the engine lives) --------------------------------------------
def upsert(engine: ShardEngine, record: MachineRecord, now: float, need_key: str = "") -> None:
    """``upsert_machine``."""
    engine.upsert_machine(record, now=now, need_key=need_key)


def settle(engine: ShardEngine, machine_id: str, record: MachineRecord | None, now: float) -> None:
    """``settle``."""
    engine.settle(machine_id, record, now=now)


def remove(engine: ShardEngine, machine_id: str) -> None:
    """``remove_machine``."""
    engine.remove_machine(machine_id)


@dataclass(frozen=True, slots=True)
class Applied:
    """What became of a roll-up: the engine's status and the needs, or why it was refused."""

    status: str  # applied | stale | quarantined | rejected
    needs: tuple[Need, ...] = ()
    reason: str = ""


def apply_wire(
    engine: ShardEngine, body: bytes, cluster_id: str, timestamp_ns: int, now: float
) -> Applied:
    """Convert a serialised roll-up, stamped ``timestamp_ns``, and apply it (the Session's path)."""
    msg = capacity_pb2.ClusterCapacityNeeds.FromString(body)
    msg.timestamp_unix_nanos = timestamp_ns
    try:
        rollup = rollup_from_wire(msg, session_cluster=cluster_id)
        outcome = engine.apply_rollup(engine.validate(rollup, now=now), now=now)
    except (InvalidRollup, RollupRejected) as err:
        return Applied("rejected", reason=str(err))
    return Applied(outcome.status, rollup.needs)


def needs_of(engine: ShardEngine, cluster_id: str) -> tuple[Need, ...]:
    """``needs_of``: the needs in force for one cluster."""
    return engine.needs_of(cluster_id)


def machines(engine: ShardEngine) -> tuple[MachineRecord, ...]:
    """Every machine of the engine."""
    return tuple(engine.machines())


def serving_priorities(engine: ShardEngine) -> dict[str, int]:
    """``serving_priorities``: what each bound machine serves now."""
    return engine.serving_priorities()


def in_flight(engine: ShardEngine) -> dict[str, str]:
    """``in_flight``."""
    return dict(engine.in_flight())


def promised(engine: ShardEngine) -> dict[str, str]:
    """``promised``."""
    return dict(engine.promised())


def lacking(engine: ShardEngine) -> tuple[tuple[Shortfall, Need | None], ...]:
    """The last cycle's shortfalls, each with the need in force it is about (the report's)."""
    out = []
    for sf in engine.shortfalls():
        need = next((n for n in engine.needs_of(sf.cluster_id) if n.key == sf.need_key), None)
        out.append((sf, need))
    return tuple(out)


def fleet_idle(
    engine: ShardEngine, offers: tuple[RemoteIdle, ...], wants: tuple[RemoteWant, ...] = ()
) -> None:
    """The other shards' idle machines and shortfalls, this round (``set_fleet_idle``)."""
    engine.set_fleet_idle(offers, wants)


def cycle(engine: ShardEngine, now: float) -> tuple[Action, ...]:
    """One cycle; its actions."""
    return engine.cycle(now=now).actions


def shortfalls(engine: ShardEngine) -> tuple[Shortfall, ...]:
    """The last cycle's shortfalls."""
    return engine.shortfalls()


#: Per engine, what its shard last told the coordinator (production's reporter keeps one).
_NEWS: weakref.WeakKeyDictionary[ShardEngine, ReportNews] = weakref.WeakKeyDictionary()


def _news(engine: ShardEngine, gap_s: float) -> ReportNews:
    news = _NEWS.get(engine)
    if news is None or news.gap_s != gap_s:
        news = _NEWS[engine] = ReportNews(gap_s=gap_s)
    return news


def report_due(engine: ShardEngine, now: float, gap_s: float) -> bool:
    """Whether the shard would report now, between intervals (``ReportNews.due``)."""
    return _news(engine, gap_s).due(engine.shortfalls(), engine.free_counters()[1], now)


def report_sent(engine: ShardEngine, now: float, gap_s: float) -> None:
    """The shard reported at ``now`` what its engine holds (``ReportNews.sent``)."""
    _news(engine, gap_s).sent(engine.shortfalls(), engine.free_counters()[1], now)


def free_supply(engine: ShardEngine) -> tuple[ProfileSupply, ...]:
    """Idle and speculative supply per profile, from its counters (``supply.free_supply``)."""
    return supply.free_supply(engine.free_by_profile())


class SupplyChanges(NamedTuple):
    """How a shard's free supply differs from what its caller was last told."""

    #: (key, sample, idle, speculative); ``sample`` is None when it is the one sent before.
    changed: tuple[tuple[ProfileKey, Profile | None, int, int], ...]
    removed: tuple[ProfileKey, ...]


class _FreeFeed:
    """What :func:`free_supply_changes` last answered for one engine, and how it reads it."""

    def __init__(self) -> None:
        self.keys: list[ProfileKey] = []  # per profile index, its report key
        self.indices: dict[ProfileKey, list[int]] = {}  # per key, its profile indices
        empty = np.zeros(0, dtype=np.int64)
        self.counters: tuple[npt.NDArray[np.int64], ...] = (empty, empty, empty)
        self.sent: dict[ProfileKey, Free] = {}

    def changed_keys(self, engine: ShardEngine) -> set[ProfileKey]:
        """Keys of the profiles whose counters moved since the last call."""
        counters = engine.free_counters()
        size = len(counters[0])
        for index in range(len(self.keys), size):
            key = profile_key(engine.profile_at(index))
            self.keys.append(key)
            self.indices.setdefault(key, []).append(index)
        moved = np.zeros(size, dtype=bool)
        for now, before in zip(counters, self.counters, strict=True):
            grown = np.zeros(size, dtype=np.int64)
            grown[: len(before)] = before
            moved |= now != grown
        self.counters = counters
        return {self.keys[int(i)] for i in np.flatnonzero(moved)}

    def free(self, engine: ShardEngine, key: ProfileKey) -> Free | None:
        """The key's entry as ``supply.free_counts`` adds it up; None when the shard has none."""
        members, idle, speculative = self.counters
        held = [i for i in self.indices[key] if members[i] > 0]
        if not held:
            return None
        return Free(
            engine.profile_at(held[0]),
            int(sum(int(idle[i]) for i in held)),
            int(sum(int(speculative[i]) for i in held)),
        )


#: Per engine, what :func:`free_supply_changes` last answered.
_FEEDS: weakref.WeakKeyDictionary[ShardEngine, _FreeFeed] = weakref.WeakKeyDictionary()


def free_supply_changes(engine: ShardEngine) -> SupplyChanges:
    """:func:`free_supply` as changes since the last call (a :class:`SupplyMirror` rebuilds it).

    A coordinator round asks every shard for its supply every 30 virtual
    seconds; a shard holds a few hundred profile keys and most of them do
    not move between rounds, so building and sending them all cost the
    engine workers about as much as their cycles at 20 shards. Only the keys
    of profiles whose counters moved are added up again (by the rule of
    ``supply.free_counts``: the first held profile of a key is its sample).
    """
    feed = _FEEDS.get(engine)
    if feed is None:
        feed = _FEEDS[engine] = _FreeFeed()
    changed: list[tuple[ProfileKey, Profile | None, int, int]] = []
    removed: list[ProfileKey] = []
    for key in sorted(feed.changed_keys(engine)):
        old, free = feed.sent.get(key), feed.free(engine, key)
        if free is None:
            if old is not None:
                removed.append(key)
                del feed.sent[key]
            continue
        if old is None or old.sample is not free.sample:
            changed.append((key, free.sample, free.idle, free.speculative))
        elif old.idle != free.idle or old.speculative != free.speculative:
            changed.append((key, None, free.idle, free.speculative))
        feed.sent[key] = free
    return SupplyChanges(tuple(changed), tuple(removed))


class SupplyMirror:
    """The caller's copy of one shard's free supply, kept by :func:`free_supply_changes`.

    ``apply`` returns what :func:`free_supply` would have returned: the same
    entries (by ``supply.free_entry``), sorted by key. An unchanged entry is
    the very object of the last round.
    """

    def __init__(self) -> None:
        self._samples: dict[ProfileKey, Profile] = {}
        self._entries: dict[ProfileKey, ProfileSupply] = {}
        self._supply: tuple[ProfileSupply, ...] = ()

    def apply(self, changes: SupplyChanges) -> tuple[ProfileSupply, ...]:
        if not changes.changed and not changes.removed:
            return self._supply
        added = bool(changes.removed)
        for key in changes.removed:
            del self._entries[key]
            del self._samples[key]
        for key, sample, idle, speculative in changes.changed:
            if sample is None:
                sample = self._samples[key]
            else:
                added = added or key not in self._samples
                self._samples[key] = sample
            self._entries[key] = supply.free_entry(key, Free(sample, idle, speculative))
        if added:
            self._entries = dict(sorted(self._entries.items()))
        self._supply = tuple(self._entries.values())
        return self._supply


def busy(engine: ShardEngine) -> frozenset[str]:
    """Machines in flight or promised (not to be given away)."""
    return frozenset(choices.busy(engine))


def donations(
    engine: ShardEngine,
    profile: TransferProfile,
    state: MachineState,
    count: int,
    extra_busy: frozenset[str],
) -> tuple[MachineRecord, ...]:
    """The donor's choice (``bigfleet.shard.choices.donations``, as production's)."""
    return choices.donations(
        engine, profile=profile, state=state, count=count, extra_busy=extra_busy
    )


def victims(
    engine: ShardEngine,
    profile: TransferProfile,
    below_priority: int,
    count: int,
    extra_busy: frozenset[str],
    priorities: Mapping[str, int],
    terms: Mapping[str, VictimTerms],
    config: EngineConfig,
) -> list[CrossShardVictim]:
    """The donor's victims (``bigfleet.shard.choices.victims``, as production's)."""
    return list(
        choices.victims(
            engine,
            profile=profile,
            below_priority=below_priority,
            count=count,
            priorities=priorities,
            terms=terms,
            config=config,
            extra_busy=extra_busy,
        )
    )


# -- where the engines live ---------------------------------------------------------------
class Engines(abc.ABC):
    """The shards' engines (see the module docstring)."""

    @abc.abstractmethod
    def post(
        self, shard_id: str, op: Op, *args: Any, then: Callable[[Result], None] | None = None
    ) -> None:
        """Run ``op`` on the shard's engine after every call posted before; ``then`` its result."""

    @abc.abstractmethod
    def call(self, shard_id: str, op: Op, *args: Any) -> Any:
        """Run ``op`` on the shard's engine and return its result."""

    @abc.abstractmethod
    def call_each(self, shard_ids: Iterable[str], op: Op, *args: Any) -> Iterator[Any]:
        """Run ``op`` on every shard (in parallel where it can); results in ``shard_ids`` order."""

    def cpu_seconds(self) -> float:
        """CPU time of the worker processes so far (0 without workers)."""
        return 0.0

    def close(self) -> None:  # noqa: B027 (nothing to stop without workers)
        """Stop the workers (if any); raises the first failure of a posted operation."""


class LocalEngines(Engines):
    """Every engine in this process, called at once."""

    def __init__(self, engines: dict[str, ShardEngine]) -> None:
        self._engines = engines

    def post(
        self, shard_id: str, op: Op, *args: Any, then: Callable[[Result], None] | None = None
    ) -> None:
        value = op(self._engines[shard_id], *args)
        if then is not None:
            then(Result(value))

    def call(self, shard_id: str, op: Op, *args: Any) -> Any:
        return op(self._engines[shard_id], *args)

    def call_each(self, shard_ids: Iterable[str], op: Op, *args: Any) -> Iterator[Any]:
        for shard_id in shard_ids:
            yield op(self._engines[shard_id], *args)


class WorkerFailed(RuntimeError):
    """An operation failed in a worker process (the message carries its traceback)."""


_BATCH = 1024  # posted ops sent in one message at most (besides every call)


@dataclass(slots=True)
class _Worker:
    """One worker process as the caller sees it.

    The caller writes batches of operations itself; a worker answers once
    per batch (every answer the batch produced, in order) from its own
    sender thread, so it always goes back to reading and a write of the
    caller never waits on a worker that waits on the caller. There is no
    thread on the caller's side: on a loaded machine every hand-over of the
    interpreter lock between threads waits for the other thread to be
    scheduled, which cost the caller a quarter of its time when it sent
    from a thread.
    """

    conn: Connection
    process: multiprocessing.process.BaseProcess
    outbox: list[tuple[str, Op, tuple[Any, ...], bool]] = field(default_factory=list)
    handlers: deque[Callable[[Result], None]] = field(default_factory=deque)
    inbox: deque[tuple[bool, Any]] = field(default_factory=deque)
    failed: bool = False  # an answer was a failure (raised to the caller already)

    def flush(self) -> None:
        if self.outbox:
            self.conn.send(self.outbox)
            self.outbox = []

    def receive_one(self) -> None:
        if not self.inbox:
            self.inbox.extend(self.conn.recv())
        ok, value = self.inbox.popleft()
        handler = self.handlers.popleft()
        if not ok:
            self.failed = True
            raise WorkerFailed(value)
        handler(Result(value))

    def stop(self) -> None:
        """Tell the worker to stop after everything sent."""
        with contextlib.suppress(OSError):
            self.conn.send(None)


class WorkerEngines(Engines):
    """Engines in ``workers`` forked processes; shard ``i`` of ``shard_ids`` on worker ``i mod n``.

    Forks (the engines are built in the workers by ``load``, from what this
    process holds at the fork), so it needs the ``fork`` start method (Linux).
    """

    def __init__(self, shard_ids: Sequence[str], load: Loader, *, workers: int) -> None:
        context = multiprocessing.get_context("fork")
        self._workers: list[_Worker] = []
        self._where: dict[str, _Worker] = {}
        gc.freeze()  # the children would otherwise copy every page the collector touches
        try:
            for w in range(workers):
                mine = [s for i, s in enumerate(shard_ids) if i % workers == w]
                parent, child = context.Pipe()
                process = context.Process(
                    target=_serve, args=(child, load, mine), name=f"sim-engines-{w}", daemon=True
                )
                try:
                    process.start()
                finally:
                    child.close()
                worker = _Worker(parent, process)
                self._workers.append(worker)
                for s in mine:
                    self._where[s] = worker
        finally:
            gc.unfreeze()
        try:
            self.cpu_seconds()  # wait until every worker has loaded its engines
        except BaseException:
            self._stop()
            raise

    def post(
        self, shard_id: str, op: Op, *args: Any, then: Callable[[Result], None] | None = None
    ) -> None:
        worker = self._where[shard_id]
        worker.outbox.append((shard_id, op, args, then is not None))
        if then is not None:
            worker.handlers.append(then)
        if len(worker.outbox) >= _BATCH:
            worker.flush()

    def call(self, shard_id: str, op: Op, *args: Any) -> Any:
        return next(self.call_each([shard_id], op, *args))

    def call_each(self, shard_ids: Iterable[str], op: Op, *args: Any) -> Iterator[Any]:
        slots: list[tuple[_Worker, list[Result]]] = []
        for shard_id in shard_ids:
            box: list[Result] = []
            self.post(shard_id, op, *args, then=box.append)
            slots.append((self._where[shard_id], box))
        for worker in self._workers:
            worker.flush()
        for worker, box in slots:
            worker.flush()  # ops the caller posted since (e.g. settles from the last plan)
            while not box:
                worker.receive_one()
            yield box[0].value

    def cpu_seconds(self) -> float:
        """Every worker's CPU time so far (a round trip to each; a failed op surfaces here)."""
        firsts = {id(w): s for s, w in reversed(self._where.items())}
        return float(sum(self.call_each(firsts.values(), _cpu_seconds)))

    def close(self) -> None:
        """Collect every pending answer, then stop the workers; again is a no-op."""
        if not self._workers:
            return
        try:
            if not any(w.failed for w in self._workers):  # else it was raised already
                self.cpu_seconds()  # flushes every outbox, receives every answer before its own
        finally:
            self._stop()

    def _stop(self) -> None:
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join()
            worker.conn.close()
        self._workers = []


class EngineHandle:
    """One shard's engine as :class:`ShardState` sees it, wherever it lives.

    Changes are posted (the engine sees them in order before its next call);
    a machine's record is read from its provider core, which is what the
    engine last observed (the simulator folds every settled state change into
    the engine before the next cycle). The other reads are round trips, made
    only by the rare coordinator instruction.
    """

    def __init__(
        self,
        engines: Callable[[], Engines],
        shard_id: str,
        record: Callable[[str, str], MachineRecord],
        owner: Callable[[str], str | None],
    ) -> None:
        self._engines = engines
        self._shard_id = shard_id
        self._record = record  # (provider, machine) -> the provider core's record
        self._owner = owner

    def machine(self, machine_id: str) -> MachineRecord | None:
        provider = self._owner(machine_id)
        return None if provider is None else self._record(provider, machine_id)

    def machines(self) -> Iterator[MachineRecord]:
        return iter(self._engines().call(self._shard_id, machines))

    def needs_of(self, cluster_id: str) -> tuple[Need, ...]:
        needs: tuple[Need, ...] = self._engines().call(self._shard_id, needs_of, cluster_id)
        return needs

    def serving_priorities(self) -> Mapping[str, int]:
        served: dict[str, int] = self._engines().call(self._shard_id, serving_priorities)
        return served

    def in_flight(self) -> Mapping[str, str]:
        flights: dict[str, str] = self._engines().call(self._shard_id, in_flight)
        return flights

    def promised(self) -> Mapping[str, str]:
        promises: dict[str, str] = self._engines().call(self._shard_id, promised)
        return promises

    def upsert_machine(self, record: MachineRecord, *, now: float, need_key: str = "") -> None:
        self._engines().post(self._shard_id, upsert, record, now, need_key)

    def settle(self, machine_id: str, record: MachineRecord | None, *, now: float) -> None:
        self._engines().post(self._shard_id, settle, machine_id, record, now)

    def remove_machine(self, machine_id: str) -> None:
        self._engines().post(self._shard_id, remove, machine_id)


def _cpu_seconds(engine: ShardEngine) -> float:
    """The worker process's CPU time (user + system)."""
    return time.process_time()


def _serve(conn: Connection, load: Loader, shard_ids: Sequence[str]) -> None:
    """A worker: build its engines, then run operations in order until told to stop.

    Answers leave once per batch, from a thread: the loop never blocks on a
    write, so the caller's writes always drain.
    """
    answers: queue.SimpleQueue[list[tuple[bool, Any]] | None] = queue.SimpleQueue()

    def send() -> None:
        while (batch := answers.get()) is not None:
            conn.send(batch)

    sender = threading.Thread(target=send, name="answers", daemon=True)
    sender.start()
    failure: str | None = None
    try:
        engines = load(shard_ids)
    except Exception:
        failure = traceback.format_exc()
        engines = {}
    while (batch := conn.recv()) is not None:
        out: list[tuple[bool, Any]] = []
        for shard_id, op, args, wants_answer in batch:
            if failure is not None:
                if wants_answer:
                    out.append((False, failure))
                continue
            try:
                value = op(engines[shard_id], *args)
            except Exception:
                failure = f"shard {shard_id}, {op.__name__}:\n{traceback.format_exc()}"
                if wants_answer:
                    out.append((False, failure))
                continue
            if wants_answer:
                out.append((True, value))
        if out:
            answers.put(out)
    answers.put(None)
    sender.join()
    conn.close()
