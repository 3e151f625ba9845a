"""Where the CLI finds a stack: flags, then variables, then the dev stack's file; else a hint."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bigfleet.endpoints import ENDPOINTS_FILE, Endpoints, EndpointsMissing
from workflows.search_attributes import stuck_drains_query

ROOT = Path(__file__).resolve().parents[2]


def written(tmp_path: Path, **fields: object) -> Path:
    Endpoints(**fields).write(tmp_path)  # type: ignore[arg-type]
    return tmp_path


def test_a_running_dev_stack_is_found_in_its_data_dir(tmp_path: Path) -> None:
    written(tmp_path, database_url="postgresql://dev", temporal_address="t:1", pid=os.getpid())

    found = Endpoints.resolve(data_dir=tmp_path, environment={})

    assert (found.need_database(), found.need_temporal()) == ("postgresql://dev", "t:1")


def test_flags_beat_variables_and_variables_beat_the_file(tmp_path: Path) -> None:
    written(tmp_path, database_url="postgresql://file", temporal_address="file:1", pid=os.getpid())
    env = {"BIGFLEET_DATABASE_URL": "postgresql://env", "BIGFLEET_TEMPORAL_ADDRESS": "env:1"}

    by_env = Endpoints.resolve(data_dir=tmp_path, environment=env)
    by_flag = Endpoints.resolve(
        data_dir=tmp_path, environment=env, database_url="postgresql://flag", temporal_address="f:1"
    )

    assert (by_env.database_url, by_env.temporal_address) == ("postgresql://env", "env:1")
    assert (by_flag.database_url, by_flag.temporal_address) == ("postgresql://flag", "f:1")


def test_a_file_left_by_a_stack_that_is_gone_is_ignored(tmp_path: Path) -> None:
    written(tmp_path, database_url="postgresql://old", pid=2**22 + 12345)  # no such process

    found = Endpoints.resolve(data_dir=tmp_path, environment={})

    with pytest.raises(EndpointsMissing, match="make dev"):
        found.need_database()


@pytest.mark.parametrize("content", ["{", "[]", '{"database_url": 5, "nonsense": 1}'])
def test_a_damaged_file_is_ignored(tmp_path: Path, content: str) -> None:
    (tmp_path / ENDPOINTS_FILE).write_text(content)

    found = Endpoints.read(tmp_path)

    assert found is None
    with pytest.raises(EndpointsMissing):
        Endpoints.resolve(data_dir=tmp_path, environment={}).need_temporal()


def test_the_missing_endpoint_says_which_flag_and_variable_would_do() -> None:
    with pytest.raises(EndpointsMissing) as caught:
        Endpoints().need_temporal()

    assert "--address" in str(caught.value) and "BIGFLEET_TEMPORAL_ADDRESS" in str(caught.value)


def test_the_docs_show_the_one_stuck_drains_query() -> None:
    shown = 0
    for doc in ("README.md", "workflows/README.md"):
        for line in (ROOT / doc).read_text().splitlines():
            if "DrainWorkflow" not in line or "ExecutionStatus" not in line:
                continue
            instant = re.search(r"StartTime < '([^']+)'", line)
            assert instant, f"{doc}: a drains query without a start bound: {line}"
            assert stuck_drains_query(instant.group(1)) in line, f"{doc}: {line}"
            shown += 1
    assert shown >= 3
