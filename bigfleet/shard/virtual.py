"""Shadow mode's would-be operations, settled in the shard's memory after a plausible delay.

    GatedActuator (shadow) --op--> VirtualSettlement.record(op, due = now + delay)
    ShardProcess.run_cycle --before planning--> settle_due(): each op due
        provision -> CONFIGURED for its need   drain -> IDLE, out of the cluster
        delete    -> SPECULATIVE (the provider's view again)   verify -> as it was
        --> ShardState.settle_virtually (engine only: no store, no provider, no node view)

A shadow shard swallows every operation, so without this its would-be
machines would stay "on their way" for ever: it would never see them
serve, never reclaim them when demand falls, and its report would count
their machine-hours to the end of any window (ADR 0143). Settling them
virtually lets later cycles decide reclaim and release as an active shard
would, and the decision log (so ``bigfleet shadow report``) records it.

Delays are the documented defaults of :class:`ShadowDelays` (a cloud's
create and configure, a drain's grace plus a margin, a delete); a shard
may be given others (``ShardOptions.shadow_delays``). They model BigFleet's
side only roughly: the report compares decisions, not boot times.
Time is the shard's clock; nothing here reads another.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from bigfleet.shard.core import DeleteOp, DrainOp, Operation, ProvisionOp, VerifyOp
from bigfleet.shard.state import ShardState, Workload
from shard_engine.engine import ShardEngine
from shard_engine.model import MachineRecord, MachineState

__all__ = ["ShadowDelays", "VirtualSettlement"]


@dataclass(frozen=True, slots=True)
class ShadowDelays:
    """How long a would-be operation takes before it settles in memory (seconds)."""

    #: Create from speculative (then configure): a cloud's boot.
    create_s: float = 120.0
    #: Configure (join the cluster).
    configure_s: float = 60.0
    #: After a drain's grace: evictions and the provider's own drain.
    drain_margin_s: float = 30.0
    #: Delete back to the provider.
    delete_s: float = 60.0
    #: A provider read.
    verify_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("create_s", "configure_s", "drain_margin_s", "delete_s", "verify_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"shadow delays: {name} must be 0 or more, not {value}")

    def of(self, op: Operation) -> float:
        """The delay of one operation."""
        match op:
            case ProvisionOp():
                return self.configure_s + (self.create_s if op.create else 0.0)
            case DrainOp():
                return op.grace_seconds + self.drain_margin_s
            case DeleteOp():
                return self.delete_s
            case VerifyOp():
                return self.verify_s


class VirtualSettlement:
    """Would-be operations of a shadow shard, settled in its memory once due."""

    def __init__(
        self,
        state: ShardState[ShardEngine],
        *,
        clock: Callable[[], float],
        delays: ShadowDelays | None = None,
    ) -> None:
        self._state = state
        self._clock = clock
        self._delays = delays or ShadowDelays()
        self._due: list[tuple[float, int, Operation]] = []
        self._order = itertools.count()
        #: Machines settled so far, by kind of operation (tests, ``bigfleet shards``).
        self.settled: dict[str, int] = {}

    @property
    def pending(self) -> int:
        """Operations recorded and not yet due."""
        return len(self._due)

    def record(self, op: Operation) -> None:
        """A would-be operation the shard swallowed; it settles after its delay."""
        due = self._clock() + self._delays.of(op)
        heapq.heappush(self._due, (due, next(self._order), op))

    def settle_due(self) -> int:
        """Settle every operation due by now (in the order they became due); returns machines."""
        now = self._clock()
        count = 0
        while self._due and self._due[0][0] <= now:
            _, _, op = heapq.heappop(self._due)
            count += self._settle(op)
        return count

    def _settle(self, op: Operation) -> int:
        kind = type(op).__name__
        settled = 0
        for record, workload, virtual in self._outcomes(op):
            if self._state.machine(record.id) is None:
                continue  # it left the shard meanwhile
            self._state.settle_virtually(record.id, record, workload=workload, virtual=virtual)
            settled += 1
        self.settled[kind] = self.settled.get(kind, 0) + settled
        return settled

    def _outcomes(self, op: Operation) -> list[tuple[MachineRecord, Workload, bool]]:
        """(final record, workload, still virtual) for each machine of ``op``."""
        match op:
            case ProvisionOp():
                return [
                    (
                        replace(
                            self._current(r), state=MachineState.CONFIGURED, cluster=op.cluster_id
                        ),
                        Workload(priority=op.priority, need_key=op.need_key),
                        True,
                    )
                    for r in op.machines
                ]
            case DrainOp():
                idle = replace(self._current(op.machine), state=MachineState.IDLE, cluster="")
                return [(idle, Workload(), True)]
            case DeleteOp():
                gone = replace(
                    self._current(op.machine),
                    state=MachineState.SPECULATIVE,
                    cluster="",
                    host_ref="",
                )
                # Back to what its provider shows (a speculative slot): observations count again.
                return [(gone, Workload(), False)]
            case VerifyOp():
                record = self._current(op.machine)
                return [(record, Workload(), self._state.is_virtual(record.id))]

    def _current(self, record: MachineRecord) -> MachineRecord:
        return self._state.machine(record.id) or record
