"""Provider observation: the providers' List folded into the engine and the node view.

    observe_all   List every provider (incrementally from its last revision cursor,
                  or in full) -> observe each machine this shard owns
    observe       one provider Machine -> MachineRecord -> engine.upsert_machine,
                  NodeView.push; also reads back the workload priority the provider
                  echoes in shard_metadata, and the need it serves

Machine state is observed, not stored (DESIGN §5): after a restart or a new
lease the shard rebuilds its engine from a full List. Quarantined machines
never reach the engine; machines leaving for another shard update the node
view only; a machine an outcome declared FAILED stays FAILED while the
provider still reports it in motion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from activities.context import ProviderCalls
from activities.machines import META_NEED, META_PRIORITY
from bigfleet.shard.convert import InvalidMachine, machine_record, metadata_priority
from bigfleet.shard.holdings import Holdings
from bigfleet.shard.lifecycle import MachineLifecycle
from bigfleet.shard.nodes import NodeView
from bigfleet.v1alpha1 import provider_pb2
from providers.errors import ProviderError
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineState

log = logging.getLogger(__name__)

__all__ = ["ProviderObserver"]


class ProviderObserver:
    """Keeps the engine's view of this shard's machines in step with the providers."""

    def __init__(
        self,
        providers: Mapping[str, ProviderCalls],
        *,
        engine: ShardEngine,
        holdings: Holdings,
        lifecycle: MachineLifecycle,
        nodes: NodeView,
        clock: Callable[[], float],
    ) -> None:
        self._providers = dict(providers)
        self._engine = engine
        self._holdings = holdings
        self._lifecycle = lifecycle
        self._nodes = nodes
        self._clock = clock
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
                if machine.id not in self._holdings.owned:
                    continue
                self.observe(name, machine)
            self._cursors[name] = bytes(listing.revision)

    def observe(self, provider: str, machine: provider_pb2.Machine) -> None:
        """Fold one fresh provider observation into the engine and the node view."""
        if self._lifecycle.is_quarantined(machine.id):
            return
        try:
            record = machine_record(provider, machine)
        except InvalidMachine as err:
            log.warning("ignoring machine from %s: %s", provider, err)
            return
        if record.id in self._holdings.leaving:
            # Drained for another shard: its new owner plans with it, we do not.
            self._nodes.push(record)
            return
        declared = self._lifecycle.declared_failure(
            record.id, transitional=record.state.transitional
        )
        if declared is not None:
            record = replace(record, state=MachineState.FAILED, last_error=declared)
        priority = metadata_priority(machine, META_PRIORITY)
        if priority is not None:
            self._holdings.priorities[record.id] = priority
        elif not record.cluster:
            self._holdings.priorities.pop(record.id, None)
        need_key = machine.shard_metadata.get(META_NEED)
        if need_key and record.cluster:
            self._holdings.serving[record.id] = need_key
        else:
            self._holdings.serving.pop(record.id, None)
        self._engine.upsert_machine(record, now=self._clock())
        self._nodes.push(record)
