"""Compact identifiers: every string round-trips exactly; the ID table behaves like a dict."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shard_engine.identifiers import CompactStrings, IdTable, split

provider_ids = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda p, n, w: f"{p}{n:0{w}d}",
        st.text(max_size=12),
        st.integers(0, 10**25),
        st.integers(0, 30),
    ),
    st.builds(lambda n: f"i-{n:017x}", st.integers(0, 16**17 - 1)),
    st.builds(lambda n: f"SN-{n:012X}", st.integers(0, 16**12 - 1)),
)


@given(st.lists(provider_ids, max_size=20))
def test_every_string_round_trips_exactly(texts: list[str]) -> None:
    column = CompactStrings()
    column.ensure_rows(len(texts))
    for row, text in enumerate(texts):
        column.set(row, text)
    assert [column.get(row) for row in range(len(texts))] == texts


def test_provider_style_ids_share_one_format() -> None:
    assert split("sim-use1-m5.large-od-000123")[0] == split("sim-use1-m5.large-od-999999")[0]
    assert split("i-0a1b2c3d4e5f60718")[0] == ("i-", 17, "x")
    assert split("SN-3F2A9C11B7E0")[0] == ("SN-", 12, "X")


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from(("add", "discard")), provider_ids.filter(bool)),
        max_size=200,
    )
)
def test_the_id_table_behaves_like_a_dictionary(operations: list[tuple[str, str]]) -> None:
    table = IdTable()
    model: dict[str, int] = {}
    for op, text in operations:
        if op == "add":
            row = table.add(text)
            assert model.setdefault(text, row) == row
        elif text in model:
            table.discard(model.pop(text))
        assert len(table) == len(model)
    for text, row in model.items():
        assert table.get(text) == row
        assert table.id_of(row) == text
    assert sorted(table.live_rows()) == sorted(model.values())


def test_lookups_survive_many_inserts_and_removals() -> None:
    table = IdTable()
    rows = {f"m-{i:06d}": table.add(f"m-{i:06d}") for i in range(5000)}
    for i in range(0, 5000, 2):
        table.discard(rows.pop(f"m-{i:06d}"))
    for i in range(5000, 7000):
        rows[f"m-{i:06d}"] = table.add(f"m-{i:06d}")
    assert all(table.get(k) == v for k, v in rows.items())
    assert table.get("m-000000") is None
    assert len(table) == len(rows)
