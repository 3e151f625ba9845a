"""Configuration errors name the variable and the reason."""

from __future__ import annotations

import pytest

from bigfleet.config import ConfigError, ProviderEndpoint, Settings, parse_providers


def test_providers_parse_from_name_equals_address_pairs() -> None:
    assert parse_providers("a=127.0.0.1:1, b=h:2") == (
        ProviderEndpoint("a", "127.0.0.1:1"),
        ProviderEndpoint("b", "h:2"),
    )


@pytest.mark.parametrize("text", ["a", "a=", "=h:1", "a=host", "a=h:1,a=h:2"])
def test_malformed_provider_lists_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="BIGFLEET_PROVIDERS"):
        parse_providers(text)


def test_settings_default_without_environment() -> None:
    s = Settings.from_env({})
    assert s.database_url is None and s.shard_id == "shard-0" and s.cycle_interval_s == 5.0


def test_a_non_numeric_interval_names_its_variable() -> None:
    with pytest.raises(ConfigError, match="BIGFLEET_CYCLE_SECONDS"):
        Settings.from_env({"BIGFLEET_CYCLE_SECONDS": "soon"})


def test_the_lease_margin_defaults_to_a_share_of_the_ttl_and_can_be_set() -> None:
    assert Settings.from_env({}).lease_margin_s is None
    assert Settings.from_env({"BIGFLEET_LEASE_MARGIN_SECONDS": "4"}).lease_margin_s == 4.0
    with pytest.raises(ConfigError, match="BIGFLEET_LEASE_MARGIN_SECONDS"):
        Settings.from_env({"BIGFLEET_LEASE_MARGIN_SECONDS": "0"})
    with pytest.raises(ConfigError, match="two thirds of the lease ttl"):
        Settings.from_env({"BIGFLEET_LEASE_TTL_SECONDS": "9", "BIGFLEET_LEASE_MARGIN_SECONDS": "6"})
    assert "BIGFLEET_LEASE_MARGIN_SECONDS" in Settings.describe()


def test_the_reconcile_period_defaults_to_a_minute_and_is_listed() -> None:
    assert Settings.from_env({}).reconcile_interval_s == 60.0
    assert Settings.from_env({"BIGFLEET_RECONCILE_SECONDS": "5"}).reconcile_interval_s == 5.0
    with pytest.raises(ConfigError, match="BIGFLEET_RECONCILE_SECONDS"):
        Settings.from_env({"BIGFLEET_RECONCILE_SECONDS": "often"})
    assert "BIGFLEET_RECONCILE_SECONDS" in Settings.describe()


def test_deadlines_can_be_scaled_for_drills_but_not_to_nothing() -> None:
    assert Settings.from_env({}).deadline_scale == 1.0
    assert Settings.from_env({"BIGFLEET_DEADLINE_SCALE": "0.05"}).deadline_scale == 0.05
    with pytest.raises(ConfigError, match="BIGFLEET_DEADLINE_SCALE"):
        Settings.from_env({"BIGFLEET_DEADLINE_SCALE": "0"})


def test_the_rollup_clock_skew_bound_is_a_listed_setting_defaulting_to_five_minutes() -> None:
    assert Settings.from_env({}).rollup_max_skew_s == 300.0
    assert Settings.from_env({"BIGFLEET_ROLLUP_MAX_SKEW_SECONDS": "60"}).rollup_max_skew_s == 60
    assert "BIGFLEET_ROLLUP_MAX_SKEW_SECONDS" in Settings.describe()
    with pytest.raises(ConfigError, match="BIGFLEET_ROLLUP_MAX_SKEW_SECONDS"):
        Settings.from_env({"BIGFLEET_ROLLUP_MAX_SKEW_SECONDS": "-1"})


def test_reclaim_settings_reach_the_engine_config() -> None:
    s = Settings.from_env(
        {
            "BIGFLEET_RECLAIM_HYSTERESIS_CYCLES": "5",
            "BIGFLEET_RECLAIM_MIN_AGE_SECONDS": "90",
            "BIGFLEET_RECLAIM_WINDOW_SECONDS": "0",
        }
    )
    config = s.engine_config()
    assert (
        config.reclaim_hysteresis_cycles,
        config.reclaim_min_age_seconds,
        config.reclaim_window_seconds,
    ) == (5, 90.0, 0.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BIGFLEET_RECLAIM_HYSTERESIS_CYCLES", "0"),
        ("BIGFLEET_RECLAIM_HYSTERESIS_CYCLES", "two"),
        ("BIGFLEET_RECLAIM_MIN_AGE_SECONDS", "-1"),
        ("BIGFLEET_RECLAIM_WINDOW_SECONDS", "soon"),
    ],
)
def test_bad_reclaim_settings_name_their_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_the_reclaim_settings_are_listed() -> None:
    described = Settings.describe()
    assert "BIGFLEET_RECLAIM_HYSTERESIS_CYCLES" in described
    assert "BIGFLEET_RECLAIM_MIN_AGE_SECONDS" in described
    assert "BIGFLEET_RECLAIM_WINDOW_SECONDS" in described


def test_interruption_settings_reach_the_engine_config() -> None:
    s = Settings.from_env(
        {
            "BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD": "0.5",
            "BIGFLEET_INTERRUPTION_GRACE_SECONDS": "30",
        }
    )
    config = s.engine_config()
    assert (config.interruption_drain_threshold, config.interruption_grace_seconds) == (0.5, 30)
    default = Settings.from_env({}).engine_config()
    assert (default.interruption_drain_threshold, default.interruption_grace_seconds) == (0.99, 90)
    described = Settings.describe()
    assert "BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD" in described
    assert "BIGFLEET_INTERRUPTION_GRACE_SECONDS" in described


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD", "0", "not a probability"),
        ("BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD", "1.2", "not a probability"),
        ("BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD", "high", "not a number"),
        ("BIGFLEET_INTERRUPTION_GRACE_SECONDS", "-5", "below the minimum"),
    ],
)
def test_bad_interruption_settings_name_their_variable(name: str, value: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}: .*{reason}"):
        Settings.from_env({name: value})


def test_edge_processes_default_to_one_per_spare_core_and_reach_the_shards_options() -> None:
    from bigfleet import bootstrap
    from bigfleet.config import MAX_AUTO_EDGES, auto_edges

    assert [auto_edges(cores) for cores in (1, 2, 3, 64)] == [0, 1, 2, MAX_AUTO_EDGES]
    assert Settings.from_env({}).shard_edges == auto_edges()
    assert Settings.from_env({"BIGFLEET_SHARD_EDGES": "auto"}).shard_edges == auto_edges()
    assert bootstrap.shard_options(Settings.from_env({"BIGFLEET_SHARD_EDGES": "0"})).edges == 0
    with pytest.raises(ConfigError, match="BIGFLEET_SHARD_EDGES: 'many' is neither"):
        Settings.from_env({"BIGFLEET_SHARD_EDGES": "many"})
    env = {"BIGFLEET_SHARD_EDGES": "2", "BIGFLEET_SHARD_EDGE_SOCKET": "edges.sock"}
    options = bootstrap.shard_options(Settings.from_env(env))
    assert (options.edges, options.edge_socket) == (2, "edges.sock")
    with pytest.raises(ConfigError, match="BIGFLEET_SHARD_EDGES"):
        Settings.from_env({"BIGFLEET_SHARD_EDGES": "-1"})
    assert {"BIGFLEET_SHARD_EDGES", "BIGFLEET_SHARD_EDGE_SOCKET"} <= set(Settings.describe())


def test_the_fleet_idle_wait_reaches_the_engine_config_and_is_listed() -> None:
    assert Settings.from_env({}).engine_config().fleet_idle_wait_seconds == 60.0
    never = Settings.from_env({"BIGFLEET_FLEET_IDLE_WAIT_SECONDS": "0"}).engine_config()
    assert never.fleet_idle_wait_seconds == 0.0
    assert "BIGFLEET_FLEET_IDLE_WAIT_SECONDS" in Settings.describe()
    with pytest.raises(ConfigError, match=r"BIGFLEET_FLEET_IDLE_WAIT_SECONDS: .*below the minimum"):
        Settings.from_env({"BIGFLEET_FLEET_IDLE_WAIT_SECONDS": "-1"})
