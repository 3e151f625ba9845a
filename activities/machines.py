"""Activities that call capacity providers on behalf of the machine workflows.

Just before each mutation the shard's lease is checked, and the call's
deadline is cut to the time the shard may still act, so no mutation lands
after its lease may have ended (ADR 0100); each carries a fresh fencing
token. Refusals are sorted deliberately:
``Fenced`` ends the workflow (non-retryable) and tells the shard to stop;
an out-of-position transition or unknown machine is a per-machine refusal
returned as data; transport trouble is re-raised so Temporal retries it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.context import (
    ProviderCalls,
    ShardContext,
    ShardInactive,
    ensure_active,
    ensure_holder,
    not_holder,
)
from bigfleet.attribution import META_NEED, META_OPERATION_SEQ, META_PRIORITY, META_SHARD
from bigfleet.v1alpha1 import provider_pb2
from providers.errors import (
    Fenced,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    ProviderError,
    Unimplemented,
)
from providers.model import FencingToken
from workflows import contracts as c
from workflows.errors import BOOTSTRAP_UNAVAILABLE, FENCED, INVALID_ARGUMENT, LEASE_LOST

log = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_S = 20.0
# Provider calls in flight at once from one shard process. Batches fan out one
# call per machine; thousands of concurrent unary calls on one channel start
# coming back CANCELLED, so they queue here instead.
MAX_CALLS_IN_FLIGHT = 256
# A provider mutation is not started with less time than this left on the lease.
MIN_CALL_S = 0.05


def state_name(state: int) -> str:
    """``MACHINE_STATE_IDLE`` -> ``IDLE``."""
    return provider_pb2.MachineState.Name(state).removeprefix("MACHINE_STATE_")  # type: ignore[arg-type]


def outcome_of(provider: str, machine: provider_pb2.Machine) -> c.MachineOutcome:
    return c.MachineOutcome(machine.id, provider, state_name(machine.state), machine.last_error)


class MachineActivities:
    """Provider-facing activities, bound to one shard process's context."""

    def __init__(self, ctx: ShardContext, *, max_in_flight: int = MAX_CALLS_IN_FLIGHT) -> None:
        self._ctx = ctx
        self._in_flight = asyncio.Semaphore(max_in_flight)

    def _ensure_active(self) -> None:
        ensure_active(self._ctx)

    def _budget(self, client: ProviderCalls) -> float:
        """The deadline of the next provider mutation: the client's timeout, cut to the
        time this process may still act, so no mutation lands after its lease may have
        ended (ADR 0100). Refuses (``LeaseLost``) when too little is left."""
        try:
            left = self._ctx.acting_for_s()
        except ShardInactive as err:
            raise ApplicationError(str(err), type=LEASE_LOST, non_retryable=True) from err
        if left < MIN_CALL_S:
            raise ApplicationError(
                f"shard {self._ctx.shard_id}: its lease may end in {left:.2f} s; "
                "no provider call is started",
                type=LEASE_LOST,
                non_retryable=True,
            )
        return min(client.timeout, left)

    def _fenced(self, provider: str, machine_id: str, err: Fenced) -> ApplicationError:
        self._ctx.on_fenced(provider, machine_id, err.message)
        return ApplicationError(
            f"{provider} fenced shard {self._ctx.shard_id} on {machine_id}: {err.message}",
            type=FENCED,
            non_retryable=True,
        )

    @activity.defn(name=c.CREATE_MACHINES)
    async def create_machines(self, inp: c.CreateMachinesInput) -> c.TransitionResults:
        """Ask each machine's provider to create it (SPECULATIVE -> CREATING)."""
        self._ensure_active()

        return await self._each(
            inp.machines,
            lambda client, target, token, budget: client.create(
                target.machine_id, token, deadline_s=budget
            ),
        )

    @activity.defn(name=c.CONFIGURE_MACHINES)
    async def configure_machines(self, inp: c.ConfigureMachinesInput) -> c.TransitionResults:
        """Fetch a fresh bootstrap blob from the cluster, then Configure each machine.

        The blob is a credential: it is fetched here and handed straight to the
        provider, never returned to the workflow, so it never lands in history.
        """
        self._ensure_active()
        blob = await self._ctx.request_bootstrap(
            inp.cluster_id, inp.requirements, wait_seconds=BOOTSTRAP_TIMEOUT_S
        )
        if blob.error:
            raise ApplicationError(
                f"cluster {inp.cluster_id}: {blob.error}",
                type=BOOTSTRAP_UNAVAILABLE,
                non_retryable=True,
            )
        metadata = {
            META_SHARD: inp.shard_id,
            META_NEED: inp.need_key,
            META_PRIORITY: str(inp.priority),
            META_OPERATION_SEQ: str(inp.operation_seq),
        }

        return await self._each(
            inp.machines,
            lambda client, target, token, budget: client.configure(
                target.machine_id,
                inp.cluster_id,
                blob.user_data,
                token,
                metadata,
                deadline_s=budget,
            ),
        )

    async def _each(
        self,
        machines: list[c.MachineTarget],
        call: Callable[
            [ProviderCalls, c.MachineTarget, FencingToken, float],
            Awaitable[provider_pb2.TransitionAck],
        ],
    ) -> c.TransitionResults:
        """Send one lifecycle call per machine, each with a fresh token, sorting the answers.

        Fenced ends the whole activity (non-retryable; the shard stops acting);
        an out-of-position or unknown machine is a per-machine refusal; a
        malformed request is final; transport trouble propagates for retry.
        """

        async def one(target: c.MachineTarget) -> c.MachineOutcome | None:
            client = self._ctx.provider(target.provider)
            try:
                async with self._in_flight:
                    # Just before the call: its deadline ends before the lease can (ADR 0100).
                    budget = self._budget(client)
                    ack = await call(client, target, self._ctx.next_token(), budget)
            except Fenced as err:
                raise self._fenced(target.provider, target.machine_id, err) from err
            except (InvalidTransition, NotFound, Unimplemented) as err:
                return c.MachineOutcome(target.machine_id, target.provider, c.FAILED, err.message)
            except InvalidArgument as err:
                raise ApplicationError(
                    err.message, type=INVALID_ARGUMENT, non_retryable=True
                ) from err
            self._ctx.observe(target.provider, ack.machine)
            return None

        results = await asyncio.gather(*(one(t) for t in machines))
        refused = [r for r in results if r is not None]
        accepted = [t.machine_id for t, r in zip(machines, results, strict=True) if r is None]
        return c.TransitionResults(accepted=accepted, refused=refused)

    @activity.defn(name=c.DRAIN_MACHINE)
    async def drain_machine(self, inp: c.DrainMachineInput) -> c.TransitionAnswer:
        """Ask the provider to drain one machine within ``grace_seconds`` (CONFIGURED -> DRAINING).

        A repeat while the machine is DRAINING returns the operation in flight.
        """
        self._ensure_active()
        target = inp.machine
        client = self._ctx.provider(target.provider)
        budget = self._budget(client)
        try:
            ack = await client.drain(
                target.machine_id, inp.grace_seconds, self._ctx.next_token(), deadline_s=budget
            )
        except Fenced as err:
            raise self._fenced(target.provider, target.machine_id, err) from err
        except (InvalidTransition, NotFound, Unimplemented) as err:
            return _refusal(err)
        except InvalidArgument as err:
            raise ApplicationError(err.message, type=INVALID_ARGUMENT, non_retryable=True) from err
        self._ctx.observe(target.provider, ack.machine)
        return c.TransitionAnswer(True, state_name(ack.machine.state), ack.operation_id)

    @activity.defn(name=c.DELETE_MACHINE)
    async def delete_machine(self, inp: c.DeleteMachineInput) -> c.TransitionAnswer:
        """Ask the provider to release one idle machine (IDLE -> DELETING -> SPECULATIVE).

        Bare metal answers ``Unimplemented``: returned as a refusal, not raised.
        """
        self._ensure_active()
        target = inp.machine
        client = self._ctx.provider(target.provider)
        budget = self._budget(client)
        try:
            ack = await client.delete(target.machine_id, self._ctx.next_token(), deadline_s=budget)
        except Fenced as err:
            raise self._fenced(target.provider, target.machine_id, err) from err
        except (InvalidTransition, NotFound, Unimplemented) as err:
            return _refusal(err)
        except InvalidArgument as err:
            raise ApplicationError(err.message, type=INVALID_ARGUMENT, non_retryable=True) from err
        self._ctx.observe(target.provider, ack.machine)
        return c.TransitionAnswer(True, state_name(ack.machine.state), ack.operation_id)

    @activity.defn(name=c.OBSERVE_MACHINES)
    async def observe_machines(self, inp: c.ObserveMachinesInput) -> c.ObservedMachines:
        """Read each machine's current state from its provider (reads are not fenced)."""

        async def one(target: c.MachineTarget) -> c.MachineOutcome:
            try:
                async with self._in_flight:
                    machine = await self._ctx.provider(target.provider).get(target.machine_id)
            except NotFound as err:
                return c.MachineOutcome(target.machine_id, target.provider, c.FAILED, err.message)
            self._ctx.observe(target.provider, machine)
            return outcome_of(target.provider, machine)

        try:
            seen = await asyncio.gather(*(one(t) for t in inp.machines))
        except ProviderError as err:
            if err.retryable:
                raise
            raise ApplicationError(err.message, type=type(err).__name__) from err
        return c.ObservedMachines(list(seen))

    @activity.defn(name=c.RECORD_OUTCOMES)
    async def record_outcomes(self, inp: c.RecordOutcomesInput) -> None:
        """Persist the outcome and fold it into the live inventory, exactly once.

        A process that may not act refuses retryably (``NotLeaseHolder``), so
        the attempt is repeated until the lease holder records it.
        """
        ensure_holder(self._ctx)
        try:
            await self._ctx.record_outcomes(inp)
        except ShardInactive as err:
            raise not_holder(err) from err


def _refusal(err: ProviderError) -> c.TransitionAnswer:
    """A per-machine refusal as data; the workflow decides what it means."""
    return c.TransitionAnswer(False, refusal=type(err).__name__, detail=err.message)


__all__ = ["BOOTSTRAP_TIMEOUT_S", "FENCED", "MachineActivities", "outcome_of", "state_name"]
