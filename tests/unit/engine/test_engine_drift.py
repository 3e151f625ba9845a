"""Drift between providers, the ownership record and the engine: what the reconcile loop repairs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shard_engine.drift import (
    BOUND_STATES,
    Believed,
    Listed,
    Recorded,
    RepairKind,
    find_drift,
)
from shard_engine.model import MachineState

S = MachineState
NOW = 10_000.0


def _drift(
    listed: list[Listed],
    *,
    recorded: dict[str, Recorded] | None = None,
    owners: dict[str, str] | None = None,
    believed: dict[str, Believed] | None = None,
    in_flight_since: dict[str, float] | None = None,
    busy: set[str] | frozenset[str] = frozenset(),
    held: set[str] | frozenset[str] = frozenset(),
) -> list[tuple[RepairKind, str, str, str]]:
    recorded = recorded if recorded is not None else {}
    repairs = find_drift(
        listed=listed,
        listed_providers={"p"},
        recorded=recorded,
        owners=owners if owners is not None else dict.fromkeys(recorded, "s1"),
        believed=believed or {},
        in_flight_since=in_flight_since or {},
        busy=busy,
        held=held,
        now=NOW,
        stale_after_s=30.0,
    )
    return [(r.kind, r.machine_id, r.before, r.after) for r in repairs]


def test_a_leaked_machine_is_recorded_and_released_for_planning() -> None:
    """Configured at the provider, no binding recorded, held in flight by a workflow
    that ended without settling it: the issue's leaked machine."""
    drift = _drift(
        [Listed("m1", "p", S.CONFIGURED, "c1")],
        recorded={"m1": Recorded("m1", "p", None)},
        believed={"m1": Believed(S.CONFIGURED, "c1")},
        in_flight_since={"m1": NOW - 600},
    )
    assert (RepairKind.BINDING_RECORDED, "m1", "(none)", "c1") in drift
    assert [d[0] for d in drift].count(RepairKind.STALE_FLIGHT) == 1


def test_a_machine_with_a_running_workflow_is_left_to_that_workflow() -> None:
    assert (
        _drift(
            [Listed("m1", "p", S.CONFIGURING, "c1")],
            recorded={"m1": Recorded("m1", "p", None)},
            in_flight_since={"m1": NOW - 600},
            busy={"m1"},
        )
        == []
    )


def test_a_young_flight_is_not_judged_stale() -> None:
    drift = _drift(
        [Listed("m1", "p", S.IDLE)],
        recorded={"m1": Recorded("m1", "p", None)},
        believed={"m1": Believed(S.IDLE)},
        in_flight_since={"m1": NOW - 5},
    )
    assert drift == []


def test_a_binding_the_provider_no_longer_has_is_cleared() -> None:
    drift = _drift(
        [Listed("m1", "p", S.IDLE)],
        recorded={"m1": Recorded("m1", "p", "c1")},
        believed={"m1": Believed(S.IDLE)},
    )
    assert drift == [(RepairKind.BINDING_CLEARED, "m1", "c1", "(none)")]


def test_a_machine_bound_elsewhere_at_the_provider_is_recorded_with_that_cluster() -> None:
    drift = _drift(
        [Listed("m1", "p", S.DRAINING, "c2")],
        recorded={"m1": Recorded("m1", "p", "c1")},
        believed={"m1": Believed(S.DRAINING, "c2")},
    )
    assert drift == [(RepairKind.BINDING_RECORDED, "m1", "c1", "c2")]


def test_a_machine_nobody_owns_is_reported_unless_it_is_only_a_slot() -> None:
    drift = _drift([Listed("m1", "p", S.CONFIGURED, "c9"), Listed("m2", "p", S.SPECULATIVE)])
    assert drift == [(RepairKind.UNOWNED, "m1", "owned by no shard", "CONFIGURED for c9")]


def test_another_shards_machine_is_none_of_our_business() -> None:
    drift = _drift([Listed("m1", "p", S.CONFIGURED, "c9")], owners={"m1": "s2"})
    assert drift == []


def test_an_owned_machine_its_provider_stopped_listing_is_reported_as_vanished() -> None:
    drift = _drift([], recorded={"m1": Recorded("m1", "p", "c1")})
    assert drift == [
        (RepairKind.VANISHED, "m1", "owned, bound to c1", "not listed by its provider")
    ]
    # A provider whose List failed is not judged at all.
    repairs = find_drift(
        listed=[],
        listed_providers=set(),
        recorded={"m1": Recorded("m1", "p", "c1")},
        owners={},
        believed={},
        in_flight_since={},
        busy=(),
        now=NOW,
        stale_after_s=30.0,
    )
    assert repairs == ()


def test_an_engine_that_missed_a_change_is_refreshed_but_held_machines_are_not() -> None:
    listed = [Listed("m1", "p", S.CONFIGURED, "c1"), Listed("m2", "p", S.CONFIGURING, "c1")]
    recorded = {"m1": Recorded("m1", "p", "c1"), "m2": Recorded("m2", "p", "c1")}
    believed = {"m1": Believed(S.CONFIGURING, "c1"), "m2": Believed(S.FAILED)}
    drift = _drift(listed, recorded=recorded, believed=believed, held={"m2"})
    assert drift == [(RepairKind.ENGINE_REFRESHED, "m1", "CONFIGURING for c1", "CONFIGURED for c1")]


_STATES = st.sampled_from(list(MachineState))


@given(
    st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4),
        st.tuples(_STATES, st.sampled_from(["c1", "c2"])),
        max_size=20,
    )
)
def test_when_everything_agrees_there_is_nothing_to_repair(
    machines: dict[str, tuple[MachineState, str]],
) -> None:
    listed, recorded, believed = [], {}, {}
    for mid, (state, cluster) in machines.items():
        bound = cluster if state in BOUND_STATES else ""
        listed.append(Listed(mid, "p", state, bound))
        recorded[mid] = Recorded(mid, "p", bound or None)
        believed[mid] = Believed(state, bound)
    assert _drift(listed, recorded=recorded, believed=believed) == []


def test_a_row_naming_this_shard_that_it_does_not_hold_is_adopted() -> None:
    """A hand-over moved the row to this shard and its receiving step never ran."""
    repairs = find_drift(
        listed=[Listed("m9", "p", S.CONFIGURED, "c1")],
        listed_providers={"p"},
        recorded={},
        owners={"m9": "s1"},
        believed={},
        in_flight_since={},
        busy=(),
        unheld={"m9": Recorded("m9", "p", "c1")},
        now=NOW,
        stale_after_s=30.0,
    )
    assert [(r.kind, r.machine_id, r.after) for r in repairs] == [
        (RepairKind.ADOPTED, "m9", "held, bound to c1")
    ]


def test_without_unheld_rows_nothing_is_adopted() -> None:
    drift = _drift(
        [Listed("m1", "p", S.IDLE)],
        recorded={"m1": Recorded("m1", "p", None)},
        believed={"m1": Believed(S.IDLE)},
    )
    assert RepairKind.ADOPTED not in [d[0] for d in drift]
