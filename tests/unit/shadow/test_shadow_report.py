"""The shadow report against a hand-computed incumbent file (tests/fixtures/shadow).

The figures below were worked out on paper from the fixture and the
decisions listed here; the window is 2026-12-01 00:00-04:00 UTC.

Incumbent, cluster web: n0 (joined the evening before) 4 h and n1 3 h of
m5.large on-demand at $0.10 = 7 h, $0.70; n2 3 h of m5.large spot, no
price in the file, priced at BigFleet's $0.04 = $0.12; n3 1.5 h of
c5.xlarge on-demand at $0.20 = $0.30.

BigFleet, cluster web: m-a 4 h and m-b 2 h of m5.large spot at $0.04 =
6 h, $0.24; m-c 99 min of c5.xlarge spot at $0.08 = 1.65 h, $0.132; m-d,
preempted from batch at 03:00, 1 h of m5.large on-demand at $0.10. Cluster
batch: m-d 00:30-03:00 = 2.5 h, $0.25.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bigfleet.decisions import Decision
from bigfleet.shadow import (
    IncumbentError,
    NodeEventKind,
    compare,
    from_kubectl_watch,
    parse_incumbent,
    to_json_lines,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "shadow"


def at(hhmm: str, day: int = 1) -> float:
    hours, minutes = (int(x) for x in hhmm.split(":"))
    return datetime(2026, 12, day, hours, minutes, tzinfo=UTC).timestamp()


def shape(instance_type: str, capacity_type: str, price: float) -> dict[str, object]:
    return {"instance_type": instance_type, "capacity_type": capacity_type, "price_per_hour": price}


def decision(when: str, kind: str, machine_id: str = "", **values: object) -> Decision:
    return Decision(
        shard_id="shard-0",
        decided_at=at(when),
        cycle=0,
        mode="shadow",
        kind=kind,
        machine_id=machine_id,
        **values,  # type: ignore[arg-type]
    )


SPOT_M5 = shape("m5.large", "spot", 0.04)
DECISIONS = [
    decision("00:00", "provision", "m-a", cluster_id="web", need_key="K1", inputs=SPOT_M5),
    decision("00:00", "provision", "m-b", cluster_id="web", need_key="K1", inputs=SPOT_M5),
    decision(
        "00:30",
        "assign",
        "m-d",
        cluster_id="batch",
        need_key="K3",
        inputs=shape("m5.large", "on-demand", 0.10),
    ),
    decision("02:00", "reclaim", "m-b", cluster_id="web", inputs=SPOT_M5),
    decision("02:20", "unmet", cluster_id="web", need_key="K2", reason="no matching supply"),
    decision(
        "02:21",
        "provision",
        "m-c",
        cluster_id="web",
        need_key="K2",
        inputs=shape("c5.xlarge", "spot", 0.08),
    ),
    decision(
        "03:00",
        "preempt",
        "m-d",
        cluster_id="batch",
        need_key="K2",
        inputs=dict(shape("m5.large", "on-demand", 0.10), preemptor_cluster="web"),
    ),
]


@pytest.mark.parametrize("name", ["incumbent.jsonl", "incumbent.csv"])
def test_the_report_matches_the_hand_computed_figures(name: str) -> None:
    incumbent = parse_incumbent((FIXTURES / name).read_text())

    report = compare(DECISIONS, incumbent, since=at("00:00"), until=at("04:00"))

    batch, web = report.clusters
    assert web.cluster == "web"
    assert [(u.instance_type, u.capacity_type, u.machine_hours, u.cost) for u in web.incumbent] == [
        ("c5.xlarge", "on-demand", 1.5, 0.3),
        ("m5.large", "on-demand", 7.0, 0.7),
        ("m5.large", "spot", 3.0, 0.12),
    ]
    assert [(u.instance_type, u.capacity_type, u.machine_hours, u.cost) for u in web.bigfleet] == [
        ("c5.xlarge", "spot", 1.65, 0.132),
        ("m5.large", "on-demand", 1.0, 0.1),
        ("m5.large", "spot", 6.0, 0.24),
    ]
    assert web.incumbent_cost == pytest.approx(1.12)
    assert web.bigfleet_cost == pytest.approx(0.472)
    assert web.incumbent_hours == pytest.approx(11.5)
    assert web.bigfleet_hours == pytest.approx(8.65)
    assert [(u.machine_hours, u.cost) for u in batch.bigfleet] == [(2.5, 0.25)]
    assert batch.incumbent == ()


def test_each_unmet_interval_says_who_covered_it_first() -> None:
    incumbent = parse_incumbent((FIXTURES / "incumbent.jsonl").read_text())

    report = compare(DECISIONS, incumbent, since=at("00:00"), until=at("04:00"), cluster="web")

    [web] = report.clusters
    assert [
        (r.need_key, r.unmet_at, r.bigfleet_at, r.incumbent_at, r.first) for r in web.races
    ] == [
        ("K1", at("00:00"), at("00:00"), at("00:00"), "tie"),  # n1 joined the same instant
        ("K2", at("02:20"), at("02:21"), at("02:30"), "bigfleet"),  # n3 came 9 min later
        ("K2", at("03:00"), at("03:00"), None, "bigfleet"),  # 39 min quiet: a new interval
    ]
    assert "K2 at 2026-12-01 02:20:00: bigfleet 2026-12-01 02:21:00" in report.render()


def test_an_incumbent_node_with_no_known_price_is_listed_as_unpriced() -> None:
    incumbent = parse_incumbent(
        '{"time": 0, "cluster": "c", "node": "x", "event": "join",'
        ' "instance_type": "z9.huge", "capacity_type": "spot"}\n'
    )

    [cluster] = compare([], incumbent, since=0, until=3600).clusters

    [usage] = cluster.incumbent
    assert not usage.priced
    assert "unpriced" in compare([], incumbent, since=0, until=3600).render()


@pytest.mark.parametrize(
    ("content", "line", "field", "reason"),
    [
        (
            '{"time": "2026-12-01T00:00:00", "cluster": "c", "node": "n", "event": "leave"}',
            1,
            "time",
            "no time zone",
        ),
        ('{"time": 1, "cluster": "c", "node": "n", "event": "joined"}', 1, "event", "'joined'"),
        (
            '{"time": 1, "cluster": "c", "node": "n", "event": "join", "capacity_type": "spot"}',
            1,
            "instance_type",
            "missing",
        ),
        (
            '{"time": 1, "cluster": "c", "node": "n", "event": "join", "instance_type": "m",'
            ' "capacity_type": "cheap"}',
            1,
            "capacity_type",
            "'cheap'",
        ),
        (
            '{"time": 1, "cluster": "c", "node": "n", "event": "leave", "price_per_hour": -1}',
            1,
            "price_per_hour",
            ">= 0",
        ),
        ('{"time": 1, "cluster": "c", "node": "n", "event": "leave"}\n{oops', 2, "json", ""),
        ("when,cluster,node,event\n", 1, "header", "['time']"),
    ],
)
def test_a_bad_line_names_its_number_field_and_reason(
    content: str, line: int, field: str, reason: str
) -> None:
    with pytest.raises(IncumbentError) as caught:
        parse_incumbent(content)

    assert (caught.value.line, caught.value.field) == (line, field)
    assert reason in caught.value.reason


def test_a_kubectl_watch_export_converts_to_joins_and_leaves() -> None:
    events = from_kubectl_watch((FIXTURES / "kubectl-watch.json").read_text(), cluster="web")

    assert [(e.node, e.event, e.instance_type, e.capacity_type, e.time) for e in events] == [
        ("ip-10-0-1-5.ec2.internal", NodeEventKind.JOIN, "m5.large", "spot", at("00:00")),
        ("ip-10-0-2-9.ec2.internal", NodeEventKind.JOIN, "c5.xlarge", "on-demand", at("00:30")),
        ("ip-10-0-1-5.ec2.internal", NodeEventKind.LEAVE, "", "", at("02:00")),
    ]
    assert parse_incumbent(to_json_lines(events)) == events


def test_a_watch_without_event_types_is_refused_with_the_flag_to_add() -> None:
    with pytest.raises(IncumbentError, match="--output-watch-events"):
        from_kubectl_watch('{"kind": "Node", "metadata": {"name": "n"}}', cluster="web")


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="until: must be after since"):
        compare([], [], since=10, until=10)
