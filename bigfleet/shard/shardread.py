"""``bigfleet.v1alpha1.ShardRead``: why-not over the wire, answered from the last cycle.

    client ──InspectNeeds(cluster_id, limit)──▶ ShardReadServicer
                                                  └─ engine.inspect_needs() (shard_engine.verdicts)
           ◀── header {cycle, computed_at, total} · NeedView per need (priority order)

A thin servicer: it checks the caller, validates the request, asks the
engine, and translates each verdict into a ``NeedView``. It is served on the
shard's Session port, whose server runs on its own thread: ``inspect``
hands the question to the shard's loop, where the engine lives, and the
answer comes back as a future. Under mutual TLS only the ``readonly`` and
``admin`` identities may read (``bigfleet.identity``); on plaintext anyone
may.

In an edge process (ADR 0147) the same servicer answers: its ``inspect``
asks the engine process over the edge link and rebuilds the engine's
:class:`~shard_engine.verdicts.Inspection`, so the translation below is the
one code for both. While that engine is away, ``inspect`` fails with
:class:`InspectUnavailable`: UNAVAILABLE, to be retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable

import grpc

from bigfleet.identity import READERS, Guard
from bigfleet.shard.convert import need_to_wire, resources_to_wire
from bigfleet.v1alpha1 import shardread_pb2, shardread_pb2_grpc
from shard_engine.verdicts import Inspection, NeedVerdict, UnmetReason

__all__ = ["SHARD_READ_SERVICE", "InspectUnavailable", "ShardReadServicer", "need_view"]

SHARD_READ_SERVICE = shardread_pb2.DESCRIPTOR.services_by_name["ShardRead"].full_name

_REASONS = {
    UnmetReason.NONE: shardread_pb2.UNMET_REASON_UNSPECIFIED,
    UnmetReason.PRIORITY_STARVED: shardread_pb2.UNMET_REASON_PRIORITY_STARVED,
    UnmetReason.NO_MATCHING_SUPPLY: shardread_pb2.UNMET_REASON_NO_MATCHING_SUPPLY,
    UnmetReason.TOPOLOGY: shardread_pb2.UNMET_REASON_TOPOLOGY_UNSATISFIABLE,
    UnmetReason.PREEMPTION_EXHAUSTED: shardread_pb2.UNMET_REASON_PREEMPTION_EXHAUSTED,
}


class InspectUnavailable(RuntimeError):
    """Why-not cannot be answered now (an edge whose engine process is away): UNAVAILABLE."""


def _nanos(seconds: float) -> int:
    return round(seconds * 1e9)


def need_view(verdict: NeedVerdict) -> shardread_pb2.NeedView:
    """One verdict as the wire's ``NeedView``."""
    view = shardread_pb2.NeedView(
        need=need_to_wire(verdict.need),
        cluster_id=verdict.cluster_id,
        arrival_unix_nanos=_nanos(verdict.arrival_seconds),
        profile_fingerprint=verdict.fingerprint,
        satisfied=verdict.satisfied,
        claimed_machine_count=verdict.claimed,
        bootstrap_count=verdict.from_idle,
        provision_count=verdict.from_speculative,
        same_domain=verdict.same_domain,
        same_satisfiable=verdict.same_satisfiable,
        age_cycles_unmet=verdict.age_cycles,
        unmet_reason=_REASONS.get(verdict.reason, shardread_pb2.UNMET_REASON_UNSPECIFIED),
        need_key=verdict.need_key,
        unmet_detail=verdict.detail,
    )
    if verdict.deficit:
        view.residual_deficit.CopyFrom(resources_to_wire(verdict.deficit))
    if verdict.matching is not None:
        view.matching_supply.CopyFrom(
            shardread_pb2.MatchingSupply(
                idle=verdict.matching.idle,
                configured=verdict.matching.configured,
                speculative=verdict.matching.speculative,
                capped=verdict.matching.capped,
            )
        )
    if verdict.victims:
        view.preemption.CopyFrom(
            shardread_pb2.PreemptionSummary(
                victims_found=verdict.victims,
                capacity_freed=resources_to_wire(verdict.victims_hold),
            )
        )
    return view


class ShardReadServicer(shardread_pb2_grpc.ShardReadServicer):
    """Serves why-not from the engine of this shard (see module docstring)."""

    def __init__(
        self, inspect: Callable[[str, int], concurrent.futures.Future[Inspection]]
    ) -> None:
        self._inspect = inspect
        self._guard = Guard(SHARD_READ_SERVICE)

    async def InspectNeeds(
        self,
        request: shardread_pb2.InspectNeedsRequest,
        context: grpc.aio.ServicerContext[
            shardread_pb2.InspectNeedsRequest, shardread_pb2.InspectNeedsResponse
        ],
    ) -> AsyncIterator[shardread_pb2.InspectNeedsResponse]:
        await self._guard.authorize(context, READERS)
        if request.limit < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"limit: must not be negative, got {request.limit}",
            )
        try:
            answer = await asyncio.wrap_future(self._inspect(request.cluster_id, request.limit))
        except InspectUnavailable as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        yield shardread_pb2.InspectNeedsResponse(
            header=shardread_pb2.InspectNeedsHeader(
                cycle=answer.cycle,
                computed_at_unix_nanos=_nanos(answer.computed_at),
                total_needs=answer.total,
            )
        )
        for verdict in answer.verdicts:
            yield shardread_pb2.InspectNeedsResponse(need=need_view(verdict))
