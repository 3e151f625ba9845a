"""The naming rules for identifiers from outside: what passes, and the reason when not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shard_engine.names import (
    cluster_id_problem,
    label_key_problem,
    label_value_problem,
    machine_id_problem,
    selector_value_problem,
    shown,
)


@pytest.mark.parametrize(
    "value", ["c1", "cluster-prod-eu", "kwok-cluster-12", "a.b-c.d", "0", "x" * 253]
)
def test_dns_1123_subdomains_are_cluster_ids(value: str) -> None:
    assert cluster_id_problem(value) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        ("   ", "only whitespace"),
        ("c 1", "whitespace at position 1"),
        ("c1\x00", "control character '\\x00' at position 2"),
        ("x" * 10_000, "10000 characters long; at most 253"),
        ("Prod", "not a DNS-1123 subdomain"),
        ("-c1", "not a DNS-1123 subdomain"),
        ("c1.", "not a DNS-1123 subdomain"),
        ("c_1", "not a DNS-1123 subdomain"),
        ("ç1", "not a DNS-1123 subdomain"),
    ],
)
def test_other_cluster_ids_are_refused_with_the_reason(value: str, reason: str) -> None:
    problem = cluster_id_problem(value)
    assert problem is not None and reason in problem
    assert len(problem) < 200


@pytest.mark.parametrize(
    "value",
    ["cpu", "nvidia.com/gpu", "hugepages-2Mi", "topology.kubernetes.io/zone", "a_b.C-d"],
)
def test_qualified_names_are_label_keys_and_resource_names(value: str) -> None:
    assert label_key_problem(value) is None


@pytest.mark.parametrize(
    "value",
    ["", "/gpu", "nvidia.com/", "Nvidia.com/gpu", "a/b/c", "x" * 64, "p/" + "x" * 64, "a\x00"],
)
def test_other_label_keys_are_refused(value: str) -> None:
    assert label_key_problem(value) is not None


@pytest.mark.parametrize("value", ["", "us-east-1a", "NVIDIA-A10G", "m5.large", "x" * 63])
def test_label_values_follow_the_kubernetes_rule(value: str) -> None:
    assert label_value_problem(value) is None


@pytest.mark.parametrize("value", ["a b", "x" * 64, "-a", "a\x00", "ü"])
def test_other_label_values_are_refused(value: str) -> None:
    assert label_value_problem(value) is not None


def test_selector_values_are_bounded_but_otherwise_free() -> None:
    assert selector_value_problem("any value: at all!") is None
    assert selector_value_problem("") is None
    assert selector_value_problem("a\x00") is not None
    assert selector_value_problem("v" * 254) is not None


@pytest.mark.parametrize("value", ["i-0a1b2c3d4e5f60718", "SN-3F2A9C11B7E0", "sim-a-z-m5-od-001"])
def test_provider_machine_ids_of_every_known_format_pass(value: str) -> None:
    assert machine_id_problem(value) is None


@pytest.mark.parametrize("value", ["", " ", "m 1", "m\x001", "m" * 254, "mé"])
def test_machine_ids_that_cannot_be_node_names_or_keys_are_refused(value: str) -> None:
    assert machine_id_problem(value) is not None


@given(st.text(max_size=300))
def test_every_check_answers_a_short_reason_or_none_for_any_text(value: str) -> None:
    for check in (cluster_id_problem, label_key_problem, label_value_problem, machine_id_problem):
        problem = check(value)
        assert problem is None or (0 < len(problem) < 800)  # 40 characters, escaped


def test_shown_cuts_long_values() -> None:
    assert shown("abc") == "'abc'"
    assert shown("x" * 1000).endswith("(1000 characters)")
