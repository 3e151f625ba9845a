"""When a shard's report goes out at once rather than at its interval (ADR 0184)."""

from __future__ import annotations

import numpy as np
import pytest

from shard_engine.model import Shortfall
from shard_engine.report_news import ReportNews


def _short(cluster: str, need: str = "n") -> Shortfall:
    return Shortfall(cluster, need, 100, {"cpu": 4.0}, 1, False, "no capacity")


def _idle(*counts: int) -> np.ndarray:
    return np.array(counts, dtype=np.int64)


def _sent(shortfalls: list[Shortfall], idle: np.ndarray, *, gap: float = 10.0) -> ReportNews:
    news = ReportNews(gap_s=gap)
    news.sent(shortfalls, idle, 100.0)
    return news


def test_a_shard_that_never_reported_has_news_until_a_report_arrives() -> None:
    news = ReportNews(gap_s=10.0)
    assert news.due([], _idle(0, 0), 0.0), "the coordinator should hear of it at once"
    news.attempted(0.0)  # no coordinator to take it: tried again after the gap
    assert not news.due([], _idle(0, 0), 5.0)
    assert news.due([], _idle(0, 0), 10.0)
    news.sent([], _idle(0, 0), 10.0)
    assert not news.due([], _idle(0, 0), 100.0)


def test_a_shortfall_not_in_the_last_report_is_news_and_a_reported_one_is_not() -> None:
    news = _sent([_short("a")], _idle(0))
    assert not news.due([_short("a")], _idle(0), 200.0), "told already: it waits its interval"
    assert not news.due([], _idle(0), 200.0), "a shortfall that ended is not news"
    assert news.due([_short("a"), _short("b")], _idle(0), 200.0)
    assert news.due([_short("a", "other need")], _idle(0), 200.0), "a need is (cluster, key)"


def test_more_idle_machines_are_news_and_fewer_are_not() -> None:
    news = _sent([], _idle(2, 0, 5))
    assert not news.due([], _idle(2, 0, 5), 200.0)
    assert not news.due([], _idle(1, 0, 3), 200.0), "fewer idle: nothing to offer"
    assert news.due([], _idle(2, 1, 5), 200.0)
    assert news.due([], _idle(0, 0, 0, 1), 200.0), "a profile the report did not know of"
    assert not news.due([], _idle(2, 0), 200.0), "a shorter count vector counts what it has"


def test_news_waits_the_gap_after_the_last_report_or_attempt() -> None:
    news = _sent([], _idle(0), gap=10.0)
    lacking = [_short("a")]
    assert not news.due(lacking, _idle(0), 109.9)
    assert news.due(lacking, _idle(0), 110.0)
    news.attempted(110.0)  # the coordinator did not answer: the next try waits the gap too
    assert not news.due(lacking, _idle(0), 115.0)
    assert news.due(lacking, _idle(0), 120.0)
    assert ReportNews(gap_s=0.0).due(lacking, _idle(0), 0.0)


def test_what_was_sent_is_a_copy_of_the_counts() -> None:
    idle = _idle(1)
    news = _sent([], idle)
    idle[0] = 3  # the engine's counters move on after the report
    assert news.due([], _idle(3), 200.0)


def test_a_negative_gap_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"gap_s: must be a number of seconds >= 0"):
        ReportNews(gap_s=-1.0)
    with pytest.raises(ValueError, match=r"gap_s"):
        ReportNews(gap_s=float("nan"))
