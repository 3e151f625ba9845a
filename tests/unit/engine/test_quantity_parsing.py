"""Kubernetes quantities as the engine reads them: canonical units and clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.quantity import InvalidQuantity, format_quantity, parse_quantity, parse_resources


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("4Gi", 4 * 2**30),
        ("1.5", 1.5),
        ("2e3", 2000.0),
        ("1k", 1000.0),
        ("128Mi", 128 * 2**20),
        ("0", 0.0),
        (".5", 0.5),
        ("100n", 100e-9),
    ],
)
def test_quantities_parse_into_canonical_units(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "-1", "4GB", "abc", "1..2", "Gi", "1e", "nan", "inf"])
def test_unparseable_quantities_are_refused_with_the_text_in_the_message(text: str) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_quantity(text, field="aggregate[cpu]")
    assert repr(text) in str(caught.value)
    assert "aggregate[cpu]" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("1e400", "overflows"),
        ("1E400", "overflows"),
        ("9Ei", "overflows"),
        ("1e" + "9" * 60, "overflows"),
        ("1e-400", "underflows"),
        ("0.5n", "underflows"),
        ("0.0000000001", "underflows"),
        ("1" * 65, "at most 64"),
    ],
)
def test_quantities_out_of_range_are_refused_not_turned_into_infinity_or_zero(
    text: str, reason: str
) -> None:
    with pytest.raises(InvalidQuantity, match=reason):
        parse_quantity(text)


@pytest.mark.parametrize(("text", "value"), [("8Ei", 2.0**63), ("1n", 1e-9), ("0e-999", 0.0)])
def test_the_range_bounds_themselves_are_accepted(text: str, value: float) -> None:
    assert parse_quantity(text) == value


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_as_an_invalid_quantity(text: str) -> None:
    try:
        value = parse_quantity(text)
    except InvalidQuantity as err:
        assert len(str(err)) < 600  # at most 40 characters of the text, escaped
    else:
        assert value == 0.0 or 1e-9 <= value <= 2.0**63


def test_a_bad_resource_map_names_the_resource() -> None:
    with pytest.raises(InvalidQuantity, match=r"needs\[0\]\[memory\]"):
        parse_resources({"cpu": "1", "memory": "lots"}, field="needs[0]")


@given(st.integers(0, 10**6))
def test_cpu_millicores_round_trip_through_formatting(millis: int) -> None:
    assert parse_quantity(format_quantity("cpu", millis / 1000)) == pytest.approx(millis / 1000)


@given(st.integers(0, 2**50))
def test_byte_counts_round_trip_through_formatting(count: int) -> None:
    assert parse_quantity(format_quantity("memory", float(count))) == count
