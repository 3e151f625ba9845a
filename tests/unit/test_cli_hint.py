"""The one-line hint after "cannot reach": a deployment is pointed at its settings."""

from __future__ import annotations

import pytest

from bigfleet.cli.runtime import hint


def test_without_settings_the_hint_points_at_the_dev_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BIGFLEET_DATABASE_URL", raising=False)
    monkeypatch.delenv("BIGFLEET_TEMPORAL_ADDRESS", raising=False)
    line = hint(ConnectionRefusedError("connection refused"))
    assert line is not None and "make dev" in line and "\n" not in line


def test_a_deployment_is_told_which_settings_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIGFLEET_DATABASE_URL", "postgresql://db.internal/bigfleet")
    monkeypatch.delenv("BIGFLEET_TEMPORAL_ADDRESS", raising=False)
    line = hint(ConnectionRefusedError("connection refused"))
    assert line is not None
    assert "check BIGFLEET_DATABASE_URL" in line and "make dev" not in line


def test_an_error_that_is_not_about_reaching_anything_gets_nohint() -> None:
    assert hint(ValueError("bad value")) is None
