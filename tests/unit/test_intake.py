"""The intake between acknowledgements and the engine: newest roll-up per cluster, never older."""

from __future__ import annotations

import threading

import pytest

from bigfleet.shard.intake import Intake
from shard_engine.model import Need, Rollup
from shard_engine.needs import RollupRejected


def _rollup(cluster: str, ts: int, cpu: float = 1.0) -> Rollup:
    return Rollup(cluster, ts, (Need(requirements=(), aggregate={"cpu": cpu}, priority=1),))


def test_an_offered_rollup_is_acknowledged_and_staged() -> None:
    intake = Intake()
    assert intake.offer(_rollup("a", 1)) == "rollup"
    assert [r.cluster_id for r in intake.take_all()] == ["a"]
    assert len(intake) == 0


def test_a_newer_rollup_replaces_the_staged_one_of_its_cluster() -> None:
    intake = Intake()
    intake.offer(_rollup("a", 1, cpu=1))
    intake.offer(_rollup("b", 1))
    intake.offer(_rollup("a", 2, cpu=5))
    staged = {r.cluster_id: r for r in intake.take_all()}
    assert staged["a"].timestamp_ns == 2 and staged["a"].rollup.needs[0].aggregate["cpu"] == 5
    assert len(staged) == 2 and intake.superseded == 1


def test_an_older_rollup_is_stale_even_after_the_newer_one_was_applied() -> None:
    intake = Intake()
    intake.offer(_rollup("a", 10))
    intake.take_all()
    echo = intake.offer(_rollup("a", 5))
    assert echo.startswith("rollup-stale") and "older than 10" in echo
    assert intake.take_all() == []


def test_take_hands_out_the_oldest_staged_first_and_at_most_the_limit() -> None:
    intake = Intake()
    for i, cluster in enumerate("abcde"):
        intake.offer(_rollup(cluster, i))
    assert [r.cluster_id for r in intake.take(2)] == ["a", "b"]
    assert [r.cluster_id for r in intake.take(10)] == ["c", "d", "e"]


def test_the_ready_callback_fires_when_the_intake_stops_being_empty() -> None:
    calls: list[int] = []
    intake = Intake(on_ready=lambda: calls.append(1))
    intake.offer(_rollup("a", 1))
    intake.offer(_rollup("b", 1))
    assert calls == [1]
    intake.take_all()
    intake.offer(_rollup("c", 1))
    assert calls == [1, 1]


def test_a_forgotten_cluster_starts_afresh() -> None:
    intake = Intake()
    intake.offer(_rollup("a", 10))
    intake.forget("a")
    assert intake.take_all() == []
    assert intake.offer(_rollup("a", 1)) == "rollup"


def test_offers_from_many_threads_lose_nothing_and_keep_the_newest() -> None:
    intake = Intake()

    def offer(cluster: str) -> None:
        for ts in range(500):
            intake.offer(_rollup(cluster, ts))

    threads = [threading.Thread(target=offer, args=(f"c{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    staged = intake.take_all()
    assert sorted(r.cluster_id for r in staged) == [f"c{i}" for i in range(8)]
    assert all(r.timestamp_ns == 499 for r in staged)
    assert intake.offered == 8 * 500


def test_a_rollup_the_engine_would_refuse_is_refused_before_the_ack_and_not_staged() -> None:
    intake = Intake(clock=lambda: 1000.0)
    bad = Rollup("a", 5, (Need(requirements=(), aggregate={"cpu\x00": 1.0}, priority=1),))
    with pytest.raises(RollupRejected) as caught:
        intake.offer(bad)
    assert caught.value.field == "needs[0].aggregate"
    assert len(intake) == 0
    assert intake.offer(_rollup("a", 4)) == "rollup", "a refused stamp is not remembered"


def test_a_rollup_stamped_beyond_the_skew_bound_is_refused_and_does_not_freeze_its_cluster() -> (
    None
):
    intake = Intake(clock=lambda: 1000.0, max_skew_s=300.0)
    with pytest.raises(RollupRejected, match="ahead of the shard's clock"):
        intake.offer(_rollup("a", 1_400 * 10**9))
    assert intake.offer(_rollup("a", 999 * 10**9)) == "rollup"
    assert intake.offer(_rollup("a", 1_299 * 10**9)) == "rollup"


def _need(cpu: float, priority: int = 1) -> Need:
    return Need(requirements=(), aggregate={"cpu": cpu}, priority=priority)


def test_a_bad_row_among_rows_accepted_before_is_refused_under_its_own_index() -> None:
    intake = Intake(clock=lambda: 1000.0)
    rows = tuple(_need(1.0, priority=p) for p in range(5))
    assert intake.offer(Rollup("a", 1, rows)) == "rollup"
    bad = Need(requirements=(), aggregate={"cpu": -1.0}, priority=3)
    with pytest.raises(RollupRejected) as caught:
        intake.offer(Rollup("a", 2, (*rows[:3], bad, rows[4])))
    assert caught.value.field == "needs[3].aggregate[cpu]"
    assert len(intake) == 1, "the refused roll-up did not replace the staged one"


def test_rows_accepted_before_are_accepted_again_wherever_they_stand() -> None:
    intake = Intake(clock=lambda: 1000.0)
    rows = tuple(_need(1.0, priority=p) for p in range(4))
    intake.offer(Rollup("a", 1, rows))
    moved = (rows[3], _need(2.0, priority=9), rows[0], rows[0])
    assert intake.offer(Rollup("a", 2, moved)) == "rollup"
    [staged] = intake.take_all()
    assert staged.rollup.needs == moved


def test_a_row_accepted_for_one_cluster_is_still_checked_for_another() -> None:
    intake = Intake(clock=lambda: 1000.0)
    bad = Need(requirements=(), aggregate={"cpu": float("nan")}, priority=1)
    with pytest.raises(RollupRejected):
        intake.offer(Rollup("a", 1, (_need(1.0), bad)))
    good = _need(1.0)
    intake.offer(Rollup("a", 2, (good,)))
    with pytest.raises(RollupRejected) as caught:
        intake.offer(Rollup("b", 1, (good, bad)))
    assert caught.value.field == "needs[1].aggregate[cpu]"


def test_a_rollup_level_problem_is_found_when_every_row_was_accepted_before() -> None:
    intake = Intake(clock=lambda: 1000.0)
    rows = (_need(1.0),)
    intake.offer(Rollup("a", 1, rows))
    with pytest.raises(RollupRejected) as caught:
        intake.offer(Rollup("a", 2, rows, release=frozenset({"bad id"})))
    assert caught.value.field.startswith("release")


def test_a_cluster_that_starts_leaving_has_its_staged_rollup_dropped_and_later_ones_deferred() -> (
    None
):
    leaving: dict[str, str] = {}
    dropped: list[str] = []
    intake = Intake(deferral=lambda c: leaving.get(c, ""))
    intake.set_on_dropped(dropped.append)
    assert intake.offer(_rollup("a", 1)) == "rollup"
    assert intake.offer(_rollup("b", 1)) == "rollup"
    leaving["a"] = "cluster is moving to shard s2"
    assert intake.drop_staged("a") is True
    assert intake.drop_staged("a") is False, "nothing is dropped twice"
    echo = intake.offer(_rollup("a", 2))
    assert echo == "rollup-deferred: cluster is moving to shard s2"
    assert [r.cluster_id for r in intake.take_all()] == ["b"]
    assert dropped == ["departed"]


def test_every_offered_rollup_replaced_before_it_was_taken_is_reported_superseded() -> None:
    dropped: list[str] = []
    intake = Intake()
    intake.set_on_dropped(dropped.append)
    for ts in range(1, 6):
        intake.offer(_rollup("a", ts))
    intake.offer(_rollup("b", 1))
    taken = intake.take_all()
    assert len(taken) + len(dropped) == intake.offered == 6
    assert dropped == ["superseded"] * 4


def test_an_unchanged_resend_shares_the_validated_rows_of_the_one_before() -> None:
    intake = Intake()
    rows = (_need(1.0), _need(2.0, priority=5))
    intake.offer(Rollup("a", 1, rows))
    [first] = intake.take_all()
    intake.offer(Rollup("a", 2, rows))
    [second] = intake.take_all()
    assert second.rows is first.rows and second.merged is first.merged
    assert second.timestamp_ns == 2
