"""Dealing a fleet-wide count budget to shards: the expected shares are worked out by hand.

A share is at least what a shard drains now; what is left of the cap goes to
the shards below their fair part (cap x their machines in scope / all machines
in scope), in proportion to how far below; remainders by largest fraction,
ties by shard id.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_engine.coordination import CountUse, deal_count, grant_count


def test_an_idle_fleet_is_dealt_in_proportion_to_the_machines_in_scope() -> None:
    # 10 over 60 + 40 machines: fair parts 6 and 4.
    assert deal_count(10, [CountUse("a", 60, 0), CountUse("b", 40, 0)]) == {"a": 6, "b": 4}


def test_a_shard_keeps_its_drains_in_flight_and_the_rest_goes_to_the_others() -> None:
    # b drains 7 (over its fair 4): it keeps 7; a gets the 3 left, not its fair 6.
    assert deal_count(10, [CountUse("a", 60, 0), CountUse("b", 40, 7)]) == {"a": 3, "b": 7}


def test_what_is_left_goes_in_proportion_to_how_far_below_its_fair_part_each_shard_is() -> None:
    # cap 4 over 30 + 10: fair 3 and 1. a drains 1, so 3 are left; a is 2 below, b 1.
    assert deal_count(4, [CountUse("a", 30, 1), CountUse("b", 10, 0)]) == {"a": 3, "b": 1}


def test_remainders_go_to_the_largest_fractions_then_by_shard_id() -> None:
    # 5 over three equal shards: 5/3 each, so 1 each and the 2 left to a and b.
    uses = [CountUse("c", 10, 0), CountUse("b", 10, 0), CountUse("a", 10, 0)]
    assert deal_count(5, uses) == {"a": 2, "b": 2, "c": 1}


def test_with_no_machine_in_scope_the_cap_is_dealt_in_equal_parts() -> None:
    assert deal_count(3, [CountUse("a", 0, 0), CountUse("b", 0, 0)]) == {"a": 2, "b": 1}


def test_drains_over_the_cap_are_kept_and_nothing_new_is_dealt() -> None:
    # After a restart or a lowered cap: 3 in flight under a cap of 2.
    assert deal_count(2, [CountUse("a", 5, 3), CountUse("b", 5, 0)]) == {"a": 3, "b": 0}


def test_a_cap_of_zero_deals_nothing() -> None:
    assert deal_count(0, [CountUse("a", 5, 0), CountUse("b", 5, 0)]) == {"a": 0, "b": 0}


def test_bad_input_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="cap: -1 is negative"):
        deal_count(-1, [CountUse("a", 1, 0)])
    with pytest.raises(ValueError, match="uses: a shard appears twice"):
        deal_count(1, [CountUse("a", 1, 0), CountUse("a", 2, 0)])


def test_a_grant_leaves_room_for_what_the_other_shards_were_granted() -> None:
    # a held 6 of 10 when its scope shrank; b's dealt 8 must wait for a to ask again.
    uses = [CountUse("a", 20, 0), CountUse("b", 80, 0)]
    assert grant_count(10, uses, asking="b", granted={"a": 6}) == 4
    assert grant_count(10, uses, asking="a", granted={"b": 4}) == 2
    assert grant_count(10, uses, asking="b", granted={"a": 2}) == 8


def test_a_grant_is_never_below_what_the_shard_drains() -> None:
    uses = [CountUse("a", 50, 2), CountUse("b", 50, 0)]
    assert grant_count(3, uses, asking="a", granted={"b": 3}) == 2


_uses = st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 20)), min_size=1, max_size=8).map(
    lambda xs: [CountUse(f"s{i}", n, d) for i, (n, d) in enumerate(xs)]
)


@given(cap=st.integers(0, 200), uses=_uses)
def test_shares_sum_to_the_cap_and_keep_every_drain(cap: int, uses: list[CountUse]) -> None:
    shares = deal_count(cap, uses)
    assert all(shares[u.shard_id] >= u.draining for u in uses)
    draining = sum(u.draining for u in uses)
    assert sum(shares.values()) == max(cap, draining)


@given(cap=st.integers(0, 200), uses=_uses, order=st.randoms())
def test_grants_in_any_order_never_sum_past_the_cap(
    cap: int, uses: list[CountUse], order: object
) -> None:
    if sum(u.draining for u in uses) > cap:
        return
    granted: dict[str, int] = {}
    askers = [u.shard_id for u in uses] * 3
    order.shuffle(askers)  # type: ignore[attr-defined]
    for shard in askers:
        granted[shard] = grant_count(cap, uses, asking=shard, granted=granted)
        assert sum(granted.values()) <= cap


def test_what_is_left_goes_first_to_the_shards_with_drains_held_back() -> None:
    # Only b has drains waiting: it gets both, though a has as many machines.
    uses = [CountUse("a", 10, 0, held=0), CountUse("b", 10, 0, held=3)]
    assert deal_count(2, uses) == {"a": 0, "b": 2}


def test_shards_with_drains_held_back_are_served_furthest_below_their_fair_part_first() -> None:
    # cap 3, equal scopes: a (wants 1) and b tie, a by id; a is then served, b takes the rest.
    uses = [CountUse("a", 10, 0, held=1), CountUse("b", 10, 0, held=5)]
    assert deal_count(3, uses) == {"a": 1, "b": 2}


def test_room_nobody_asked_for_is_dealt_by_fair_part() -> None:
    # cap 4: a's one held drain first; the 3 left go to b, a, b (furthest below 2 each).
    uses = [CountUse("a", 10, 0, held=1), CountUse("b", 10, 0, held=0)]
    assert deal_count(4, uses) == {"a": 2, "b": 2}


def test_a_share_is_not_dealt_again_until_its_shard_has_dropped_it() -> None:
    # cap 1. a drains under its share of 1; it asks, with nothing draining at that
    # instant, while b has a drain held back: the deal moves the 1 to b, a is granted 0.
    asked = [CountUse("a", 10, 0, in_force=1), CountUse("b", 10, 0, held=1)]
    assert grant_count(1, asked, asking="a", granted={}) == 0
    # Until a has applied its 0 it may start a drain under its 1: b gets nothing yet.
    assert grant_count(1, asked, asking="b", granted={"a": 0}) == 0
    # a asks again, its 0 applied (nothing started meanwhile): now b gets the 1.
    dropped = [CountUse("a", 10, 0, in_force=0), CountUse("b", 10, 0, held=1)]
    assert grant_count(1, dropped, asking="a", granted={"b": 0}) == 0
    assert grant_count(1, dropped, asking="b", granted={"a": 0}) == 1


@settings(max_examples=400)
@given(
    cap=st.integers(0, 3),
    shards=st.integers(2, 3),
    events=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 2)), max_size=40),
)
def test_shares_applied_late_never_let_the_shards_drain_past_the_cap(
    cap: int, shards: int, events: list[tuple[bool, int, int]]
) -> None:
    """Each shard drains up to the share it has applied; an answer is applied some time
    after it was granted. The shares in force never sum past the cap."""
    names = [f"s{i}" for i in range(shards)]
    in_force = dict.fromkeys(names, 0)
    answered: dict[str, int] = {}
    granted: dict[str, int] = {}
    census: dict[str, CountUse] = {}
    for asks, who, wants in events:
        shard = names[who % shards]
        if asks:  # its census, as it stands, then its grant
            census[shard] = CountUse(shard, 10, 0, held=wants, in_force=in_force[shard])
            uses = [census[s] for s in names if s in census]
            granted[shard] = answered[shard] = grant_count(cap, uses, asking=shard, granted=granted)
        elif shard in answered:  # its answer applied
            in_force[shard] = answered.pop(shard)
        assert sum(in_force.values()) <= cap, (in_force, granted)
