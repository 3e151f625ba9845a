"""Deterministic workflow ids: the same operation on the same machines maps to one id.

    <shard>/<operation>/<machine, or first machine +N for a batch>/<operation sequence>

Starting an id that is already running finds that run (``USE_EXISTING``), so
a retried cycle, a restarted shard or a batch handing a machine over twice
never starts a second execution of one operation.
"""

from __future__ import annotations

from collections.abc import Sequence


def workflow_id(shard_id: str, operation: str, machine_ids: Sequence[str], seq: int) -> str:
    """The id of ``operation`` number ``seq`` on ``machine_ids`` (one machine or a batch)."""
    if not machine_ids:
        raise ValueError("a machine workflow needs at least one machine")
    subject = (
        machine_ids[0] if len(machine_ids) == 1 else f"{machine_ids[0]}+{len(machine_ids) - 1}"
    )
    return f"{shard_id}/{operation}/{subject}/{seq}"
