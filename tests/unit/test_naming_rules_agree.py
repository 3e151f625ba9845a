"""The provider boundary and the shard apply the same naming rules to the same ids.

Providers import only the wire, so ``providers.validation`` restates the
rules of ``shard_engine.names``; this checks that the two never drift apart.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from providers import validation
from providers.errors import InvalidArgument
from providers.model import FencingToken
from shard_engine.names import cluster_id_problem, machine_id_problem

SAMPLES = [
    "",
    " ",
    "c1",
    "cluster-prod-eu",
    "Prod",
    "a.b",
    "a..b",
    "-a",
    "a\x00",
    "i-0a1b2c3d4e5f60718",
    "SN-3F2A9C11B7E0",
    "x" * 253,
    "x" * 254,
    "mé",
    "a/b",
]


def _provider_accepts(check: object, value: str) -> bool:
    try:
        check(value)  # type: ignore[operator]
    except InvalidArgument:
        return False
    return True


@pytest.mark.parametrize("value", SAMPLES)
def test_cluster_ids_are_judged_alike(value: str) -> None:
    assert _provider_accepts(validation.cluster_id, value) == (cluster_id_problem(value) is None)


@pytest.mark.parametrize("value", SAMPLES)
def test_machine_ids_are_judged_alike(value: str) -> None:
    assert _provider_accepts(validation.machine_id, value) == (machine_id_problem(value) is None)


@given(st.text(max_size=300))
def test_any_text_is_judged_alike(value: str) -> None:
    assert _provider_accepts(validation.cluster_id, value) == (cluster_id_problem(value) is None)
    assert _provider_accepts(validation.machine_id, value) == (machine_id_problem(value) is None)


def test_a_shard_id_follows_the_machine_id_rule() -> None:
    assert validation.token(FencingToken("shard-0", 1, 1)) is not None
    with pytest.raises(InvalidArgument):
        validation.token(FencingToken("shard 0", 1, 1))
