"""Disruption budgets as values: cron windows, caps, scopes, reasons, parsing errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shard_engine.budgets import (
    Budget,
    BudgetError,
    CronSchedule,
    DrainReason,
    Scope,
    Subject,
    Window,
    admit,
    parse_budgets,
    use_of,
)


def at(text: str) -> float:
    """Epoch seconds of an ISO time in UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


GPU = Subject("p4d.24xlarge", "on-demand", frozenset({"cpu", "nvidia.com/gpu"}), "train-a")
CPU = Subject("m5.large", "spot", frozenset({"cpu", "memory"}), "web-a")

WEEKDAY_HOURS = Window(CronSchedule.parse("0 8 * * 1-5"), 10 * 3600)


# -- windows ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "open_"),
    [
        ("2026-12-01T07:59:59", False),  # a Tuesday, before the window
        ("2026-12-01T08:00:00", True),
        ("2026-12-01T12:30:00", True),
        ("2026-12-01T17:59:59", True),
        ("2026-12-01T18:00:00", False),  # duration over
        ("2026-12-05T10:00:00", False),  # Saturday
        ("2026-12-07T09:00:00", True),  # Monday
    ],
)
def test_a_weekday_window_is_open_from_its_start_for_its_duration(moment: str, open_: bool) -> None:
    assert WEEKDAY_HOURS.open_at(at(moment)) is open_


def test_a_window_that_opened_yesterday_evening_is_still_open_after_midnight() -> None:
    night = Window(CronSchedule.parse("0 22 * * *"), 8 * 3600)

    assert night.open_at(at("2026-12-02T03:00:00"))
    assert not night.open_at(at("2026-12-02T06:00:00"))


def test_steps_lists_and_sunday_as_seven() -> None:
    schedule = CronSchedule.parse("*/15 9,17 * * 7")

    assert schedule.minutes == frozenset({0, 15, 30, 45})
    assert schedule.hours == frozenset({9, 17})
    assert schedule.weekdays == frozenset({0})


def test_when_both_day_fields_are_restricted_either_matches() -> None:
    schedule = CronSchedule.parse("0 0 1 * 1")  # the 1st, or any Monday

    assert schedule.day_matches(datetime(2026, 12, 1, tzinfo=UTC))  # Tuesday the 1st
    assert schedule.day_matches(datetime(2026, 12, 7, tzinfo=UTC))  # a Monday
    assert not schedule.day_matches(datetime(2026, 12, 8, tzinfo=UTC))


def test_the_next_opening_is_found_for_listings() -> None:
    opens = WEEKDAY_HOURS.opens_next(at("2026-12-04T19:00:00"))  # Friday evening

    assert opens == at("2026-12-07T08:00:00")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0 8 * *", "has 4 fields"),
        ("60 8 * * *", "minute: '60' is outside 0-59"),
        ("0 8 * * mon", "day of week: 'mon' is not a number"),
        ("*/0 * * * *", "step '0' is not a positive number"),
        ("0 9-8 * * *", "hour: '9-8' is outside 0-23"),
    ],
)
def test_a_bad_schedule_names_the_field_and_why(text: str, reason: str) -> None:
    with pytest.raises(BudgetError, match=r"^budgets.*schedule: ") as caught:
        parse_budgets([{"name": "b", "nodes": 0, "schedule": text, "duration": "1h"}])
    assert reason in str(caught.value)
    assert caught.value.field == "budgets[0].schedule"


# -- caps and admission ------------------------------------------------------------------


def test_percentages_round_up_and_counts_are_absolute() -> None:
    assert Budget("p", percent=10).cap(5) == 1
    assert Budget("p", percent=10).cap(20) == 2
    assert Budget("p", percent=10).cap(21) == 3
    assert Budget("p", percent=0).cap(100) == 0
    assert Budget("c", count=4).cap(1000) == 4


def test_drains_are_admitted_in_order_until_the_budget_is_used_up() -> None:
    budget = Budget("gpu", scope=Scope(resources=("nvidia.com/gpu",)), count=3)

    admitted, refused = admit(
        [budget],
        now=0,
        requests=[(GPU, DrainReason.RECLAIM)] * 4,
        in_scope=lambda b: 40,
        draining=lambda b: 1,  # one already draining: room for two more
    )

    assert admitted == [True, True, False, False]
    assert [(i, use.cap, use.draining) for i, use in refused] == [(2, 3, 3), (3, 3, 3)]


def test_a_budget_applies_only_to_machines_in_its_scope() -> None:
    budget = Budget("gpu", scope=Scope(resources=("nvidia.com/gpu",)), count=0)

    admitted, _ = admit(
        [budget],
        now=0,
        requests=[(CPU, DrainReason.RECLAIM), (GPU, DrainReason.RECLAIM)],
        in_scope=lambda b: 10,
        draining=lambda b: 0,
    )

    assert admitted == [True, False]


def test_preemption_is_held_only_by_a_budget_that_names_it() -> None:
    reclaim_only = Budget("quiet", count=0)
    both = Budget("strict", count=0, reasons=frozenset(DrainReason))

    free, _ = admit(
        [reclaim_only],
        now=0,
        requests=[(CPU, DrainReason.PREEMPT)],
        in_scope=lambda b: 10,
        draining=lambda b: 0,
    )
    held, refused = admit(
        [reclaim_only, both],
        now=0,
        requests=[(CPU, DrainReason.PREEMPT)],
        in_scope=lambda b: 10,
        draining=lambda b: 0,
    )

    assert free == [True]
    assert held == [False]
    assert refused[0][1].budget.name == "strict"


def test_the_budget_with_the_least_room_is_the_one_named() -> None:
    loose = Budget("loose", count=5)
    tight = Budget("tight", scope=Scope(clusters=("train-*",)), count=1)

    _, refused = admit(
        [loose, tight],
        now=0,
        requests=[(GPU, DrainReason.RECLAIM)],
        in_scope=lambda b: 10,
        draining=lambda b: 6 if b.name == "loose" else 1,
    )

    assert refused[0][1].budget.name == "loose"  # 5 - 6 = -1 < 1 - 1 = 0


def test_a_windowed_budget_holds_only_while_its_window_is_open() -> None:
    quiet_hours = Budget("office-hours", count=0, window=WEEKDAY_HOURS)

    def decide(moment: str) -> bool:
        admitted, _ = admit(
            [quiet_hours],
            now=at(moment),
            requests=[(CPU, DrainReason.RECLAIM)],
            in_scope=lambda b: 10,
            draining=lambda b: 0,
        )
        return admitted[0]

    assert decide("2026-12-01T10:00:00") is False
    assert decide("2026-12-01T18:00:00") is True


# -- parsing --------------------------------------------------------------------------


def test_budgets_parse_from_their_json_form() -> None:
    [gpu, quiet] = parse_budgets(
        [
            {
                "name": "gpu",
                "nodes": "10%",
                "reasons": ["reclaim", "preempt"],
                "scope": {"resources": ["nvidia.com/gpu"], "clusters": ["train-*"]},
            },
            {"name": "quiet", "nodes": 0, "schedule": "0 8 * * 1-5", "duration": "10h"},
        ]
    )

    assert gpu.percent == 10.0
    assert gpu.reasons == frozenset({DrainReason.RECLAIM, DrainReason.PREEMPT})
    assert gpu.scope.matches(GPU)
    assert not gpu.scope.matches(CPU)
    assert quiet.count == 0
    assert quiet.window is not None and quiet.window.duration_seconds == 36000


@pytest.mark.parametrize(
    ("item", "field", "reason"),
    [
        ({"nodes": 1}, "budgets[0].name", "non-empty string"),
        ({"name": "b"}, "budgets[0].nodes", "count (3) or a percentage"),
        ({"name": "b", "nodes": -1}, "budgets[0].nodes", "negative"),
        ({"name": "b", "nodes": "150%"}, "budgets[0].nodes", "outside 0-100"),
        ({"name": "b", "nodes": "nan%"}, "budgets[0].nodes", "not a percentage"),
        ({"name": "b", "nodes": 1, "reasons": ["drift"]}, "budgets[0].reasons[0]", "'drift'"),
        ({"name": "b", "nodes": 1, "schedule": "0 8 * * *"}, "budgets[0].schedule", "both"),
        (
            {"name": "b", "nodes": 1, "schedule": "0 8 * * *", "duration": "8 h"},
            "budgets[0].duration",
            "not a duration",
        ),
        (
            {"name": "b", "nodes": 1, "schedule": "0 8 * * *", "duration": "30d"},
            "budgets[0].duration",
            "outside 1 s to 7 days",
        ),
        ({"name": "b", "nodes": 1, "scope": {"zone": "a"}}, "budgets[0].scope.zone", "unknown"),
        (
            {"name": "b", "nodes": 1, "scope": {"capacity_types": ["cheap"]}},
            "budgets[0].scope.capacity_types[0]",
            "'cheap'",
        ),
        ({"name": "b", "nodes": 1, "window": "x"}, "budgets[0].window", "unknown field"),
    ],
)
def test_a_bad_budget_names_the_field_and_the_reason(
    item: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(BudgetError) as caught:
        parse_budgets([item])

    assert caught.value.field == field
    assert reason in caught.value.reason


def test_budget_names_are_unique() -> None:
    with pytest.raises(BudgetError, match=r"budgets\[1\].name: 'a' is used twice"):
        parse_budgets([{"name": "a", "nodes": 1}, {"name": "a", "nodes": 2}])


def test_use_counts_the_scope_and_the_drains_of_the_budgets_reasons() -> None:
    budget = Budget("gpu", scope=Scope(resources=("nvidia.com/gpu",)), percent=50)
    quiet = Budget("quiet", count=0, window=WEEKDAY_HOURS)

    gpu, night = use_of(
        [budget, quiet],
        now=at("2026-12-01T20:00:00"),
        machines=[GPU, GPU, GPU, CPU],
        draining=[
            (GPU, DrainReason.RECLAIM),
            (GPU, DrainReason.PREEMPT),
            (CPU, DrainReason.RECLAIM),
        ],
    )

    assert (gpu.in_force, gpu.machines_in_scope, gpu.cap, gpu.draining) == (True, 3, 2, 1)
    assert (night.in_force, night.machines_in_scope, night.draining) == (False, 4, 2)
