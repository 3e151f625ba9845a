"""Operation sequences: the number each new operation on a machine carries.

A machine's operation sequence orders what was done to it. It names the
workflow (``workflows.ids``), and PostgreSQL keeps the outcome of an
operation in the ownership row only if its sequence is above the recorded
one (``Store.record_operation`` is a compare-and-set on it). So a number
must never be handed out twice for one machine — not after a SIGKILL, not
after a standby takes over (ADR 0102).

The source is durable without a write on the hot path: every number is
``epoch × EPOCH_STRIDE + n``, where ``epoch`` is this process's lease epoch
(PostgreSQL bumps it by compare-and-set every time a process takes the
lease, so no two processes ever share one) and ``n`` counts up per machine
within the epoch. A number from a later epoch is above every number of an
earlier one, whatever the earlier process handed out and never recorded.
Beside that, the highest number known for a machine still counts —
PostgreSQL's rows at start, a previous owner's rows on adoption (another
shard's epochs are unrelated to ours) — and the next number is above both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["EPOCH_STRIDE", "OperationSequences"]

# Operation numbers per machine per epoch. Decimal, so a sequence reads as
# "epoch 7, operation 12" (7000000012) in a workflow id; 2^63 leaves room for
# nine billion epochs.
EPOCH_STRIDE = 1_000_000_000


class OperationSequences:
    """The highest operation sequence this shard knows per machine, and the next one."""

    def __init__(self, epoch: Callable[[], int] = lambda: 0) -> None:
        self._epoch = epoch
        self._last: dict[str, int] = {}

    def last(self, machine_id: str) -> int:
        """The highest sequence known for the machine (0 when none is)."""
        return self._last.get(machine_id, 0)

    def advance_to(self, machine_id: str, seq: int) -> None:
        """Know that ``seq`` was used on the machine (a recorded row, an adopted machine)."""
        if seq > self._last.get(machine_id, 0):
            self._last[machine_id] = seq

    def floor(self) -> int:
        """Every number handed out in this epoch is above this one."""
        return max(0, self._epoch()) * EPOCH_STRIDE

    def next(self, machine_ids: Iterable[str]) -> int:
        """A new sequence for an operation on these machines (one number for a batch)."""
        ids = list(machine_ids)
        known = max((self._last.get(m, 0) for m in ids), default=0)
        seq = max(known, self.floor()) + 1
        for m in ids:
            self._last[m] = seq
        return seq
