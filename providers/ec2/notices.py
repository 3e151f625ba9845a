"""Interruption notices: what EventBridge puts on the provider's SQS queue.

An EventBridge rule on ``source: aws.ec2`` with the detail types below sends
each event to the queue as its JSON body. Two kinds raise the machine's
hourly interruption probability, which the shard sees on its next List (the
machine's revision moves) and prices into effective cost:

| detail-type                              | probability |
|------------------------------------------|-------------|
| ``EC2 Spot Instance Interruption Warning`` | 0.99 (EC2 reclaims it in about two minutes) |
| ``EC2 Instance Rebalance Recommendation``  | 0.5 (elevated risk, no deadline) |

Anything else on the queue is ignored (and removed from it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"

#: The hourly interruption probability each notice implies.
PROBABILITY = {SPOT_WARNING: 0.99, REBALANCE: 0.5}
#: The value of the machine's ``bigfleet.io/interruption-notice`` label.
LABEL_VALUE = {SPOT_WARNING: "spot-interruption-warning", REBALANCE: "rebalance-recommendation"}
LABEL = "bigfleet.io/interruption-notice"


@dataclass(frozen=True, slots=True)
class InterruptionNotice:
    """One parsed notice: which instance and what it means."""

    instance_id: str
    detail_type: str

    @property
    def probability(self) -> float:
        """The hourly interruption probability the notice implies."""
        return PROBABILITY[self.detail_type]

    @property
    def label(self) -> str:
        """The label value a machine under this notice carries."""
        return LABEL_VALUE[self.detail_type]


def parse_notice(body: str) -> InterruptionNotice | None:
    """The notice in an SQS message body, or None when the body is not an
    EventBridge event of a kind we act on."""
    try:
        event = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict):
        return None
    detail_type = event.get("detail-type")
    detail = event.get("detail")
    if detail_type not in PROBABILITY or not isinstance(detail, dict):
        return None
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        return None
    return InterruptionNotice(instance_id, str(detail_type))


def event_body(instance_id: str, detail_type: str, *, region: str, account: str) -> str:
    """An EventBridge event of ``detail_type`` for ``instance_id``, as EC2
    emits it (for local stacks and tests that play EC2's part)."""
    detail: dict[str, str] = {"instance-id": instance_id}
    if detail_type == SPOT_WARNING:
        detail["instance-action"] = "terminate"
    return json.dumps(
        {
            "version": "0",
            "id": f"bigfleet-{instance_id}",
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": account,
            "region": region,
            "resources": [f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"],
            "detail": detail,
        }
    )


__all__ = [
    "LABEL",
    "REBALANCE",
    "SPOT_WARNING",
    "InterruptionNotice",
    "event_body",
    "parse_notice",
]
