"""The out-of-position matrix: every lifecycle call from every state.

From each state a call either starts its legal edge, answers idempotently
with the operation already heading to (or done at) its target, or is refused
with ABORTED (InvalidTransition) - never FAILED_PRECONDITION - leaving the
machine where it was. Transitional states are held open by making the
transition under test never finish before a far deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from providers.errors import Fenced, InvalidTransition, ProviderError, Unimplemented
from tests.integration.providers.provider_harness import KINDS, Harness, Shard, serve

Call = Callable[[Harness, str, Shard], Awaitable[pb.TransitionAck]]

CALLS: dict[str, Call] = {
    "create": lambda h, m, s: h.client.create(m, s.token()),
    "configure": lambda h, m, s: h.client.configure(m, "cluster-a", b"", s.token()),
    "configure-elsewhere": lambda h, m, s: h.client.configure(m, "cluster-b", b"", s.token()),
    "drain": lambda h, m, s: h.client.drain(m, 0, s.token()),
    "delete": lambda h, m, s: h.client.delete(m, s.token()),
}

# state -> call -> "ok" (legal edge), "same" (same operation id as the one that
# brought the machine here), "refused" (InvalidTransition).
MATRIX: dict[str, dict[str, str]] = {
    "speculative": {
        "configure": "refused",
        "configure-elsewhere": "refused",
        "drain": "refused",
        "delete": "refused",
    },
    "idle": {"create": "same", "drain": "same"},
    "configured": {
        "create": "refused",
        "configure": "same",
        "configure-elsewhere": "refused",
        "delete": "refused",
    },
    "creating": {
        "create": "same",
        "configure": "refused",
        "configure-elsewhere": "refused",
        "drain": "same",  # Drain also targets IDLE, which the create is heading to
        "delete": "refused",
    },
    "configuring": {
        "create": "refused",
        "configure": "same",
        "configure-elsewhere": "refused",
        "drain": "refused",
        "delete": "refused",
    },
    "draining": {
        "create": "same",  # Create also targets IDLE, which the drain is heading to
        "configure": "refused",
        "configure-elsewhere": "refused",
        "drain": "same",
        "delete": "refused",
    },
}

STATE_CODES = {
    "speculative": pb.MACHINE_STATE_SPECULATIVE,
    "idle": pb.MACHINE_STATE_IDLE,
    "configured": pb.MACHINE_STATE_CONFIGURED,
    "creating": pb.MACHINE_STATE_CREATING,
    "configuring": pb.MACHINE_STATE_CONFIGURING,
    "draining": pb.MACHINE_STATE_DRAINING,
    "deleting": pb.MACHINE_STATE_DELETING,
}

HOLD = {"creating": "create", "configuring": "configure", "draining": "drain", "deleting": "delete"}


@pytest.fixture(scope="module", params=KINDS)
async def holding(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Harness]]:
    """Per transitional state, a provider where that transition never ends."""
    kind: str = request.param
    out: dict[str, Harness] = {}
    servers = []
    for state, op in HOLD.items():
        running = await serve(kind, stuck_rate={op: 1.0}, deadlines_s={op: 1e9})
        servers.append(running)
        out[state] = Harness(kind, running, ProviderClient(running.address))
    try:
        yield out
    finally:
        for h in out.values():
            await h.client.close()
        for running in servers:
            await running.stop(grace=None)


async def _bring(h: Harness, state: str) -> tuple[str, str, Shard]:
    """A machine in ``state`` and the operation id that brought it there."""
    shard = h.shard()
    machine = await h.machine()
    op_id = ""
    steps = {
        "speculative": [],
        "creating": ["create"],
        "idle": ["create"],
        "configuring": ["create", "configure"],
        "configured": ["create", "configure"],
        "draining": ["create", "configure", "drain"],
        "deleting": ["create", "delete"],
    }[state]
    settle = {
        "create": pb.MACHINE_STATE_IDLE,
        "configure": pb.MACHINE_STATE_CONFIGURED,
        "drain": pb.MACHINE_STATE_IDLE,
        "delete": pb.MACHINE_STATE_SPECULATIVE,
    }
    for index, step in enumerate(steps):
        op_id = (await CALLS[step](h, machine.id, shard)).operation_id
        if index < len(steps) - 1 or state not in HOLD:
            await h.wait_state(machine.id, settle[step])
    assert (await h.client.get(machine.id)).state == STATE_CODES[state]
    return machine.id, op_id, shard


async def _check(h: Harness, state: str, call: str, expected: str) -> None:
    machine_id, op_id, shard = await _bring(h, state)
    before = await h.client.get(machine_id)
    try:
        ack = await CALLS[call](h, machine_id, shard)
    except Unimplemented:
        assert call == "delete" and not h.has_delete
        return
    except Fenced as error:  # pragma: no cover - the assertion documents the rule
        raise AssertionError(f"{call} from {state} answered FAILED_PRECONDITION") from error
    except InvalidTransition:
        assert expected == "refused", f"{call} from {state} should be {expected}"
        after = await h.client.get(machine_id)
        assert after.state == before.state and after.cluster == before.cluster
        return
    assert expected == "same", f"{call} from {state} should be refused, got {ack}"
    assert ack.operation_id == op_id


@pytest.mark.parametrize(
    ("state", "call"),
    [(s, c) for s in ("speculative", "idle", "configured") for c in MATRIX[s]],
)
async def test_calls_from_stable_states(harness: Harness, state: str, call: str) -> None:
    await _check(harness, state, call, MATRIX[state][call])


@pytest.mark.parametrize(
    ("state", "call"),
    [(s, c) for s in ("creating", "configuring", "draining") for c in MATRIX[s]],
)
async def test_calls_from_transitional_states(
    holding: dict[str, Harness], state: str, call: str
) -> None:
    await _check(holding[state], state, call, MATRIX[state][call])


@pytest.mark.parametrize("call", ["create", "configure", "drain", "delete"])
async def test_calls_while_deleting(holding: dict[str, Harness], call: str) -> None:
    h = holding["deleting"]
    if not h.has_delete:
        pytest.skip("bare metal has no Delete, so no DELETING")
    await _check(h, "deleting", call, "same" if call == "delete" else "refused")


async def test_a_delete_retry_after_it_finished_is_idempotent(harness: Harness) -> None:
    if not harness.has_delete:
        pytest.skip("bare metal has no Delete")
    shard = harness.shard()
    machine = await harness.idle(shard)
    ack = await harness.client.delete(machine.id, shard.token())
    await harness.wait_state(machine.id, pb.MACHINE_STATE_SPECULATIVE)
    again = await harness.client.delete(machine.id, shard.token())
    assert again.operation_id == ack.operation_id
    assert again.machine.state == pb.MACHINE_STATE_SPECULATIVE


async def test_refusals_never_use_the_fencing_code(harness: Harness) -> None:
    """A sweep of out-of-position calls with fresh tokens: whatever the
    answer, it is never FAILED_PRECONDITION."""
    shard = harness.shard()
    machine = await harness.configured(shard=shard)
    for call in ("create", "configure-elsewhere", "delete", "create"):
        try:
            await CALLS[call](harness, machine.id, shard)
        except Fenced as error:
            raise AssertionError(f"{call} answered FAILED_PRECONDITION") from error
        except ProviderError:
            pass
