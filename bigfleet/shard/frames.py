"""The frames between a shard's edge processes and its engine process.

    frame   = header · body
    header  = body length (4 bytes, big-endian) · kind (1 byte)
    body    = a tuple of plain values (str, int, float, bytes, None, tuple,
              dict, frozenset), in ``marshal``'s format

The channel is local (a Unix-domain socket) and both ends run the same code,
so the body needs no schema of its own: ``marshal`` writes and reads plain
values in C, several times faster than a protobuf message built field by
field in Python. What a roll-up frame carries is the *validated* value —
the cluster, its stamp, and its needs already merged and normalised, each
with its key — never the wire's message, so the engine applies it without
judging it again (``ValidatedRollup.relayed``). A cluster that re-sends the
needs it sent last gets a frame without needs (``needs`` is ``None``): the
engine reuses the ones it has. Why-not (``ShardRead/InspectNeeds``) asked
of an edge travels the same way: an ``INSPECT`` frame with the question, an
``INSPECTED`` frame with the engine's :class:`~shard_engine.verdicts.Inspection`
as plain values (``inspection_body``), which the edge turns into the wire's
messages with the very code a shard without edges uses.

Every decoding failure is a :class:`FrameError` that says which frame and
what was wrong: a peer sending one is a bug in this code, and the link ends.
"""

from __future__ import annotations

import asyncio
import marshal
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from shard_engine.model import (
    AppClass,
    Need,
    Operator,
    Requirement,
    TopologySpread,
    WhenUnsatisfiable,
)
from shard_engine.needs import ValidatedRollup
from shard_engine.verdicts import Inspection, MatchingSupply, NeedVerdict

__all__ = [
    "HEADER",
    "MAX_BODY",
    "VERSION",
    "EdgeLoad",
    "FrameError",
    "Kind",
    "RelayedRollup",
    "decode",
    "encode",
    "inspection_body",
    "inspection_from_body",
    "load_body",
    "load_from_body",
    "need_from_tuple",
    "need_to_tuple",
    "read_frame",
    "rollup_body",
    "rollup_from_body",
]

VERSION = 3
"""The frames' version: an edge and an engine of different versions refuse each other.

2: INSPECT and INSPECTED (why-not asked of an edge).
3: LOAD (an edge's loop, collector and shed sessions, for the engine's metrics).
"""

HEADER = struct.Struct(">IB")
"""Body length, then kind."""

MAX_BODY = 64 * 1024 * 1024
"""Longest body accepted (a roll-up of 10,000 needs is about 2 MB)."""

_MARSHAL_VERSION = 4


class FrameError(ValueError):
    """A frame that cannot be read: what was wrong with it, and which kind it was."""


class Kind(IntEnum):
    """What a frame says. Edge to engine below 20, engine to edge from 20."""

    # edge -> engine
    JOIN = 1  # (version, edge index, listening address, open clusters)
    ADMIT = 2  # (request id, cluster): may a Hello of this cluster open a session?
    ROLLUP = 3  # see rollup_body
    SETTLED = 4  # ((outcome, count), ...): acknowledged roll-ups the edge settled itself
    OPENED = 5  # (cluster,): a session's Hello was acknowledged
    CLOSED = 6  # (cluster,): the cluster's session ended
    BOOTSTRAP_ANSWER = 7  # (request id, user data, ttl s, error, unavailable)
    INSPECT = 8  # (request id, cluster or '' for all, limit): why-not (ShardRead/InspectNeeds)
    LOAD = 9  # see load_body: the edge's loop lag and busy share, GC pauses, sessions shed
    # engine -> edge
    WELCOME = 20  # (version, coordinator term, lease epoch)
    ADMITTED = 21  # (request id, verdict, message, shard id, address)
    SEND = 22  # (cluster, ShardMessage bytes, coalescing key)
    BOOTSTRAP = 23  # (request id, cluster, ShardMessage bytes, wait s)
    EVICT = 24  # (cluster, shard id, address): the cluster moved to that shard
    CLOSE_ALL = 25  # (unavailable message or None,)
    STAMPS = 26  # (coordinator term, lease epoch) for every acknowledgement
    DEFER = 27  # (cluster, reason): its roll-ups are deferred ('' when no longer)
    STOP = 28  # (): the engine stops for good; the edge closes its sessions and ends
    INSPECTED = 29  # (request id, inspection_body or None, error): the answer to INSPECT


_ARITY = {
    Kind.JOIN: 4,
    Kind.ADMIT: 2,
    Kind.ROLLUP: 6,
    Kind.SETTLED: 1,
    Kind.OPENED: 1,
    Kind.CLOSED: 1,
    Kind.BOOTSTRAP_ANSWER: 5,
    Kind.INSPECT: 3,
    Kind.LOAD: 6,
    Kind.WELCOME: 3,
    Kind.ADMITTED: 5,
    Kind.SEND: 3,
    Kind.BOOTSTRAP: 4,
    Kind.EVICT: 3,
    Kind.CLOSE_ALL: 1,
    Kind.STAMPS: 2,
    Kind.DEFER: 2,
    Kind.STOP: 0,
    Kind.INSPECTED: 3,
}


def encode(kind: Kind, body: tuple[Any, ...]) -> bytes:
    """One frame: header and body."""
    data = marshal.dumps(body, _MARSHAL_VERSION)
    if len(data) > MAX_BODY:
        raise FrameError(f"{kind.name} frame: body of {len(data)} bytes, at most {MAX_BODY}")
    return HEADER.pack(len(data), kind) + data


def decode(kind: int, data: bytes) -> tuple[Kind, tuple[Any, ...]]:
    """A frame's kind and body from its header's kind byte and its body bytes."""
    try:
        known = Kind(kind)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind} ({len(data)}-byte body)") from None
    try:
        body = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as err:
        raise FrameError(f"{known.name} frame: the body does not decode: {err}") from None
    if not isinstance(body, tuple):
        raise FrameError(f"{known.name} frame: the body is a {type(body).__name__}, not a tuple")
    if len(body) != _ARITY[known]:
        raise FrameError(f"{known.name} frame: {len(body)} fields, expected {_ARITY[known]}")
    return known, body


async def read_frame(reader: asyncio.StreamReader) -> tuple[Kind, tuple[Any, ...]] | None:
    """The next frame, or None when the peer closed the channel between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise FrameError(
            f"the channel ended inside a frame header ({len(err.partial)} of {HEADER.size} bytes)"
        ) from None
    length, kind = HEADER.unpack(header)
    if length > MAX_BODY:
        raise FrameError(f"frame kind {kind}: body of {length} bytes, at most {MAX_BODY}")
    try:
        data = await reader.readexactly(length)
    except asyncio.IncompleteReadError as err:
        raise FrameError(
            f"frame kind {kind}: the channel ended after {len(err.partial)} of {length} body bytes"
        ) from None
    return decode(kind, data)


# ------------------------------------------------------------------ needs

_APP_CLASSES = {a.value: a for a in AppClass}


def need_to_tuple(need: Need) -> tuple[Any, ...]:
    """A validated need as plain values (``need_from_tuple`` reverses it)."""
    return (
        tuple((r.key, int(r.operator), r.values) for r in need.requirements),
        dict(need.aggregate),
        need.priority,
        dict(need.min_unit),
        tuple((s.topology_key, s.max_skew, int(s.when_unsatisfiable)) for s in need.spread),
        need.interruption_penalty,
        need.reclamation_penalty,
        need.app_class.value,
        need.do_not_disrupt_seconds,
        need.gang,
        need.gang_name,
    )


def need_from_tuple(values: tuple[Any, ...], frame: str = "ROLLUP") -> Need:
    """The need ``need_to_tuple`` wrote; raises ``FrameError`` (naming ``frame``) when the
    values do not fit."""
    try:
        reqs, aggregate, priority, unit, spread, ipen, rpen, app, dnd, gang, name = values
        return Need(
            requirements=tuple(Requirement(k, Operator(op), tuple(v)) for k, op, v in reqs),
            aggregate=dict(aggregate),
            priority=int(priority),
            min_unit=dict(unit),
            spread=tuple(TopologySpread(k, int(s), WhenUnsatisfiable(w)) for k, s, w in spread),
            interruption_penalty=float(ipen),
            reclamation_penalty=float(rpen),
            app_class=_APP_CLASSES[app],
            do_not_disrupt_seconds=float(dnd),
            gang=int(gang),
            gang_name=str(name),
        )
    except (TypeError, ValueError, KeyError) as err:
        raise FrameError(f"{frame} frame: a need does not decode: {err!r}") from None


# --------------------------------------------------------------- roll-ups


@dataclass(frozen=True, slots=True)
class RelayedRollup:
    """A roll-up frame, decoded: what the edge validated, as the engine receives it.

    ``needs`` is the roll-up's needs by key, merged and normalised, or
    ``None`` when they are the ones the edge relayed last for the cluster.
    ``replay`` marks a roll-up acknowledged before the engine (re)connected,
    resent so that the engine's table starts from it (not counted again).
    """

    cluster_id: str
    timestamp_ns: int
    reported_nodes: frozenset[str] | None
    release: frozenset[str] | None
    needs: Mapping[str, Need] | None
    replay: bool = False


def rollup_body(
    validated: ValidatedRollup,
    *,
    unchanged: bool,
    replay: bool = False,
    memo: dict[str, tuple[Need, tuple[Any, ...]]] | None = None,
) -> tuple[Any, ...]:
    """The ROLLUP frame's body for a validated roll-up (its needs left out when ``unchanged``).

    ``memo`` (the cluster's, by need key, kept for one engine connection)
    holds each need's values as last written: a need with the same values
    as last time is written as ``(key, None)`` ("as before"), so the frame
    carries only what changed and the engine rebuilds only that.
    """
    rollup = validated.rollup
    needs: tuple[tuple[str, tuple[Any, ...] | None], ...] | None = None
    if not unchanged:
        items: list[tuple[str, tuple[Any, ...] | None]] = []
        for key, need in validated.merged.items():
            known = memo.get(key) if memo is not None else None
            if known is not None and known[0] is need:
                items.append((key, None))
                continue
            values = need_to_tuple(need)
            if memo is not None:
                memo[key] = (need, values)
                if known is not None and known[1] == values:
                    items.append((key, None))
                    continue
            items.append((key, values))
        needs = tuple(items)
        if memo is not None and len(memo) > len(items):
            for key in [k for k in memo if k not in validated.merged]:
                del memo[key]
    return (
        rollup.cluster_id,
        rollup.timestamp_ns,
        rollup.reported_nodes,
        rollup.release,
        needs,
        replay,
    )


def _names(value: Any, field: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, frozenset) or not all(isinstance(v, str) for v in value):
        raise FrameError(f"ROLLUP frame: {field} is not a set of names: {type(value).__name__}")
    return value


def rollup_from_body(
    body: tuple[Any, ...], memo: dict[str, tuple[tuple[Any, ...], Need]] | None = None
) -> RelayedRollup:
    """A ROLLUP frame's body, decoded and type-checked (not judged: the edge did that).

    ``memo`` (the cluster's, by need key) keeps the needs built from earlier
    frames: a need sent ``(key, None)`` ("as before") is that very object,
    so the engine's table sees it unchanged at once and nothing is rebuilt.
    Without a memo, or with a key it does not hold, "as before" is an error.
    """
    cluster, stamp, reported, release, needs, replay = body
    if not isinstance(cluster, str) or not cluster:
        raise FrameError(f"ROLLUP frame: cluster id is not a non-empty string: {cluster!r}")
    if type(stamp) is not int:
        raise FrameError(f"ROLLUP frame: timestamp is not an integer: {stamp!r}")
    merged: dict[str, Need] | None = None
    if needs is not None:
        if not isinstance(needs, tuple):
            raise FrameError(f"ROLLUP frame: needs are a {type(needs).__name__}, not a tuple")
        merged = {}
        for item in needs:
            if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
                raise FrameError(f"ROLLUP frame: a need is not (key, values): {item!r:.80}")
            key, values = item
            if values is None:
                known = memo.get(key) if memo is not None else None
                if known is None:
                    raise FrameError(f"ROLLUP frame: need {key} is 'as before' but none was")
                merged[key] = known[1]
                continue
            need = need_from_tuple(values)
            merged[key] = need
            if memo is not None:
                memo[key] = (values, need)
        if memo is not None and len(memo) > len(merged):
            for key in [k for k in memo if k not in merged]:
                del memo[key]
    return RelayedRollup(
        cluster,
        stamp,
        _names(reported, "reported nodes"),
        _names(release, "release"),
        merged,
        bool(replay),
    )


# ---------------------------------------------------------------- why-not


def _amounts(values: Mapping[str, float]) -> dict[str, float]:
    return {str(name): float(amount) for name, amount in values.items()}


def _verdict_to_tuple(verdict: NeedVerdict) -> tuple[Any, ...]:
    matching = verdict.matching
    return (
        str(verdict.cluster_id),
        str(verdict.need_key),
        need_to_tuple(verdict.need),
        float(verdict.arrival_seconds),
        str(verdict.fingerprint),
        bool(verdict.satisfied),
        _amounts(verdict.deficit),
        int(verdict.claimed),
        int(verdict.from_idle),
        int(verdict.from_speculative),
        str(verdict.same_domain),
        bool(verdict.same_satisfiable),
        int(verdict.age_cycles),
        str(verdict.reason),
        str(verdict.detail),
        None
        if matching is None
        else (
            int(matching.idle),
            int(matching.configured),
            int(matching.speculative),
            bool(matching.capped),
        ),
        int(verdict.victims),
        _amounts(verdict.victims_hold),
    )


def _verdict_from_tuple(values: tuple[Any, ...]) -> NeedVerdict:
    (
        cluster_id, need_key, need, arrival, fingerprint, satisfied, deficit, claimed,
        from_idle, from_speculative, same_domain, same_satisfiable, age_cycles, reason,
        detail, matching, victims, victims_hold,
    ) = values  # fmt: skip
    for name, text in (
        ("cluster id", cluster_id), ("need key", need_key), ("fingerprint", fingerprint),
        ("same domain", same_domain), ("reason", reason), ("detail", detail),
    ):  # fmt: skip
        if not isinstance(text, str):
            raise FrameError(f"INSPECTED frame: a verdict's {name} is not a string: {text!r:.80}")
    supply = None
    if matching is not None:
        idle, configured, speculative, capped = matching
        supply = MatchingSupply(int(idle), int(configured), int(speculative), bool(capped))
    return NeedVerdict(
        cluster_id=cluster_id,
        need_key=need_key,
        need=need_from_tuple(need, "INSPECTED"),
        arrival_seconds=float(arrival),
        fingerprint=fingerprint,
        satisfied=bool(satisfied),
        deficit=_amounts(deficit),
        claimed=int(claimed),
        from_idle=int(from_idle),
        from_speculative=int(from_speculative),
        same_domain=same_domain,
        same_satisfiable=bool(same_satisfiable),
        age_cycles=int(age_cycles),
        reason=reason,
        detail=detail,
        matching=supply,
        victims=int(victims),
        victims_hold=_amounts(victims_hold),
    )


@dataclass(frozen=True)
class EdgeLoad:
    """What an edge reports of itself about once a second (a LOAD frame).

    ``lag_s``: how late its loop runs, smoothed (``LoopLag``); ``lag_worst_s``
    the worst since its last report; ``busy``: the share of the last second its
    loop was not waiting for I/O; ``gc_total_s``: the collector's pauses
    since it started, ``gc_worst_s`` the longest since its last report;
    ``shed``: sessions refused or ended RESOURCE_EXHAUSTED since it started,
    by reason. Totals are the edge's own: they restart with it.
    """

    lag_s: float
    lag_worst_s: float
    busy: float
    gc_total_s: float
    gc_worst_s: float
    shed: tuple[tuple[str, int], ...] = ()


def load_body(load: EdgeLoad) -> tuple[Any, ...]:
    return (
        float(load.lag_s), float(load.lag_worst_s), float(load.busy),
        float(load.gc_total_s), float(load.gc_worst_s),
        tuple((str(reason), int(count)) for reason, count in load.shed),
    )  # fmt: skip


def load_from_body(body: tuple[Any, ...]) -> EdgeLoad:
    """An edge's report, checked: raises :class:`FrameError` naming what is wrong."""
    try:
        figures = tuple(float(value) for value in body[:5])
        shed = tuple((str(reason), int(count)) for reason, count in body[5])
    except (TypeError, ValueError) as err:
        raise FrameError(f"LOAD frame: {err}") from None
    if any(not math.isfinite(f) or f < 0 for f in figures):
        raise FrameError(f"LOAD frame: figures must be finite and not negative, got {figures}")
    lag, worst, busy, gc_total, gc_worst = figures
    return EdgeLoad(lag, worst, busy, gc_total, gc_worst, shed)


def inspection_body(answer: Inspection) -> tuple[Any, ...]:
    """The engine's why-not answer as plain values, for an INSPECTED frame.

    Every field of every verdict travels (``inspection_from_body`` rebuilds
    an equal :class:`Inspection`), so the edge's ``ShardReadServicer`` turns
    it into the same messages the engine's own would.
    """
    return (
        int(answer.cycle),
        float(answer.computed_at),
        int(answer.total),
        tuple(_verdict_to_tuple(verdict) for verdict in answer.verdicts),
    )


def inspection_from_body(values: tuple[Any, ...]) -> Inspection:
    """The :class:`Inspection` ``inspection_body`` wrote; ``FrameError`` when it does not fit."""
    try:
        cycle, computed_at, total, verdicts = values
        if not isinstance(verdicts, tuple):
            raise TypeError(f"the verdicts are a {type(verdicts).__name__}, not a tuple")
        return Inspection(
            cycle=int(cycle),
            computed_at=float(computed_at),
            total=int(total),
            verdicts=tuple(_verdict_from_tuple(verdict) for verdict in verdicts),
        )
    except FrameError:
        raise
    except (TypeError, ValueError, AttributeError) as err:
        raise FrameError(f"INSPECTED frame: the answer does not decode: {err!r:.200}") from None
