"""Coordinator terms as a shard sees them: refuse instructions from a zombie coordinator.

Every coordinator instruction carries the coordinator's term (DESIGN §6). A
shard remembers the highest term it has seen and refuses any instruction of
a lower one; the refusal is the instruction's outcome, not an error.
"""

from __future__ import annotations

__all__ = ["CoordinatorTerms"]


class CoordinatorTerms:
    """The highest coordinator term this shard process has seen."""

    def __init__(self) -> None:
        self.highest = 0

    def check(self, term: int) -> str:
        """'' if an instruction of ``term`` may act (and remember it), else why it is refused."""
        if term < self.highest:
            return f"stale coordinator term {term} < {self.highest} already seen"
        self.highest = term
        return ""
