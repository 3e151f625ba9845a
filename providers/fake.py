"""A recording in-memory provider for unit tests of provider callers.

`FakeProvider` has the `ProviderClient` methods and answers them from a real
`ProviderCore` (a small simulated cloud by default) on a `ManualScheduler`,
so a test decides when transitions finish by calling `advance`. It records
every call, and raises an injected error on demand::

    fake = FakeProvider()
    machine = fake.speculative()[0]
    fake.next_error_for["create"] = ProviderUnavailable("boom")
    with pytest.raises(ProviderUnavailable):
        await fake.create(machine.id, token)
    await fake.create(machine.id, token)
    fake.advance(120)          # every create has finished by now
    assert (await fake.get(machine.id)).state == provider_pb2.MACHINE_STATE_IDLE
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bigfleet.v1alpha1 import provider_pb2
from providers.clock import ManualScheduler, Scheduler
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.errors import ProviderError
from providers.kinds import build_provider
from providers.model import FencingToken, Machine, State
from providers.wire import ack_to_pb, list_to_pb, machine_to_pb


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded call: the method name and its arguments."""

    method: str
    args: dict[str, Any] = field(default_factory=dict)


def default_fake_config(kind: str = "sim-cloud") -> ProviderConfig:
    """A small, quiet provider: a few dozen machines, no spot interruptions."""
    return ProviderConfig(kind=kind, quota_scale=0.1, interruption_scale=0.0)  # type: ignore[arg-type]


class FakeProvider:
    """The `ProviderClient` surface over an in-process core, recording calls.

    ``next_error`` is raised by the next call of any method,
    ``next_error_for[method]`` by the next call of that method; each is
    consumed when raised. The call is recorded either way.
    """

    def __init__(
        self,
        provider: ProviderCore | None = None,
        *,
        config: ProviderConfig | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        if provider is None:
            self.scheduler: Scheduler = scheduler or ManualScheduler()
            provider = build_provider(config or default_fake_config(), scheduler=self.scheduler)
        else:
            self.scheduler = provider.scheduler
        self.provider = provider
        self.provider.start()
        self.calls: list[Call] = []
        # In process, a call returns at once; this bounds it like ProviderClient.timeout.
        self.timeout = 1.0
        self.next_error: ProviderError | None = None
        self.next_error_for: dict[str, ProviderError] = {}

    # ------------------------------------------------------------------ test helpers

    def reset(self) -> None:
        """Forget recorded calls and pending injected errors (not machine state)."""
        self.calls.clear()
        self.next_error = None
        self.next_error_for.clear()

    def calls_to(self, method: str) -> list[Call]:
        """The recorded calls of one method, in order."""
        return [c for c in self.calls if c.method == method]

    def advance(self, seconds: float) -> None:
        """Move the manual clock (and so every pending transition) forward."""
        if not isinstance(self.scheduler, ManualScheduler):
            raise TypeError("advance needs the fake to run on a ManualScheduler")
        self.scheduler.advance(seconds)

    def speculative(self) -> list[Machine]:
        """The machines currently SPECULATIVE, as domain snapshots."""
        return list(self.provider.list([State.SPECULATIVE]).machines)

    def _record(self, method: str, **args: Any) -> None:
        self.calls.append(Call(method, args))
        error = self.next_error_for.pop(method, None)
        if error is None and self.next_error is not None:
            error, self.next_error = self.next_error, None
        if error is not None:
            raise error

    # ------------------------------------------------------------------ client surface

    async def create(
        self, machine_id: str, token: FencingToken | None, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck:
        """As `ProviderClient.create`."""
        self._record("create", machine_id=machine_id, token=token)
        return ack_to_pb(self.provider.create(machine_id, token))

    async def configure(
        self,
        machine_id: str,
        cluster_id: str,
        bootstrap_blob: bytes,
        token: FencingToken | None,
        shard_metadata: Mapping[str, str] | None = None,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck:
        """As `ProviderClient.configure` (in process: ``deadline_s`` never runs out)."""
        metadata = dict(shard_metadata or {})
        self._record(
            "configure",
            machine_id=machine_id,
            cluster_id=cluster_id,
            bootstrap_blob=bootstrap_blob,
            token=token,
            shard_metadata=metadata,
        )
        return ack_to_pb(
            self.provider.configure(machine_id, cluster_id, bootstrap_blob, token, metadata)
        )

    async def drain(
        self,
        machine_id: str,
        grace_seconds: int,
        token: FencingToken | None,
        *,
        deadline_s: float | None = None,
    ) -> provider_pb2.TransitionAck:
        """As `ProviderClient.drain`."""
        self._record("drain", machine_id=machine_id, grace_seconds=grace_seconds, token=token)
        return ack_to_pb(self.provider.drain(machine_id, grace_seconds, token))

    async def delete(
        self, machine_id: str, token: FencingToken | None, *, deadline_s: float | None = None
    ) -> provider_pb2.TransitionAck:
        """As `ProviderClient.delete`."""
        self._record("delete", machine_id=machine_id, token=token)
        return ack_to_pb(self.provider.delete(machine_id, token))

    async def get(self, machine_id: str) -> provider_pb2.Machine:
        """As `ProviderClient.get`."""
        self._record("get", machine_id=machine_id)
        return machine_to_pb(self.provider.get(machine_id))

    async def list(
        self,
        states: Iterable[int] = (),
        max_results: int = 0,
        since_revision: bytes = b"",
    ) -> provider_pb2.MachineList:
        """As `ProviderClient.list`."""
        wanted = [int(s) for s in states]
        self._record("list", states=wanted, max_results=max_results, since_revision=since_revision)
        return list_to_pb(self.provider.list(wanted, max_results, since_revision))

    async def list_all(self, states: Iterable[int] = ()) -> provider_pb2.MachineList:
        """As `ProviderClient.list_all`."""
        return await self.list(states, 0, b"")

    async def close(self) -> None:
        """As `ProviderClient.close`; the core keeps its state."""
        self._record("close")


__all__ = ["Call", "FakeProvider", "default_fake_config"]
