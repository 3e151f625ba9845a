"""The bootstrap's pure parts: options from the environment, clear errors before connecting."""

from __future__ import annotations

import pytest

from bigfleet import bootstrap
from bigfleet.config import ConfigError, Settings
from workflows.contracts import Deadlines, default_deadline_overrides


def _settings(**env: str) -> Settings:
    return Settings.from_env({"BIGFLEET_SHARD_ID": "shard-7", **env})


def test_shard_options_come_from_the_environment_with_deadlines_scaled() -> None:
    options = bootstrap.shard_options(
        _settings(BIGFLEET_DEADLINE_SCALE="0.5", BIGFLEET_CYCLE_SECONDS="2")
    )
    assert options.shard_id == "shard-7" and options.task_queue == "shard-shard-7"
    assert options.cycle_interval_s == 2.0
    assert options.deadlines.creating_s == Deadlines().creating_s * 0.5
    for key, fields in default_deadline_overrides().items():
        assert options.deadline_overrides[key] == {k: v * 0.5 for k, v in fields.items()}


async def test_connecting_without_a_database_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="BIGFLEET_DATABASE_URL"):
        async with bootstrap.connect(_settings(BIGFLEET_TEMPORAL_ADDRESS="127.0.0.1:1")):
            pass


async def test_temporal_tls_without_certificates_names_what_is_missing() -> None:
    settings = _settings(
        BIGFLEET_DATABASE_URL="postgresql://127.0.0.1:1/none",
        BIGFLEET_TEMPORAL_ADDRESS="127.0.0.1:1",
        BIGFLEET_TEMPORAL_TLS="1",
    )
    with pytest.raises(ConfigError, match=r"BIGFLEET_TEMPORAL_TLS.*BIGFLEET_TLS_CERT"):
        async with bootstrap.connect(settings):
            pass


def test_a_shard_advertises_its_own_address_not_its_wildcard_listener() -> None:
    import socket

    from bigfleet.shard.options import advertised

    options = bootstrap.shard_options(
        _settings(BIGFLEET_SHARD_LISTEN="0.0.0.0:7443", BIGFLEET_SHARD_ADVERTISE="shard-7:7443")
    )
    assert options.listen == "0.0.0.0:7443" and options.advertise == "shard-7:7443"
    assert advertised("0.0.0.0:7443", options.advertise) == "shard-7:7443"
    # Without a setting: a concrete listener is its own address, a wildcard one this host's name.
    assert advertised("10.0.0.5:7443") == "10.0.0.5:7443"
    assert advertised("0.0.0.0:7443") == f"{socket.gethostname()}:7443"
    assert advertised("[::]:7443") == f"{socket.gethostname()}:7443"


def test_a_malformed_advertise_address_names_its_variable() -> None:
    with pytest.raises(ConfigError, match="BIGFLEET_SHARD_ADVERTISE"):
        _settings(BIGFLEET_SHARD_ADVERTISE="shard-7")


def test_the_start_up_retry_window_is_a_listed_setting() -> None:
    assert _settings().connect_timeout_s == 120.0
    assert _settings(BIGFLEET_CONNECT_TIMEOUT_SECONDS="5").connect_timeout_s == 5.0
    assert "BIGFLEET_CONNECT_TIMEOUT_SECONDS" in Settings.describe()
    assert "BIGFLEET_SHARD_ADVERTISE" in Settings.describe()
