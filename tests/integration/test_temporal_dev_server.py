"""Starting the Temporal dev server when a port it wants is taken.

A port free when asked can be taken by another process before the server
binds it. The server then exits at once; when the port was ours to choose it
is started again on a fresh one, and a port the caller named is tried once,
with the server's own words in the error.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bigfleet import temporal

pytestmark = pytest.mark.e2e


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port bound here and not listening: the server cannot bind it, a connect is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


async def test_a_named_port_that_is_taken_is_reported_with_the_servers_reason(
    tmp_path: Path, taken_port: int
) -> None:
    log = tmp_path / "temporal.log"
    with pytest.raises(RuntimeError) as raised:
        await temporal.DevServer.start(port=taken_port, log_path=log)
    message = str(raised.value)
    assert f"127.0.0.1:{taken_port}" in message
    assert "exited with" in message
    assert "address already in use" in message
    assert log.read_text().count("can't set frontend port") == 1, "a named port is tried once"


async def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race, made certain: the first port chosen is the one already taken.
    real = temporal.free_port
    chosen = iter([taken_port])
    monkeypatch.setattr(temporal, "free_port", lambda: next(chosen, None) or real())
    log = tmp_path / "temporal.log"
    server = await temporal.DevServer.start(port=None, log_path=log)
    try:
        assert server.address != f"127.0.0.1:{taken_port}"
        await server.client.service_client.check_health()
        assert log.read_text().count("can't set frontend port") == 1
    finally:
        await server.shutdown()


async def test_a_chosen_port_gives_up_after_its_attempts(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(temporal, "free_port", lambda: taken_port)
    log = tmp_path / "temporal.log"
    with pytest.raises(RuntimeError, match="address already in use"):
        await temporal.DevServer.start(port=None, log_path=log, attempts=2)
    assert log.read_text().count("can't set frontend port") == 2


async def test_the_sdk_started_server_also_replaces_a_chosen_port_taken_first(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = temporal.free_port
    chosen = iter([taken_port])
    monkeypatch.setattr(temporal, "free_port", lambda: next(chosen, None) or real())
    env = await temporal.start_dev_server(ui=False)
    try:
        address = env.client.service_client.config.target_host
        assert address != f"127.0.0.1:{taken_port}"
        await env.client.service_client.check_health()
    finally:
        await env.shutdown()


async def test_the_sdk_started_server_on_a_named_port_that_is_taken_fails_at_once(
    taken_port: int,
) -> None:
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{taken_port} did not start"):
        await temporal.start_dev_server(port=taken_port, ui=False)
