"""The resource algebra of seed 001, as laws over generated vectors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.model import AppClass
from shard_engine.resources import InvalidResource, ResourceEnvelope, ResourceVec

NAMES = ("cpu", "memory", "ephemeral-storage", "nvidia.com/gpu", "pods")

vectors = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 10**15), max_size=5).map(
    ResourceVec.from_milli
)


@given(vectors)
def test_covers_is_reflexive(a: ResourceVec) -> None:
    assert a.covers(a)


@given(vectors, vectors)
def test_covers_is_antisymmetric(a: ResourceVec, b: ResourceVec) -> None:
    if a.covers(b) and b.covers(a):
        assert a == b


@given(vectors, vectors, vectors)
def test_covers_is_transitive(a: ResourceVec, b: ResourceVec, c: ResourceVec) -> None:
    big, mid, small = a + b + c, a + b, a
    assert big.covers(mid) and mid.covers(small) and big.covers(small)
    if a.covers(b) and b.covers(c):
        assert a.covers(c)


@given(vectors, vectors)
def test_adding_then_subtracting_gives_back_the_other_summand(
    a: ResourceVec, b: ResourceVec
) -> None:
    assert (a + b) - a == b


@given(vectors, vectors)
def test_addition_commutes_and_covers_both_summands(a: ResourceVec, b: ResourceVec) -> None:
    assert a + b == b + a
    assert (a + b).covers(a) and (a + b).covers(b)


@given(vectors, vectors)
def test_saturating_subtraction_never_goes_negative(a: ResourceVec, b: ResourceVec) -> None:
    difference = a.saturating_sub(b)
    assert all(amount >= 0 for _, amount in difference)
    assert a.covers(difference)
    assert (difference + b).covers(a)


@given(vectors, vectors, st.sampled_from(list(AppClass)))
def test_reservation_plus_reclaimable_is_the_limit(
    a: ResourceVec, b: ResourceVec, app: AppClass
) -> None:
    limit = a + b
    for envelope in (
        ResourceEnvelope(limit=limit, reservation=a),
        ResourceEnvelope.for_workload(limit, app),
    ):
        assert envelope.reservation + envelope.reclaimable() == envelope.limit
        assert envelope.limit.covers(envelope.reclaimable())


def test_best_effort_reserves_nothing_and_batch_reserves_its_limit() -> None:
    limit = ResourceVec.of(cpu=4, memory=2**30)
    assert ResourceEnvelope.for_workload(limit, AppClass.BEST_EFFORT).reservation.is_zero()
    assert ResourceEnvelope.for_workload(limit, AppClass.BATCH).reclaimable().is_zero()
    latency = ResourceEnvelope.for_workload(limit, AppClass.LATENCY_SENSITIVE)
    assert latency.reservation == limit


def test_a_reservation_above_the_limit_is_refused() -> None:
    with pytest.raises(InvalidResource, match="reservation"):
        ResourceEnvelope(limit=ResourceVec.of(cpu=1), reservation=ResourceVec.of(cpu=2))


@given(vectors, vectors)
def test_dominant_share_is_the_largest_fraction(a: ResourceVec, capacity: ResourceVec) -> None:
    share = a.dominant_share(capacity)
    if a.is_zero():
        assert share == 0
    elif not capacity.covers(ResourceVec.from_milli({n: 1 for n in a.names()})):
        assert share == math.inf
    else:
        assert share == max(a.milli(n) / capacity.milli(n) for n in a.names())


def test_an_accelerator_is_the_dominant_resource_whenever_requested() -> None:
    demand = ResourceVec.of(cpu=60, memory=1, **{"nvidia.com/gpu": 1})
    assert demand.dominant_resource(ResourceVec.of(cpu=64, **{"nvidia.com/gpu": 8})) == (
        "nvidia.com/gpu"
    )


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, "4"])
def test_poisonous_amounts_are_refused_naming_the_resource(bad: object) -> None:
    with pytest.raises(InvalidResource, match=r"\[cpu\]"):
        ResourceVec.from_mapping({"cpu": bad})  # type: ignore[dict-item]


def test_canonical_floats_round_up_to_milli_units() -> None:
    assert ResourceVec.of(cpu=0.0001).milli("cpu") == 1
    assert ResourceVec.of(cpu=0.1).milli("cpu") == 100
    assert ResourceVec.of(cpu=1.5).get("cpu") == 1.5
