"""Provider observation: the providers' List folded into the engine and the node view.

    observe_all   List every provider (incrementally from its last revision cursor,
                  or in full) -> observe each machine this shard owns
    observe       one provider Machine -> MachineRecord -> ShardState.observe (engine,
                  node view), with the workload priority and the need the provider
                  echoes in shard_metadata

Machine state is observed, not stored (DESIGN §5): after a restart or a new
lease the shard rebuilds its engine from a full List. Quarantined machines
never reach the engine; machines leaving for another shard update the node
view only; a machine an outcome declared FAILED stays FAILED while the
provider still reports it in motion (all three kept by ``ShardState.observe``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from activities.context import ProviderCalls
from bigfleet.attribution import META_NEED, META_PRIORITY
from bigfleet.shard.convert import InvalidMachine, machine_record, metadata_priority
from bigfleet.shard.state import ShardState, Sighting, Workload
from bigfleet.v1alpha1 import provider_pb2
from providers.errors import ProviderError
from shard_engine.engine import ShardEngine
from workflows.contracts import MachineTarget

log = logging.getLogger(__name__)

__all__ = ["READS_IN_FLIGHT", "ProviderObserver"]

READS_IN_FLIGHT = 16
"""The most provider Gets one batch of reads has in flight at once."""


class ProviderObserver:
    """Keeps the engine's view of this shard's machines in step with the providers."""

    def __init__(
        self,
        providers: Mapping[str, ProviderCalls],
        *,
        state: ShardState[ShardEngine],
    ) -> None:
        self._providers = dict(providers)
        self._state = state
        # Per provider: the revision of its last List, for incremental Lists.
        self._cursors: dict[str, bytes] = {}

    def provider(self, name: str) -> ProviderCalls:
        """The client of a configured provider; ``KeyError`` naming it if unknown."""
        try:
            return self._providers[name]
        except KeyError:
            raise KeyError(f"provider {name!r} is not configured") from None

    def forget_cursor(self, provider: str) -> None:
        """Make the next List of ``provider`` a full one."""
        self._cursors.pop(provider, None)

    def forget_cursors(self) -> None:
        """Make the next List of every provider a full one."""
        self._cursors.clear()

    async def observe_all(self, *, full: bool) -> None:
        """List every provider (incrementally when it returned a cursor) into the engine."""
        for name, client in self._providers.items():
            try:
                listing = await client.list(
                    since_revision=b"" if full else self._cursors.get(name, b"")
                )
            except ProviderError as err:
                log.warning("provider %s: List failed: %s", name, err)
                continue
            for machine in listing.machines:
                if not self._state.owns(machine.id):
                    continue
                self.observe(name, machine)
            self._cursors[name] = bytes(listing.revision)

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        """Fold one fresh provider observation into the shard's state."""
        if self._state.lifecycle.is_quarantined(machine.id):
            return
        sighting = _sighting(provider, machine)
        if sighting is not None:
            self._state.observe(sighting.record, sighting.workload)

    async def read_many(self, machines: Sequence[MachineTarget]) -> list[Sighting | None]:
        """Get each machine from its provider, at most ``READS_IN_FLIGHT`` at a time; in order.

        What a transfer adopts or hands over is read this way: a batch of a
        few hundred machines costs a few round trips, not one per machine.
        An error ``read`` does not answer with None (not a provider's) is
        raised once every read has ended, so none is left running behind it.
        """
        gate = asyncio.Semaphore(READS_IN_FLIGHT)

        async def one(target: MachineTarget) -> Sighting | None:
            async with gate:
                return await self.read(target.provider, target.machine_id)

        answers = await asyncio.gather(*(one(t) for t in machines), return_exceptions=True)
        sightings: list[Sighting | None] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            sightings.append(answer)
        return sightings

    async def read(self, provider: str, machine_id: str) -> Sighting | None:
        """Get one machine from its provider, without folding it in (None: unreadable).

        A failed read is logged and counts as no answer.
        """
        try:
            machine = await self.provider(provider).get(machine_id)
        except (ProviderError, KeyError) as err:
            log.warning("reading %s from %s: %s", machine_id, provider, err)
            return None
        return _sighting(provider, machine)


def _sighting(provider: str, machine: provider_pb2.Machine) -> Sighting | None:
    """The engine's record of a provider Machine and the workload it echoes (None: invalid)."""
    try:
        record = machine_record(provider, machine)
    except InvalidMachine as err:
        log.warning("ignoring machine from %s: %s", provider, err)
        return None
    return Sighting(
        record,
        Workload(
            priority=metadata_priority(machine, META_PRIORITY),
            need_key=machine.shard_metadata.get(META_NEED, ""),
        ),
    )
