"""Operation sequences: the number each new operation on a machine carries.

A machine's operation sequence orders what was done to it. It names the
workflow (``workflows.ids``), and PostgreSQL keeps the outcome of an
operation only if its sequence is above the recorded one
(``Store.record_operation`` is a compare-and-set on it). So a number must
never be handed out twice for one machine: each new operation takes one
above the highest this shard knows for any machine of the batch.

Where the highest known numbers come from: PostgreSQL's ownership rows when
the process starts, and the previous owner's rows when machines are adopted.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OperationSequences"]


class OperationSequences:
    """The highest operation sequence this shard knows per machine, and the next one."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def last(self, machine_id: str) -> int:
        """The highest sequence known for the machine (0 when none is)."""
        return self._last.get(machine_id, 0)

    def advance_to(self, machine_id: str, seq: int) -> None:
        """Know that ``seq`` was used on the machine (a recorded row, an adopted machine)."""
        if seq > self._last.get(machine_id, 0):
            self._last[machine_id] = seq

    def next(self, machine_ids: Iterable[str]) -> int:
        """A new sequence for an operation on these machines (one number for a batch)."""
        ids = list(machine_ids)
        seq = max((self._last.get(m, 0) for m in ids), default=0) + 1
        for m in ids:
            self._last[m] = seq
        return seq
