"""The golden traces replay to their recorded summaries (regenerate: python -m simulator.golden)."""

from __future__ import annotations

import json

import pytest

from simulator.golden import GOLDEN, expected_path, replay


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_golden_trace_replays_to_its_expected_summary(name: str) -> None:
    expected = json.loads(expected_path(name).read_text())
    assert replay(name) == expected
