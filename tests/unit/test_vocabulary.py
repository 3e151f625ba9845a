"""One definition per layer boundary, and the mappings between them.

Machine states are defined by the wire (``bigfleet.v1alpha1.MachineState``),
by the providers (``providers.model.State``), by the engine
(``shard_engine.model.MachineState``) and, as plain strings a workflow can
carry, by ``workflows.contracts``. Operations are named once in
``workflows.contracts`` (``OP_*``) and understood by the engine's restart
claims. These tests hold the layers to one meaning.
"""

from __future__ import annotations

import pytest

from activities.machines import state_name
from bigfleet.attribution import META_NEED, META_OPERATION_SEQ, META_PRIORITY, META_SHARD
from bigfleet.v1alpha1 import provider_pb2
from providers.model import State
from shard_engine import engine as engine_module
from shard_engine.model import MachineState
from workflows import contracts as c

STATES = [s for s in MachineState if s is not MachineState.UNSPECIFIED]
OPERATIONS = {v for k, v in vars(c).items() if k.startswith("OP_")}


@pytest.mark.parametrize("state", STATES, ids=[s.name for s in STATES])
def test_every_machine_state_means_the_same_on_the_wire_at_the_provider_and_in_the_engine(
    state: MachineState,
) -> None:
    wire = provider_pb2.MachineState.Value(f"MACHINE_STATE_{state.name}")
    assert int(state) == wire == int(State[state.name])
    assert state_name(wire) == state.name == getattr(c, state.name)


def test_the_engine_and_the_providers_know_the_same_eight_states() -> None:
    assert {s.name for s in STATES} == {s.name for s in State}
    assert len(STATES) == 8


def test_every_operation_a_workflow_runs_is_one_the_engine_can_claim_after_a_restart() -> None:
    assert set(engine_module._CLAIM_KINDS) == OPERATIONS


def test_the_attribution_keys_are_namespaced_and_distinct() -> None:
    keys = {META_SHARD, META_NEED, META_PRIORITY, META_OPERATION_SEQ}
    assert all(k.startswith("bigfleet.io/") for k in keys) and len(keys) == 4


def test_transfer_kinds_keep_the_names_recorded_histories_and_the_instruction_log_hold() -> None:
    from workflows.coordinator_contracts import TransferKind

    assert [k.value for k in TransferKind] == ["idle", "speculative", "preempt"]


def test_every_operator_signal_is_a_signal_of_every_per_machine_workflow() -> None:
    from temporalio.workflow import _Definition

    from workflows.delete import DeleteWorkflow
    from workflows.drain import DrainWorkflow
    from workflows.recover import RecoverWorkflow
    from workflows.verify import VerifyWorkflow

    for workflow_class in (DrainWorkflow, DeleteWorkflow, RecoverWorkflow, VerifyWorkflow):
        definition = _Definition.must_from_class(workflow_class)
        assert {s.value for s in c.OperatorSignal} <= set(definition.signals), workflow_class
        assert c.WorkflowQuery.VIEW.value in definition.queries, workflow_class


def test_the_coordinator_workflows_carry_the_engines_instruction_without_loading_numpy() -> None:
    import subprocess
    import sys

    from shard_engine.coordination import Instruction
    from workflows.coordinator_contracts import TransferSpec

    assert TransferSpec is Instruction
    probe = "import sys, workflows.registry; print('numpy' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "False"
