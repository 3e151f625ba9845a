"""BIGFLEET_MODE and BIGFLEET_BUDGETS_FILE: read once, refused with the variable and field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bigfleet.bootstrap import shard_options
from bigfleet.config import ConfigError, Settings


def test_shadow_mode_and_budgets_reach_the_shard_options(tmp_path: Path) -> None:
    budgets = tmp_path / "budgets.json"
    budgets.write_text(
        json.dumps([{"name": "gpu", "nodes": "10%", "scope": {"resources": ["nvidia.com/gpu"]}}])
    )

    settings = Settings.from_env({"BIGFLEET_MODE": "Shadow", "BIGFLEET_BUDGETS_FILE": str(budgets)})
    options = shard_options(settings)

    assert options.shadow
    assert [b.name for b in options.budgets] == ["gpu"]
    assert not shard_options(Settings.from_env({})).shadow


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="BIGFLEET_MODE: 'observe' is not one of"):
        Settings.from_env({"BIGFLEET_MODE": "observe"})


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("[{", "is not JSON (line 1"),
        ('[{"name": "x", "nodes": "ten"}]', "budgets[0].nodes: must be a count"),
    ],
)
def test_a_bad_budgets_file_names_the_variable_and_the_field(
    tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "budgets.json"
    path.write_text(content)

    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"BIGFLEET_BUDGETS_FILE": str(path)})

    assert caught.value.name == "BIGFLEET_BUDGETS_FILE"
    assert reason in caught.value.reason


def test_a_missing_budgets_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        Settings.from_env({"BIGFLEET_BUDGETS_FILE": str(tmp_path / "none.json")})


def test_bigfleet_config_documents_both() -> None:
    described = Settings.describe()

    assert "shadow" in described["BIGFLEET_MODE"]
    assert "cron" in described["BIGFLEET_BUDGETS_FILE"]
