"""A shard's cycle feeds its metrics: actions by kind and reason, unmet needs by reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

from bigfleet import metrics
from bigfleet.config import ConfigError, Settings
from bigfleet.shard import telemetry
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import MachineState
from tests.rollups import apply
from tests.unit.engine.engine_fleet import fleet, need, rollup, zone_in

ROOT = Path(__file__).resolve().parents[2]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_cycle_counts_its_actions_and_sets_unmet_needs_by_reason() -> None:
    shard = "telemetry-test"
    engine = ShardEngine(
        EngineConfig(
            reclaim_hysteresis_cycles=1, reclaim_min_age_seconds=0, reclaim_window_seconds=0
        ),
        stopwatch=iter(float(i) for i in range(100)).__next__,
    )
    fleet(engine, 3, prefix="spec", state=MachineState.SPECULATIVE)
    fleet(engine, 2, prefix="old", state=MachineState.CONFIGURED, cluster="shrinking")
    apply(engine, rollup("growing", 1, need(cpu=8)), now=0)
    apply(engine, rollup("shrinking", 1, need(cpu=4)), now=0)
    apply(engine, rollup("odd", 1, need(cpu=4, requirements=[zone_in("nowhere")])), now=0)
    before = sample("bigfleet_shard_actions_total", shard=shard, kind="provision", reason="")

    plan = engine.cycle(now=1)
    telemetry.record_cycle(shard, plan, seconds=0.01, stats=engine.stats, sessions_open=3)

    assert (
        sample("bigfleet_shard_actions_total", shard=shard, kind="provision", reason="")
        == before + 2
    )
    assert sample("bigfleet_shard_actions_total", shard=shard, kind="drain", reason="reclaim") >= 1
    assert sample("bigfleet_shard_unmet_needs", shard=shard, reason="no matching supply") == 1
    assert sample("bigfleet_shard_unmet_needs", shard=shard, reason="priority-starved") == 0
    assert sample("bigfleet_shard_sessions_open", shard=shard) == 3
    assert (
        sample("bigfleet_shard_cycle_phase_duration_seconds_count", shard=shard, phase="reclaim")
        >= 1
    )


def test_the_metrics_settings_name_their_variable_when_malformed() -> None:
    settings = Settings.from_env({"BIGFLEET_METRICS_LISTEN": "0.0.0.0:9464"})
    assert settings.metrics_listen == "0.0.0.0:9464" and settings.temporal_metrics_listen is None
    for name in ("BIGFLEET_METRICS_LISTEN", "BIGFLEET_TEMPORAL_METRICS_LISTEN"):
        try:
            Settings.from_env({name: "9464"})
        except ConfigError as err:
            assert err.name == name
        else:
            raise AssertionError(f"{name}=9464 was accepted")


def test_the_dashboard_and_the_alert_queries_use_only_metrics_that_exist() -> None:
    known = set()
    for name in metrics.__all__:
        value = getattr(metrics, name)
        if hasattr(value, "_name"):
            known.add(value._name)
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "bigfleet.json").read_text())
    texts = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    texts.append((ROOT / "docs" / "metrics.md").read_text())
    for text in texts:
        for used in re.findall(r"\bbigfleet_[a-z_]+", text):
            base = re.sub(r"_(total|bucket|sum|count|created)$", "", used)
            assert base in known, f"{used} is not defined in bigfleet.metrics"
