"""Start-up retries: a peer that is not there yet is waited for, a wrong setting is not."""

from __future__ import annotations

import logging

import pytest

from bigfleet.backoff import retrying, transient
from bigfleet.config import ConfigError


class Flaky:
    """Refuses ``failures`` times, then answers."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.calls = 0
        self.error = error or ConnectionRefusedError(111, "Connection refused")

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "connected"


async def test_a_peer_that_comes_up_late_is_waited_for_with_one_log_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Flaky(3)
    with caplog.at_level(logging.WARNING, logger="bigfleet.backoff"):
        got = await retrying("PostgreSQL", flaky, within_s=5.0, initial_s=0.01, max_s=0.02)
    assert got == "connected" and flaky.calls == 4
    waits = [r.getMessage() for r in caplog.records]
    assert len(waits) == 3
    assert all(w.startswith("waiting for PostgreSQL (attempt ") for w in waits)


async def test_a_setting_retrying_cannot_fix_is_raised_at_once() -> None:
    flaky = Flaky(5, ConfigError("BIGFLEET_DATABASE_URL", "must be set"))
    with pytest.raises(ConfigError):
        await retrying("PostgreSQL", flaky, within_s=5.0, initial_s=0.01)
    assert flaky.calls == 1


async def test_the_last_error_is_raised_once_the_deadline_has_passed() -> None:
    now = [0.0]

    async def refused() -> None:
        now[0] += 1.0
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ConnectionRefusedError):
        await retrying("Temporal", refused, within_s=3.0, initial_s=0.001, clock=lambda: now[0])
    assert now[0] == pytest.approx(3.0, abs=1.0)


@pytest.mark.parametrize(
    "err",
    [
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("timed out"),
        RuntimeError("Failed client connect: Server connection error"),
        RuntimeError("FATAL: the database system is starting up"),
    ],
)
def test_refusals_and_timeouts_are_transient(err: BaseException) -> None:
    assert transient(err)


@pytest.mark.parametrize(
    "err",
    [
        ValueError("bad address"),
        RuntimeError('password authentication failed for user "bigfleet"'),
    ],
)
def test_configuration_mistakes_are_not_transient(err: BaseException) -> None:
    assert not transient(err)
