"""ShardState keeps every view of a machine consistent, whatever the change."""

from __future__ import annotations

from dataclasses import dataclass, field

from bigfleet.shard.state import ShardState, Workload
from shard_engine.engine import EngineConfig, ShardEngine
from shard_engine.model import (
    AppClass,
    MachineRecord,
    MachineState,
    Need,
    Requirement,
    Rollup,
)
from shard_engine.model import Operator as Op
from tests.rollups import apply
from tests.unit.shard.transfer_fakes import record


@dataclass
class Shown:
    """The node view's side: what the operators were told, and what was remembered."""

    pushed: list[tuple[str, MachineState, str]] = field(default_factory=list)
    remembered: dict[str, str] = field(default_factory=dict)

    def push(self, record: MachineRecord, *, cluster_hint: str = "") -> None:
        self.pushed.append((record.id, record.state, record.cluster or cluster_hint))

    def remember(self, machine_id: str, cluster_id: str) -> None:
        self.remembered[machine_id] = cluster_id


def _state() -> tuple[ShardState[ShardEngine], Shown]:
    shown = Shown()
    return ShardState(ShardEngine(EngineConfig()), clock=lambda: 100.0, nodes=shown), shown


def test_a_held_and_observed_machine_is_in_every_view() -> None:
    state, shown = _state()
    state.hold("m1", "simcloud", cluster_id="c1")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(500, "need-a"))
    assert state.owns("m1") and state.provider_of("m1") == "simcloud"
    assert state.machine("m1") is not None and state.priority("m1") == 500
    assert shown.remembered == {"m1": "c1"}
    assert shown.pushed == [("m1", MachineState.CONFIGURED, "c1")]


def test_giving_a_machine_away_removes_it_from_every_view_and_taking_it_back_restores_them() -> (
    None
):
    state, _ = _state()
    state.hold("m1", "simcloud")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(500, "need-a"))
    departure = state.give_away(["m1", "not-ours"])
    assert departure.machine_ids == ["m1"]
    assert not state.owns("m1") and state.machine("m1") is None and state.priority("m1") == 0
    state.take_back(departure)
    assert state.owns("m1") and state.machine("m1") is not None and state.priority("m1") == 500


def test_take_back_restores_only_the_machines_named() -> None:
    state, _ = _state()
    for mid in ("m1", "m2"):
        state.hold(mid, "simcloud")
        state.observe(record(mid), Workload())
    departure = state.give_away(["m1", "m2"])
    state.take_back(departure, ["m2"])
    assert not state.owns("m1") and state.machine("m1") is None
    assert state.owns("m2") and state.machine("m2") is not None


def test_a_leaving_machine_is_out_of_the_engine_but_still_owned_until_it_is_given_away() -> None:
    state, shown = _state()
    state.hold("m1", "simcloud")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(100, "n"))
    assert state.mark_leaving("m1", term=3, seq=7) is not None
    assert state.machine("m1") is None and state.owns("m1")
    assert state.leaving_for(3, 7) == ["m1"]
    # Observations while it drains reach the node view only, not the engine.
    state.observe(record("m1", MachineState.DRAINING, "c1"), Workload(100, "n"))
    assert state.machine("m1") is None and shown.pushed[-1][1] is MachineState.DRAINING
    departure = state.give_away(["m1"])
    assert not state.owns("m1") and not state.is_leaving("m1")
    state.take_back(departure)
    assert state.is_leaving("m1") and state.machine("m1") is None, "put back as it left"


def test_a_leaving_machine_that_stays_rejoins_the_engine_on_its_next_observation() -> None:
    state, _ = _state()
    state.hold("m1", "simcloud")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(100, "n"))
    state.mark_leaving("m1", term=1, seq=1)
    state.stay("m1")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(100, "n"))
    assert state.machine("m1") is not None and not state.is_leaving("m1")


def test_a_quarantined_machine_leaves_the_engine_and_its_observations_are_ignored() -> None:
    state, shown = _state()
    state.hold("m1", "simcloud")
    state.observe(record("m1"), Workload())
    state.quarantine("m1", "bad slot")
    before = len(shown.pushed)
    state.observe(record("m1"), Workload())
    assert state.machine("m1") is None and len(shown.pushed) == before
    assert state.lifecycle.is_quarantined("m1")


def test_an_outcome_declared_failed_stays_failed_while_the_provider_reports_it_moving() -> None:
    state, _ = _state()
    state.hold("m1", "simcloud")
    state.observe(record("m1"), Workload())
    state.settle("m1", state.machine("m1"), failed="deadline passed")
    seen = state.machine("m1")
    assert seen is not None and seen.state is MachineState.FAILED
    state.observe(record("m1", MachineState.CONFIGURING), Workload())
    seen = state.machine("m1")
    assert seen is not None and seen.state is MachineState.FAILED
    state.observe(record("m1", MachineState.IDLE), Workload())
    seen = state.machine("m1")
    assert seen is not None and seen.state is MachineState.IDLE, "a settled state ends it"


def test_unbinding_forgets_the_workload_and_victim_terms_come_from_the_needs_in_force() -> None:
    state, _ = _state()
    need = Need(
        requirements=(Requirement("node.kubernetes.io/instance-type", Op.IN, ("m6i.large",)),),
        aggregate={"cpu": 2.0},
        priority=500,
        interruption_penalty=3.0,
        reclamation_penalty=1.0,
        app_class=AppClass.LATENCY_SENSITIVE,
    )
    apply(state.engine, Rollup("c1", timestamp_ns=1, needs=(need,)), now=100.0)
    state.hold("m1", "simcloud")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(500, need.key))
    terms = state.victim_terms()
    assert terms["m1"].interruption_penalty == 3.0
    assert terms["m1"].app_class is AppClass.LATENCY_SENSITIVE
    assert state.need("c1", need.key) is not None
    state.observe(record("m1", MachineState.IDLE), Workload())
    assert state.priority("m1") == 0 and state.victim_terms() == {}


def test_a_machine_its_cluster_no_longer_needs_is_reported_at_priority_zero() -> None:
    # ADR 0177: a cluster's gang left; its machines echo the gang's priority, but they
    # serve nothing now. Phase 2 of their own shard already takes them for any need; the
    # report and the donor's victim choice read the same: 0, so another shard's need may
    # preempt them across the border too.
    state, _ = _state()
    need = Need(
        requirements=(Requirement("node.kubernetes.io/instance-type", Op.IN, ("m6i.large",)),),
        aggregate={"cpu": 2.0},
        priority=900_000,
    )
    apply(state.engine, Rollup("c1", timestamp_ns=1, needs=(need,)), now=100.0)
    state.hold("m1", "simcloud")
    state.observe(record("m1", MachineState.CONFIGURED, "c1"), Workload(900_000, need.key))
    state.hold("idle", "simcloud")
    state.observe(record("idle"), Workload())
    assert state.priorities()["m1"] == 900_000

    apply(state.engine, Rollup("c1", timestamp_ns=2, needs=()), now=110.0)  # the gang left

    assert state.priorities()["m1"] == 0
    assert state.priority("m1") == 900_000, "the echo still says what it was configured for"
    assert "idle" not in state.priorities()
