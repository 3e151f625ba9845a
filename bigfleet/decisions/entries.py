"""Decisions as rows: every action a cycle took or would take, and every deliberate non-action.

What an operator asks afterwards is "why was this machine drained at
03:12?" and "why did this need wait?". The answer needs what the cycle
knew then, not what the shard knows now, so each row carries the inputs
that decided it: the machine's shape, price and interruption probability,
the priorities on both sides of a preemption and its grace, the budget
and its use for a hold, the deficit and reason for an unmet need.

Kinds: ``provision``, ``assign``, ``preempt``, ``reclaim``, ``release``,
``verify`` (actions); ``held`` (a drain a budget or do-not-disrupt held
back); ``unmet`` (a need left short, with its why-not). The ``mode`` says
whether it was carried out: ``active`` yes; ``shadow``, ``dry-run`` and
``paused`` no.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shard_engine.budgets import Hold
from shard_engine.catalog import Profile, capacity_type_label
from shard_engine.model import (
    REASON_INTERRUPTION,
    AssignIdle,
    Plan,
    Preempt,
    Provision,
    Reclaim,
    Release,
    Verify,
)

__all__ = ["Decision", "Mode", "decisions_of"]


class Mode(StrEnum):
    """Whether a shard carries out what it decides."""

    ACTIVE = "active"
    SHADOW = "shadow"
    DRY_RUN = "dry-run"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class Decision:
    """One row of the decision log (see module docstring)."""

    shard_id: str
    decided_at: float
    cycle: int
    mode: str
    kind: str
    machine_id: str = ""
    cluster_id: str = ""
    need_key: str = ""
    reason: str = ""
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for ``bigfleet why``."""
        who = self.machine_id or f"{self.cluster_id}/{self.need_key}"
        carried = "" if self.mode == Mode.ACTIVE else f" [{self.mode}: not carried out]"
        return f"{self.kind} {who}: {self.reason}{carried}"


def _shape(profile: Profile | None) -> dict[str, Any]:
    if profile is None:
        return {}
    return {
        "instance_type": profile.instance_type,
        "zone": profile.zone,
        "capacity_type": capacity_type_label(profile.capacity_type),
        "price_per_hour": profile.price_per_hour,
        "interruption_probability": profile.interruption_probability,
        "provider": profile.provider,
    }


def decisions_of(
    plan: Plan,
    *,
    shard_id: str,
    cycle: int,
    mode: Mode,
    holds: tuple[Hold, ...] = (),
    profile_of: Callable[[str], Profile | None],
    unmet: bool = True,
) -> Iterator[Decision]:
    """The rows for one cycle: its actions, its holds and (``unmet``) its unmet needs.

    ``profile_of`` gives a machine's shape (``ShardEngine.profile_of``):
    an operation changes a machine's state, never its shape, so reading it
    when the rows are built, after the cycle, records the shape and price
    the cycle decided on. Shapes are interned, so each is turned into its
    fields once per call.
    """
    now = plan.now
    shapes: dict[int, dict[str, Any]] = {}

    def machine(machine_id: str) -> dict[str, Any]:
        profile = profile_of(machine_id)
        known = shapes.get(id(profile))
        if known is None:
            known = shapes[id(profile)] = _shape(profile)
        return known

    def row(kind: str, **values: Any) -> Decision:
        return Decision(
            shard_id=shard_id, decided_at=now, cycle=cycle, mode=mode, kind=kind, **values
        )

    for action in plan.actions:
        if isinstance(action, Provision):
            for machine_id in action.machine_ids:
                yield row(
                    "provision",
                    machine_id=machine_id,
                    cluster_id=action.cluster_id,
                    need_key=action.need_key,
                    reason=f"need at priority {action.priority} was short",
                    inputs=dict(machine(machine_id), priority=action.priority),
                )
        elif isinstance(action, AssignIdle):
            yield row(
                "assign",
                machine_id=action.machine_id,
                cluster_id=action.cluster_id,
                need_key=action.need_key,
                reason=f"idle machine covers a need at priority {action.priority}",
                inputs=dict(machine(action.machine_id), priority=action.priority),
            )
        elif isinstance(action, Preempt):
            yield row(
                "preempt",
                machine_id=action.machine_id,
                cluster_id=action.victim_cluster_id,
                need_key=action.preemptor_need_key,
                reason=(
                    f"preempted for {action.preemptor_cluster_id} at priority "
                    f"{action.preemptor_priority} (victim priority {action.victim_priority})"
                ),
                inputs=dict(
                    machine(action.machine_id),
                    preemptor_cluster=action.preemptor_cluster_id,
                    preemptor_priority=action.preemptor_priority,
                    victim_priority=action.victim_priority,
                    grace_seconds=action.grace_seconds,
                ),
            )
        elif isinstance(action, Reclaim):
            shape = machine(action.machine_id)
            if action.reason == REASON_INTERRUPTION:
                why = (
                    f"{action.reason}: its provider announced an interruption (probability "
                    f"{shape.get('interruption_probability', 0.0):g}); drained and replaced"
                )
            else:
                why = f"{action.reason}: excess the cluster's needs stay covered without"
            yield row(
                "reclaim",
                machine_id=action.machine_id,
                cluster_id=action.cluster_id,
                reason=why,
                inputs=dict(shape, grace_seconds=action.grace_seconds),
            )
        elif isinstance(action, Release):
            yield row(
                "release",
                machine_id=action.machine_id,
                reason="idle past its hold with no recent demand for its shape",
                inputs=dict(machine(action.machine_id)),
            )
        elif isinstance(action, Verify):
            yield row(
                "verify",
                machine_id=action.machine_id,
                cluster_id=action.cluster_id,
                reason="missing from its cluster's node reports",
            )
    for hold in holds:
        yield row(
            "held",
            machine_id=hold.machine_id,
            cluster_id=hold.cluster_id,
            need_key=hold.need_key,
            reason=hold.describe(),
            inputs={
                "drain": hold.reason.value,
                "cause": hold.cause,
                "budget": hold.budget,
                "cap": hold.cap,
                "draining": hold.draining,
                "protected_until": hold.until,
                "for_cluster": hold.for_cluster,
                "for_need": hold.for_need,
            },
        )
    if unmet:
        reported: set[tuple[str, str]] = set()
        for shortfall in plan.shortfalls:
            reported.add((shortfall.cluster_id, shortfall.need_key))
            yield row(
                "unmet",
                cluster_id=shortfall.cluster_id,
                need_key=shortfall.need_key,
                reason=plan.why_not.get(
                    (shortfall.cluster_id, shortfall.need_key), shortfall.reason
                ),
                inputs={
                    "priority": shortfall.priority,
                    "deficit": dict(shortfall.deficit),
                    "age_cycles": shortfall.age_cycles,
                },
            )
        # Needs the plan explains without a shortfall: those a pause left unserved.
        for (cluster_id, need_key), reason in plan.why_not.items():
            if (cluster_id, need_key) not in reported:
                yield row("unmet", cluster_id=cluster_id, need_key=need_key, reason=reason)
