"""The trace format: round trips, and bad lines name the line and the field."""

from __future__ import annotations

import json

import pytest

from simulator.scenarios import SCENARIOS, build
from simulator.trace import Arrive, Leave, TraceError, iter_lines, parse_trace

GOOD = {"t": 1, "event": "arrive", "cluster": "c", "pod": "p", "cpu": "500m", "memory": "1Gi"}


def _parse(*objects: object) -> None:
    parse_trace(json.dumps(o) if not isinstance(o, str) else o for o in objects)


def test_a_trace_round_trips_through_its_lines() -> None:
    scenario = build("mixed", clusters=5, duration=3600, seed=2)
    again = parse_trace(iter_lines(scenario.trace))
    assert again == scenario.trace


def test_quantities_and_defaults_parse_into_a_pod() -> None:
    trace = parse_trace(
        [
            '{"format": "bigfleet-trace/v1", "duration": 600}',
            "# a comment",
            json.dumps({**GOOD, "app_class": "latency-sensitive", "reservation": {"cpu": 0.25}}),
            json.dumps({"t": 5, "event": "leave", "cluster": "c", "pod": "p"}),
        ]
    )
    assert trace.duration == 600
    arrive, leave = trace.events
    assert isinstance(arrive, Arrive) and isinstance(leave, Leave)
    assert arrive.pod.limit == (0.5, 2.0**30, 0.0)
    assert arrive.pod.reservation == (0.25, 2.0**30, 0.0)


def test_without_a_header_the_replay_ends_an_hour_after_the_last_event() -> None:
    assert parse_trace([json.dumps(GOOD)]).duration == 3601


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ("{not json", "(line)", "not JSON"),
        ({**GOOD, "t": -1}, "t", ">= 0"),
        ({**GOOD, "event": "move"}, "event", "arrive"),
        ({**GOOD, "cpu": "lots"}, "cpu", "invalid quantity"),
        ({**GOOD, "cpu": 0, "memory": 0}, "cpu", "must request"),
        ({**GOOD, "app_class": "gold"}, "app_class", "latency-sensitive"),
        ({**GOOD, "priority": "high"}, "priority", "integer"),
        ({**GOOD, "colour": "red"}, "colour", "unknown field"),
        ({**GOOD, "reservation": {"cpu": 2}}, "reservation", "exceeds the limit"),
        (
            {**GOOD, "requirements": [{"key": "k", "operator": "Near"}]},
            "requirements[0].operator",
            "Near",
        ),
        (
            {**GOOD, "requirements": [{"key": "k", "operator": "In"}]},
            "requirements[0].values",
            "at least one",
        ),
        ({**GOOD, "spread": [{"topology_key": "z", "max_skew": 0}]}, "spread[0].max_skew", ">= 1"),
        ({**GOOD, "colocation": "g"}, "colocation_key", "topology key"),
        ({**GOOD, "interruption_penalty": -1}, "interruption_penalty", ">= 0"),
        ({"t": 1, "event": "leave", "cluster": "c"}, "pod", "non-empty string"),
    ],
)
def test_a_bad_line_is_refused_naming_its_line_field_and_reason(
    line: object, field: str, reason: str
) -> None:
    with pytest.raises(TraceError) as caught:
        _parse({"format": "bigfleet-trace/v1"}, GOOD, line)
    assert caught.value.line == 3
    assert caught.value.field == field
    assert reason in str(caught.value)
    assert str(caught.value).startswith("trace line 3: ")


def test_events_out_of_time_order_are_refused() -> None:
    with pytest.raises(TraceError, match="trace line 2: t: 0 is earlier"):
        _parse({**GOOD, "t": 5}, {**GOOD, "t": 0, "pod": "q"})


def test_a_header_after_events_is_refused() -> None:
    with pytest.raises(TraceError, match="line 2: format"):
        _parse(GOOD, {"format": "bigfleet-trace/v1"})


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_is_deterministic_in_its_seed(name: str) -> None:
    a = build(name, clusters=3, duration=3600, seed=4)
    b = build(name, clusters=3, duration=3600, seed=4)
    assert a == b
    assert a.trace.events, "a scenario that generates nothing tests nothing"
    assert build(name, clusters=3, duration=3600, seed=5).trace != a.trace
