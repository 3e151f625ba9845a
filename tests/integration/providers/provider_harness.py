"""Helpers of the provider conformance suite (the fixtures are in conftest.py).

Every test talks to a real gRPC server on loopback through `ProviderClient`,
once per provider kind. The shared servers run with a small time factor and
no spot interruptions, so transitions take milliseconds and nothing fails
unless a test asks for it. Tests that need special settings (failure
injection, a state file) start their own server with `serve`.

`Harness.machine()` hands each test machines no other test has touched, so
tests sharing a server cannot disturb each other.

The ``ec2`` kind runs the EC2 provider against moto's EC2 API server, started
once per test session on loopback (`local_ec2`); its launches, bootstrap
commands and terminations are real HTTP calls to that server. Tests on a
manual clock run against the simulations only (`SIMULATED_KINDS`): EC2 does
not run on a manual clock.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import FencingToken, ProviderClient
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.ec2.local import LocalEc2, start_local_ec2
from providers.ec2.settings import dump_settings
from providers.server import RunningProvider, start_provider_server

KINDS = ("sim-cloud", "bare-metal", "ec2")
#: The kinds that can run on a manual clock.
SIMULATED_KINDS = ("sim-cloud", "bare-metal")
#: EC2 in the suite: enough vCPU quota for every test's fresh machines (about
#: 240 slots at the suite's quota scale), and deadlines (simulated seconds, so
#: about 6 real seconds, within the suite's 10 s waits) that leave room for
#: real HTTP calls on a busy machine.
EC2_QUOTA_VCPUS = 2400
EC2_DEADLINES = {"create": 6000.0, "configure": 6000.0, "delete": 6000.0}
#: Simulated seconds per real second in the shared servers: a 90 s create is 90 ms.
TIME_FACTOR = 0.001
#: How long a test waits for a transition before failing (real seconds). A
#: bound on waiting, not a latency assertion.
SETTLE_TIMEOUT = 10.0

_shards = itertools.count(1)


_local: list[LocalEc2] = []


def local_ec2() -> LocalEc2:
    """The session's moto server (started on first use, stopped at exit). Its
    settings are also written to a file named by ``BIGFLEET_EC2_CONFIG``, so a
    provider started by the command line in a child process finds it."""
    if not _local:
        local = start_local_ec2(quota_vcpus=EC2_QUOTA_VCPUS, queue=False, poll_s=0.05, watch_s=2.0)
        atexit.register(local.stop)
        path = Path(tempfile.mkdtemp(prefix="bigfleet-ec2-")) / "ec2.json"
        path.write_text(dump_settings(local.settings), encoding="utf-8")
        os.environ["BIGFLEET_EC2_CONFIG"] = str(path)
        _local.append(local)
    return _local[0]


def base_config(kind: str, **overrides: object) -> ProviderConfig:
    """The suite's provider settings for ``kind``."""
    config = ProviderConfig(
        kind=kind,  # type: ignore[arg-type]
        seed=7,
        time_factor=TIME_FACTOR,
        quota_scale=0.15 if kind in ("sim-cloud", "ec2") else 1.0,
        interruption_scale=0.0,
        commission_s=30.0,
    )
    if kind == "ec2":
        deadlines = overrides.get("deadlines_s", {})
        assert isinstance(deadlines, dict)
        overrides = {**overrides, "deadlines_s": {**EC2_DEADLINES, **deadlines}}
        config = replace(config, ec2=local_ec2().settings)
    return replace(config, **overrides)  # type: ignore[arg-type]


def state_name(state: int) -> str:
    """MACHINE_STATE_IDLE for 3, and so on."""
    return pb.MachineState.Name(pb.MachineState.ValueType(state))


@dataclass
class Shard:
    """A caller identity minting strictly increasing tokens, like a shard."""

    shard_id: str
    epoch: int = 1
    sequence: int = 0

    def token(self) -> FencingToken:
        """The next token of this shard."""
        self.sequence += 1
        return FencingToken(self.shard_id, self.epoch, self.sequence)

    def restart(self) -> None:
        """A new process of the same shard: epoch up, sequence from zero."""
        self.epoch += 1
        self.sequence = 0


@dataclass
class Harness:
    """One provider under test and the helpers every test uses."""

    kind: str
    running: RunningProvider | None
    client: ProviderClient
    used: set[str] = field(default_factory=set)

    @property
    def address(self) -> str:
        """Where the provider listens."""
        return self.client.address

    @property
    def core(self) -> ProviderCore:
        """The in-process provider, for inspection (not for a child process)."""
        assert self.running is not None, "this provider runs in another process"
        return self.running.provider

    @property
    def has_delete(self) -> bool:
        """Whether this kind offers Delete."""
        return self.kind in ("sim-cloud", "ec2")

    def shard(self) -> Shard:
        """A fresh shard identity (its fencing marks start empty)."""
        return Shard(f"shard-{next(_shards)}")

    async def machine(self, predicate: Callable[[pb.Machine], bool] = lambda m: True) -> pb.Machine:
        """A SPECULATIVE machine no test has used yet."""
        listing = await self.client.list([pb.MACHINE_STATE_SPECULATIVE])
        for machine in listing.machines:
            if machine.id not in self.used and predicate(machine):
                self.used.add(machine.id)
                return machine
        raise AssertionError("the provider ran out of unused speculative machines")

    async def wait_state(
        self, machine_id: str, state: int, within: float = SETTLE_TIMEOUT
    ) -> pb.Machine:
        """Poll Get until the machine is in ``state``; fail after ``within``
        real seconds (a bound on waiting, not a latency assertion)."""
        seen: list[int] = []
        loop = asyncio.get_running_loop()
        give_up = loop.time() + within
        while True:
            machine = await self.client.get(machine_id)
            if not seen or seen[-1] != machine.state:
                seen.append(machine.state)
            if machine.state == state:
                return machine
            if loop.time() > give_up:
                raise AssertionError(
                    f"{machine_id} never reached {state_name(state)}; states seen: "
                    f"{[state_name(s) for s in seen]}; last_error={machine.last_error!r}"
                )
            await asyncio.sleep(0.005)

    async def wait_until(
        self, condition: Callable[[], bool], within: float = SETTLE_TIMEOUT
    ) -> None:
        """Yield to the loop until ``condition()`` holds; fail after ``within``."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + within
        while not condition():
            if loop.time() > give_up:
                raise AssertionError("condition never became true")
            await asyncio.sleep(0.005)

    async def idle(self, shard: Shard | None = None) -> pb.Machine:
        """A fresh machine walked to IDLE."""
        shard = shard or self.shard()
        machine = await self.machine()
        await self.client.create(machine.id, shard.token())
        return await self.wait_state(machine.id, pb.MACHINE_STATE_IDLE)

    async def configured(
        self,
        cluster: str = "cluster-a",
        metadata: dict[str, str] | None = None,
        shard: Shard | None = None,
    ) -> pb.Machine:
        """A fresh machine walked to CONFIGURED in ``cluster``."""
        shard = shard or self.shard()
        machine = await self.idle(shard)
        await self.client.configure(
            machine.id, cluster, b"#cloud-config\n", shard.token(), metadata
        )
        return await self.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)


async def serve(kind: str, **overrides: object) -> RunningProvider:
    """Start a dedicated provider server with the suite's settings changed."""
    return await start_provider_server(base_config(kind, **overrides), "127.0.0.1:0")
