"""What a shard tells Prometheus: after every cycle, and when an operation ends.

    run_cycle ──► record_cycle(plan, seconds, engine stats, sessions, lease)
                    bigfleet_shard_cycle_duration_seconds, ..._phase_duration_seconds
                    bigfleet_shard_actions_total{kind, reason}
                    bigfleet_shard_unmet_needs{reason}, bigfleet_shard_shortfalls{escalated}
                    bigfleet_shard_reclaims_capped_total
                    bigfleet_shard_sessions_open, bigfleet_shard_lease_held / _epoch
    outcomes ──► record_failed_outcome(operation)
                    bigfleet_workflow_failures_total{type, stage="outcome"}

Every metric is defined in :mod:`bigfleet.metrics`; this module only feeds
them, with the shard's id as a label. Unmet needs are a gauge per reason, so
a reason that no longer applies drops to zero rather than keeping its last
value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from bigfleet import metrics
from shard_engine.engine import CycleStats
from shard_engine.model import (
    Action,
    AssignIdle,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Verify,
)
from shard_engine.pending import REASON_PAUSED
from shard_engine.verdicts import UnmetReason, reason_category
from workflows.contracts import (
    OP_CONFIGURE,
    OP_DELETE,
    OP_DRAIN,
    OP_PROVISION,
    OP_RECOVER,
    OP_VERIFY,
    REASON_PREEMPT,
    REASON_RECLAIM,
)

__all__ = [
    "UNMET_REASONS",
    "action_labels",
    "record_cycle",
    "record_failed_outcome",
    "record_gc",
    "record_session_loop",
    "record_shed",
]

#: The reasons ``bigfleet_shard_unmet_needs`` reports (each is set every cycle).
UNMET_REASONS = (
    UnmetReason.PRIORITY_STARVED,
    UnmetReason.NO_MATCHING_SUPPLY,
    UnmetReason.TOPOLOGY,
    UnmetReason.PREEMPTION_EXHAUSTED,
    REASON_PAUSED,
    "other",
)

#: The workflow that carries out each operation (for failures recorded by outcome).
WORKFLOW_OF_OPERATION = {
    OP_PROVISION: "ProvisionWorkflow",
    OP_CONFIGURE: "ProvisionWorkflow",
    OP_DRAIN: "DrainWorkflow",
    OP_DELETE: "DeleteWorkflow",
    OP_RECOVER: "RecoverWorkflow",
    OP_VERIFY: "VerifyWorkflow",
}


def action_labels(action: Action) -> tuple[str, str, int]:
    """(kind, reason, machines) of one action, as ``bigfleet_shard_actions_total`` counts it."""
    if isinstance(action, Provision):
        return "provision", "", len(action.machine_ids)
    if isinstance(action, AssignIdle):
        return "assign", "", 1
    if isinstance(action, Preempt):
        return "drain", REASON_PREEMPT, 1
    if isinstance(action, Reclaim):
        return "drain", getattr(action, "reason", REASON_RECLAIM) or REASON_RECLAIM, 1
    if isinstance(action, Release):
        return "delete", getattr(action, "reason", "release") or "release", 1
    if isinstance(action, Verify):
        return "verify", "", 1
    return type(action).__name__.lower(), "", 1


def _unmet(why_not: Mapping[tuple[str, str], str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in why_not.values():
        category = reason_category(text)
        if not category:
            category = REASON_PAUSED if text.startswith(REASON_PAUSED) else "other"
        counts[category] += 1
    return counts


def record_cycle(
    shard_id: str,
    plan: Plan,
    *,
    seconds: float,
    stats: CycleStats,
    sessions_open: int,
) -> None:
    """Feed one committed cycle's figures to the shard's metrics."""
    metrics.CYCLE_SECONDS.labels(shard_id).observe(seconds)
    for phase, spent in stats.phase_seconds.items():
        metrics.PHASE_SECONDS.labels(shard_id, phase).observe(spent)
    kinds: Counter[tuple[str, str]] = Counter()
    for action in plan.actions:
        kind, reason, machines = action_labels(action)
        kinds[(kind, reason)] += machines
    for (kind, reason), machines in kinds.items():
        metrics.ACTIONS.labels(shard_id, kind, reason).inc(machines)
    unmet = _unmet(plan.why_not)
    for reason in UNMET_REASONS:
        metrics.UNMET_NEEDS.labels(shard_id, reason).set(unmet.get(reason, 0))
    escalated = sum(1 for s in plan.shortfalls if s.escalated)
    metrics.SHORTFALLS.labels(shard_id, "true").set(escalated)
    metrics.SHORTFALLS.labels(shard_id, "false").set(len(plan.shortfalls) - escalated)
    if stats.reclaims_capped:
        metrics.RECLAIMS_CAPPED.labels(shard_id).inc(stats.reclaims_capped)
    metrics.SESSIONS_OPEN.labels(shard_id).set(sessions_open)


# Totals last fed to a counter, per (shard, process or edge, reason): a process that
# reports its own running totals (an edge over its link) adds only what is new, and
# one that restarted (a total below the last) adds its whole new total.
_TOTALS: dict[tuple[str, str, str], float] = {}


def _added(key: tuple[str, str, str], total: float) -> float:
    last = _TOTALS.get(key, 0.0)
    _TOTALS[key] = total
    return total - last if total >= last else total


def record_session_loop(shard_id: str, loop: str, *, lag_s: float, busy: float) -> None:
    """How late, and how busy, a loop serving sessions is ('thread' or 'edge-N')."""
    metrics.SESSION_LOOP_LAG.labels(shard_id, loop).set(lag_s)
    metrics.SESSION_LOOP_BUSY.labels(shard_id, loop).set(busy)


def record_gc(shard_id: str, process: str, *, total_s: float, worst_s: float) -> None:
    """A process's collector pauses: its running total, and the longest since it last said."""
    added = _added((shard_id, process, "gc"), total_s)
    if added > 0:
        metrics.GC_PAUSE_SECONDS.labels(shard_id, process).inc(added)
    metrics.GC_PAUSE_MAX.labels(shard_id, process).set(worst_s)


def record_shed(shard_id: str, process: str, shed: tuple[tuple[str, int], ...]) -> None:
    """Sessions an edge shed, from its running totals by reason (the thread counts its own)."""
    for reason, total in shed:
        added = _added((shard_id, process, f"shed:{reason}"), float(total))
        if added > 0:
            metrics.SESSIONS_SHED.labels(reason).inc(added)


def record_lease(shard_id: str, *, held: bool, epoch: int) -> None:
    """Whether this process holds the shard's lease, and at which epoch."""
    metrics.LEASE_HELD.labels(shard_id).set(1 if held else 0)
    metrics.LEASE_EPOCH.labels(shard_id).set(epoch)


def record_failed_outcome(operation: str) -> None:
    """An operation ended with its machine FAILED."""
    workflow = WORKFLOW_OF_OPERATION.get(operation, operation)
    metrics.WORKFLOW_FAILURES.labels(workflow, "outcome").inc()
