"""What the shard remembers about machines in motion beyond the engine's in-flight marks.

    quarantined     machines the shard stopped using: a slot the provider said is
                    bad, or a machine an operator abandoned for investigation
    blocked drains  preemption drains that outlasted their grace while a higher
                    priority waits: reported to the coordinator as shortfalls
                    ("drain requested N min ago, still in progress, priority-X
                    preemptor waiting", paper §5) until the drain settles
    declared failed machines an operation's outcome declared FAILED (it missed its
                    deadline) while the provider still reports them in a
                    transitional state: observations keep them FAILED in the
                    engine until the provider's state settles

Plain in-process state, no store: blocked drains are re-reported by their
workflows every few minutes, so a restarted shard relearns them. Quarantine
is not repeated by anyone, so the shard process writes it through to the
store (``machines.quarantined_reason``) and hands it back with
`MachineLifecycle.restore_quarantine` when it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shard_engine.model import Shortfall
from workflows.contracts import BlockedDrain, NotifyReclaimInput

__all__ = ["MachineLifecycle", "reclaim_key"]


def reclaim_key(instruction: NotifyReclaimInput) -> str:
    """Outbox coalescing key: a newer instruction for the same nodes replaces an unsent one."""
    return "reclaim:" + ",".join(sorted(instruction.machine_ids))


class MachineLifecycle:
    """Quarantine and blocked-drain bookkeeping of one shard process."""

    def __init__(self) -> None:
        self.quarantined: dict[str, str] = {}
        self._blocked: dict[str, BlockedDrain] = {}
        self._declared_failed: dict[str, str] = {}

    def quarantine(self, machine_id: str, reason: str) -> None:
        """Stop using a machine (the shard ignores its observations from now on)."""
        self.quarantined[machine_id] = reason

    def restore_quarantine(self, quarantined: Mapping[str, str]) -> None:
        """Take back the quarantine a previous process of this shard recorded."""
        self.quarantined.update(quarantined)

    def release_quarantine(self, machine_id: str) -> bool:
        """Use the machine again; True if it was quarantined."""
        return self.quarantined.pop(machine_id, None) is not None

    def is_quarantined(self, machine_id: str) -> bool:
        return machine_id in self.quarantined

    def declare_failed(self, machine_id: str, error: str) -> None:
        """An outcome says the machine FAILED, whatever the provider reports meanwhile."""
        self._declared_failed[machine_id] = error

    def declared_failure(self, machine_id: str, *, transitional: bool) -> str | None:
        """The declared error while the provider still reports a transitional state.

        Once the provider reports a settled state the declaration has served
        its purpose and is forgotten (``None``).
        """
        error = self._declared_failed.get(machine_id)
        if error is not None and not transitional:
            del self._declared_failed[machine_id]
            return None
        return error

    def declared_failed(self) -> frozenset[str]:
        """Machines an outcome declared FAILED while their provider still reports them moving."""
        return frozenset(self._declared_failed)

    def report_blocked(self, report: BlockedDrain) -> None:
        """Keep (or refresh) a blocked preemption drain."""
        self._blocked[report.machine_id] = report

    def settled(self, machine_id: str) -> None:
        """The machine's operation finished: it blocks nobody any more."""
        self._blocked.pop(machine_id, None)

    def blocked(self) -> list[BlockedDrain]:
        return list(self._blocked.values())

    def shortfalls(
        self, *, now: float, deficit_of: Callable[[str], Mapping[str, float]] | None = None
    ) -> list[Shortfall]:
        """One shortfall per blocked drain, highest waiting priority first.

        The engine counts a machine being drained for a preemptor toward that
        need's "have", so its own shortfalls never show this wait; these do,
        escalated, with the drained machine's resources (``deficit_of``) as
        the deficit the coordinator could cover elsewhere.
        """
        out: list[Shortfall] = []
        for b in sorted(self._blocked.values(), key=lambda b: (-b.waiter.priority, b.machine_id)):
            minutes = max(0.0, (now - b.requested_unix) / 60.0)
            out.append(
                Shortfall(
                    cluster_id=b.waiter.cluster_id,
                    need_key=b.waiter.need_key,
                    priority=b.waiter.priority,
                    deficit=dict(deficit_of(b.machine_id)) if deficit_of else {},
                    age_cycles=0,
                    escalated=True,
                    reason=(
                        f"drain of {b.machine_id} (cluster {b.victim_cluster_id}) requested "
                        f"{minutes:.0f} min ago, still in progress, priority-{b.waiter.priority} "
                        "preemptor waiting"
                    ),
                )
            )
        return out
