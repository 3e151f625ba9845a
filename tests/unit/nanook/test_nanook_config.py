"""The pool file: valid documents load, and each mistake names its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bigfleet.v1alpha1 import capacity_pb2
from nanook.config import PoolConfigError, dollars_to_bucket, load_pool_config, parse_pool_config


def doc(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"worker": {"resources": {"cpu": "4", "memory": "16Gi"}}}
    base.update(over)
    return base


def test_a_minimal_pool_has_the_documented_defaults() -> None:
    cfg = parse_pool_config(doc())
    assert cfg.worker_amounts == {"cpu": 4.0, "memory": 16 * 2**30}
    assert (cfg.min, cfg.max, cfg.priority) == (0, None, 0)
    assert cfg.interruption_penalty_bucket == capacity_pb2.PENALTY_BUCKET_ZERO


def test_the_default_bootstrap_starts_the_nanook_worker_with_its_machine_id() -> None:
    cfg = parse_pool_config(doc(bootstrap={"leader": "leader:5000"}))
    blob = cfg.bootstrap_blob("c1").decode()
    assert "exec polars-nanook-compute" in blob
    assert '--instance-id "$INSTANCE_ID"' in blob
    assert "BIGFLEET_MACHINE_ID" in blob and 'leader = "leader:5000"' in blob


def test_a_custom_template_gets_the_cluster_and_worker_config() -> None:
    cfg = parse_pool_config(
        doc(bootstrap={"template": "run $cluster_id\n$worker_config", "worker_config": "x=1"})
    )
    assert cfg.bootstrap_blob("c9") == b"run c9\nx=1"


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({}, "worker"),
        (doc(worker={"resources": {}}), "worker.resources"),
        (doc(worker={"resources": {"cpu": "lots"}}), "worker.resources[cpu]"),
        (doc(worker={"resources": {"cpu": "0"}}), "worker.resources[cpu]"),
        (doc(worker={"resources": {"cpu": "1"}, "size": 3}), "worker.size"),
        (
            doc(
                worker={"resources": {"cpu": "1"}, "requirements": [{"key": "k", "operator": "In"}]}
            ),
            "worker.requirements[0].values",
        ),
        (
            doc(
                worker={"resources": {"cpu": "1"}, "requirements": [{"key": "k", "operator": "Is"}]}
            ),
            "worker.requirements[0].operator",
        ),
        (doc(min=-1), "min"),
        (doc(min=4, max=2), "min"),
        (doc(max=1.5), "max"),
        (doc(priority="high"), "priority"),
        (doc(interruption_penalty=-3), "interruption_penalty"),
        (doc(bootstrap={"template": "run $nonsense"}), "bootstrap.template"),
        (doc(bootstrap={"ttl_seconds": 0}), "bootstrap.ttl_seconds"),
        (doc(rollup_interval_seconds=0), "rollup_interval_seconds"),
        (doc(colour="blue"), "colour"),
        ([1, 2], "(document)"),
    ],
)
def test_a_bad_pool_file_is_refused_naming_the_field(document: Any, field: str) -> None:
    with pytest.raises(PoolConfigError) as caught:
        parse_pool_config(document)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("dollars", "bucket"),
    [
        (0, capacity_pb2.PENALTY_BUCKET_ZERO),
        (0.3, capacity_pb2.PENALTY_BUCKET_HALF_DOLLAR),
        (8, capacity_pb2.PENALTY_BUCKET_8),
        (9, capacity_pb2.PENALTY_BUCKET_16),
        (1e9, capacity_pb2.PENALTY_BUCKET_PINNED),
    ],
)
def test_penalties_in_dollars_round_up_to_a_wire_bucket(dollars: float, bucket: int) -> None:
    assert dollars_to_bucket(dollars, field="x") == bucket


def test_an_unreadable_or_invalid_yaml_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError, match="cannot read"):
        load_pool_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("worker: [unclosed")
    with pytest.raises(PoolConfigError, match="not valid YAML"):
        load_pool_config(bad)


def test_the_documented_example_pool_file_loads() -> None:
    example = Path(__file__).resolve().parents[3] / "docs" / "examples" / "nanook-pool.yaml"
    cfg = load_pool_config(example)
    assert (
        cfg.max == 32 and cfg.requirements and b"polars-nanook-compute" in cfg.bootstrap_blob("c")
    )
