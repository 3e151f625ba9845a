"""shard_metadata is stored and echoed byte for byte, in every answer that
shows the machine, and cleared together with the cluster when a drain ends."""

from __future__ import annotations

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.clock import ManualScheduler
from providers.config import ProviderConfig
from providers.kinds import build_provider
from providers.model import State
from tests.integration.providers.provider_harness import Harness


def awkward_metadata() -> dict[str, str]:
    """55 entries of what a careless implementation would mangle."""
    values = {
        "nul": "a\x00b",
        "controls": "\x01\x02\x07\x08\t\n\r\x1b\x7f",
        "emoji": "🚀🔥 👩🏽‍💻",
        "rtl": "שָׁלוֹם مرحبا",
        "cjk": "容量提供者",
        "combining": "e\u0301 n\u0303",
        "zero-width": "\u200b\u200d\ufeff",
        "empty": "",
        "spaces": "  leading and trailing  ",
        "quotes": "\"'`\\",
        "json": '{"k": [1, 2, {"x": null}]}',
        "long": "x" * 4000,
        "": "empty key",
        "bigfleet.io/need": "need-42",
        "Case": "upper",
        "case": "lower",
        "astral": "\U0001f600\U00010348",
    }
    for i in range(55 - len(values)):
        values[f"attribution/{i:02d}"] = f"value-{i}\x00\u00e9"
    return values


async def test_awkward_metadata_is_echoed_verbatim_everywhere(harness: Harness) -> None:
    metadata = awkward_metadata()
    shard = harness.shard()
    machine = await harness.idle(shard)
    ack = await harness.client.configure(
        machine.id, "cluster-e", b"\x00\xff", shard.token(), metadata
    )
    assert ack.machine.state == pb.MACHINE_STATE_CONFIGURING
    assert dict(ack.machine.shard_metadata) == metadata  # visible while CONFIGURING
    settled = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    assert settled.cluster == "cluster-e"
    for _ in range(3):
        assert dict((await harness.client.get(machine.id)).shard_metadata) == metadata
        listed = await harness.client.list([pb.MACHINE_STATE_CONFIGURED])
        [mine] = [m for m in listed.machines if m.id == machine.id]
        assert dict(mine.shard_metadata) == metadata
    drain = await harness.client.drain(machine.id, 0, shard.token())
    assert dict(drain.machine.shard_metadata) == metadata  # still bound while DRAINING


async def test_metadata_and_cluster_clear_when_the_drain_ends(harness: Harness) -> None:
    shard = harness.shard()
    machine = await harness.configured("first", {"a": "1", "b": "2"}, shard=shard)
    await harness.client.drain(machine.id, 0, shard.token())
    idle = await harness.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    assert idle.cluster == "" and dict(idle.shard_metadata) == {}
    await harness.client.configure(machine.id, "second", b"", shard.token(), {"c": "3"})
    again = await harness.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
    assert again.cluster == "second" and dict(again.shard_metadata) == {"c": "3"}


@pytest.mark.parametrize("kind", ["sim-cloud", "bare-metal"])
def test_the_stored_metadata_is_a_copy_of_the_callers(kind: str) -> None:
    """In process, where aliasing could happen: mutating the caller's map
    after Configure changes nothing the provider returns."""
    scheduler = ManualScheduler()
    provider = build_provider(
        ProviderConfig(kind=kind, quota_scale=0.1, interruption_scale=0.0),  # type: ignore[arg-type]
        scheduler=scheduler,
    )
    provider.start()
    machine_id = provider.list([State.SPECULATIVE]).machines[0].id
    provider.create(machine_id)
    scheduler.advance(3600)
    metadata = {"k": "v"}
    ack = provider.configure(machine_id, "c", b"", None, metadata)
    metadata["k"] = "changed"
    metadata["new"] = "x"
    assert dict(ack.machine.shard_metadata) == {"k": "v"}
    assert dict(provider.get(machine_id).shard_metadata) == {"k": "v"}
    with pytest.raises(TypeError):
        provider.get(machine_id).shard_metadata["k"] = "x"  # type: ignore[index]
    provider.close()
