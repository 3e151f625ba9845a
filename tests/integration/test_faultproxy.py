"""The fault proxy: bytes flow, are held (blackhole), torn down (cut) and flow again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.chaos.faultproxy import FaultProxy


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    p = await FaultProxy(f"127.0.0.1:{port}").start()
    try:
        yield p
    finally:
        await p.stop()
        server.close()


async def _roundtrip(
    r: asyncio.StreamReader, w: asyncio.StreamWriter, data: bytes, wait: float = 5.0
) -> bytes:
    w.write(data)
    await w.drain()
    return await asyncio.wait_for(r.readexactly(len(data)), timeout=wait)


async def test_bytes_flow_through_and_are_counted(proxy: FaultProxy) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert await _roundtrip(r, w, b"hello") == b"hello"
    assert proxy.stats.bytes_up == 5 and proxy.stats.bytes_down == 5
    w.close()


async def test_a_blackhole_holds_the_connection_and_its_bytes_until_healed(
    proxy: FaultProxy,
) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    await _roundtrip(r, w, b"a")
    proxy.blackhole()
    w.write(b"held")
    await w.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.readexactly(4), timeout=0.5)
    assert not w.is_closing()
    proxy.heal()
    assert await asyncio.wait_for(r.readexactly(4), timeout=5) == b"held"
    w.close()


async def test_a_cut_resets_open_connections_and_refuses_new_ones_until_healed(
    proxy: FaultProxy,
) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    await _roundtrip(r, w, b"a")
    proxy.cut()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(r, w, b"b")
    r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(r2, w2, b"c")
    proxy.heal()
    r3, w3 = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert await _roundtrip(r3, w3, b"again") == b"again"
    w3.close()


async def test_a_delay_still_delivers_every_byte_in_order(proxy: FaultProxy) -> None:
    proxy.delay(0.05)
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    for chunk in (b"one", b"two", b"three"):
        assert await _roundtrip(r, w, chunk) == chunk
    assert proxy.mode == "delay"
    w.close()
