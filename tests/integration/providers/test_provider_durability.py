"""Kill and restart: a provider restarted on the same state file keeps its
fencing marks, idempotency map, bindings, metadata and inventory, and a
transition the kill interrupted comes back FAILED, never stuck.

Two kills: stopping the in-process server abruptly (no grace, timers
dropped mid-transition), and SIGKILL of a provider process run by the CLI."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import FencingToken, ProviderClient
from providers.config import LatencyRange
from providers.errors import Fenced
from tests.integration.providers.provider_harness import (
    KINDS,
    TIME_FACTOR,
    Harness,
    local_ec2,
    serve,
)

REPO = Path(__file__).resolve().parents[3]
TRANSITIONAL = {
    pb.MACHINE_STATE_CREATING,
    pb.MACHINE_STATE_CONFIGURING,
    pb.MACHINE_STATE_DRAINING,
    pb.MACHINE_STATE_DELETING,
}
#: Drains take a simulated million seconds, so one is always in flight at the kill.
HOLD_DRAINS = {
    "drain_latency_s": LatencyRange(1e6, 1e6),
    "deadlines_s": {"drain": 1e9},
}


@dataclass
class Before:
    """What was true when the provider was killed."""

    fenced_machine: str
    configured: pb.Machine
    configure_op: str
    idle: pb.Machine
    create_op: str
    draining: str
    inventory: dict[str, int]
    cursor: bytes
    operations: set[str]


async def drive(h: Harness) -> Before:
    """Establish every kind of durable state on a fresh provider."""
    durable = FencingToken("dur-a", 3, 7)
    fenced = await h.machine()
    operations = {(await h.client.create(fenced.id, durable)).operation_id}

    shard = h.shard()
    idle = await h.machine()
    create = await h.client.create(idle.id, shard.token())
    operations.add(create.operation_id)
    idle = await h.wait_state(idle.id, pb.MACHINE_STATE_IDLE)

    shard = h.shard()
    target = await h.idle(shard)
    metadata = {"need": "n-1", "odd": "\x00é🚀"}
    configure = await h.client.configure(target.id, "durable", b"blob", shard.token(), metadata)
    operations.add(configure.operation_id)
    configured = await h.wait_state(target.id, pb.MACHINE_STATE_CONFIGURED)

    shard = h.shard()
    draining = await h.configured(shard=shard)
    drain = await h.client.drain(draining.id, 10**7, shard.token())
    assert drain.machine.state == pb.MACHINE_STATE_DRAINING
    await h.wait_state(fenced.id, pb.MACHINE_STATE_IDLE)

    listing = await h.client.list_all()
    return Before(
        fenced_machine=fenced.id,
        configured=configured,
        configure_op=configure.operation_id,
        idle=idle,
        create_op=create.operation_id,
        draining=draining.id,
        inventory={m.id: m.state for m in listing.machines},
        cursor=listing.revision,
        operations=operations,
    )


async def check(h: Harness, before: Before) -> None:
    """Everything in ``before`` survived; nothing is stuck in motion."""
    listing = await h.client.list_all()
    after = {m.id: m.state for m in listing.machines}
    assert after.keys() == before.inventory.keys()
    assert not TRANSITIONAL & set(after.values())
    changed = {m for m in after if after[m] != before.inventory[m]}
    assert changed == {before.draining}

    interrupted = await h.client.get(before.draining)
    assert interrupted.state == pb.MACHINE_STATE_FAILED
    assert "restart" in interrupted.last_error

    with pytest.raises(Fenced):
        await h.client.configure(before.fenced_machine, "c", b"", FencingToken("dur-a", 3, 7))
    await h.client.configure(before.fenced_machine, "c", b"", FencingToken("dur-a", 3, 8))

    configured = await h.client.get(before.configured.id)
    assert configured == before.configured  # binding, metadata, host: byte for byte
    retry = await h.client.configure(
        before.configured.id,
        "durable",
        b"blob",
        FencingToken("fresh-shard", 1, 1),
        dict(before.configured.shard_metadata),
    )
    assert retry.operation_id == before.configure_op
    again = await h.client.create(before.idle.id, FencingToken("fresh-shard", 1, 2))
    assert again.operation_id == before.create_op
    assert again.machine.host == before.idle.host

    # The pre-kill cursor is still ours: it names exactly what changed since.
    delta = await h.client.list(since_revision=before.cursor)
    assert {m.id for m in delta.machines} == {before.draining, before.fenced_machine}

    # Operation ids minted after the restart never repeat earlier ones.
    shard = h.shard()
    fresh = await h.machine()
    new_op = (await h.client.create(fresh.id, shard.token())).operation_id
    assert new_op not in before.operations


@pytest.mark.parametrize("kind", KINDS)
async def test_an_abruptly_stopped_provider_restarts_with_everything(
    kind: str, tmp_path: Path
) -> None:
    state = tmp_path / "provider-state.json"
    first = await serve(kind, state_path=state, **HOLD_DRAINS)
    async with ProviderClient(first.address) as client:
        before = await drive(Harness(kind, first, client))
    await first.stop(grace=None)

    second = await serve(kind, state_path=state, **HOLD_DRAINS)
    try:
        async with ProviderClient(second.address) as client:
            h = Harness(kind, second, client, used=set(before.inventory) - _speculative(before))
            await check(h, before)
    finally:
        await second.stop(grace=None)


def _speculative(before: Before) -> set[str]:
    return {m for m, s in before.inventory.items() if s == pb.MACHINE_STATE_SPECULATIVE}


# ---------------------------------------------------------------------- a real process


@dataclass
class Process:
    """A provider process started through the CLI."""

    proc: asyncio.subprocess.Process
    address: str
    log: Path


@asynccontextmanager
async def cli_provider(kind: str, state: Path, log: Path) -> AsyncIterator[Process]:
    """Run ``serve`` in a child process until the caller is done with it."""
    if kind == "ec2":
        local_ec2()  # the child finds the local EC2 through BIGFLEET_EC2_CONFIG
    args = [
        "-c",
        "from providers.cli import app; app()",
        "serve",
        f"--kind={kind}",
        "--addr=127.0.0.1:0",
        f"--state={state}",
        "--seed=11",
        f"--time-factor={TIME_FACTOR * 10}",
        "--quota-scale=0.1",
        "--interruption-scale=0",
    ]
    with log.open("w") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            cwd=REPO,
            stdout=sink,
            stderr=sink,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        address = await _address_from(log, proc)
        yield Process(proc, address, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


async def _address_from(log: Path, proc: asyncio.subprocess.Process) -> str:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 30
    while loop.time() < give_up:
        match = re.search(r"listening on (\S+)", _text(log))
        if match:
            return match.group(1)
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"the provider never said where it listens:\n{_text(log)}")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_sigkilled_provider_process_restarts_with_everything(
    kind: str, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    async with (
        cli_provider(kind, state, tmp_path / "first.log") as first,
        ProviderClient(first.address) as client,
    ):
        h = Harness(kind, None, client)
        shard = h.shard()
        configured = await h.configured("killed", {"who": "need-9\x00"}, shard=shard)
        victim = await h.idle(shard)
        mark = shard.token()
        ack = await client.configure(victim.id, "mid-flight", b"", mark, {"k": "v"})
        assert ack.machine.state == pb.MACHINE_STATE_CONFIGURING
        first.proc.send_signal(signal.SIGKILL)  # no chance to save anything
        assert await first.proc.wait() == -signal.SIGKILL

    async with (
        cli_provider(kind, state, tmp_path / "second.log") as second,
        ProviderClient(second.address) as client,
    ):
        listing = await client.list_all()
        assert not TRANSITIONAL & {m.state for m in listing.machines}
        survivor = await client.get(configured.id)
        assert survivor == configured
        interrupted = await client.get(victim.id)
        # FAILED with a reason, or cleanly at a stable state: never stuck.
        assert interrupted.state in {pb.MACHINE_STATE_FAILED, pb.MACHINE_STATE_CONFIGURED}
        if interrupted.state == pb.MACHINE_STATE_FAILED:
            assert interrupted.last_error
        with pytest.raises(Fenced):
            await client.create(victim.id, mark)


async def test_sigterm_stops_the_provider_cleanly(tmp_path: Path) -> None:
    async with cli_provider("sim-cloud", tmp_path / "s.json", tmp_path / "p.log") as running:
        async with ProviderClient(running.address) as client:
            assert (await client.list_all()).machines
        running.proc.send_signal(signal.SIGTERM)
        assert await running.proc.wait() == 0
    assert "stopping provider" in (tmp_path / "p.log").read_text()
    assert (tmp_path / "s.json").exists()
