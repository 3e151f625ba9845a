"""Operation sequences are never reused, across restarts and takeovers (issue 9, item 3)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bigfleet.shard.sequences import EPOCH_STRIDE, OperationSequences


def test_a_restarted_process_numbers_above_anything_its_predecessor_handed_out() -> None:
    old = OperationSequences(lambda: 3)
    used = [old.next(["m1"]) for _ in range(5)]  # handed out, never recorded anywhere
    # The successor knows nothing of those numbers, only its own (newer) epoch.
    new = OperationSequences(lambda: 4)
    assert new.next(["m1"]) > max(used)
    assert new.next(["m1"]) == 4 * EPOCH_STRIDE + 2


def test_a_batch_takes_one_number_above_every_member() -> None:
    seqs = OperationSequences(lambda: 1)
    seqs.next(["a"])
    seqs.next(["a"])
    batch = seqs.next(["a", "b"])
    assert batch == EPOCH_STRIDE + 3
    assert seqs.last("a") == seqs.last("b") == batch


def test_a_machine_adopted_from_a_shard_with_larger_numbers_keeps_counting_up() -> None:
    seqs = OperationSequences(lambda: 2)
    seqs.advance_to("m1", 90 * EPOCH_STRIDE + 7)  # the previous owner's epoch was 90
    assert seqs.next(["m1"]) == 90 * EPOCH_STRIDE + 8


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),  # epoch step (0: the same process)
            st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True),
        ),
        max_size=40,
    )
)
def test_no_number_is_ever_handed_out_twice_for_a_machine(
    steps: list[tuple[int, list[str]]],
) -> None:
    epoch = 1
    seqs = OperationSequences(lambda: epoch)
    used: dict[str, list[int]] = {}
    for step, machines in steps:
        if step:
            # A takeover: a new process with a newer epoch that knows nothing in memory.
            epoch += step
            seqs = OperationSequences(lambda e=epoch: e)  # type: ignore[misc]
        seq = seqs.next(machines)
        for m in machines:
            assert all(seq > earlier for earlier in used.get(m, []))
            used.setdefault(m, []).append(seq)
