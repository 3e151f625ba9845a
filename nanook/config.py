"""The worker pool's configuration file: what a worker is, what it may run on, its limits.

The file is YAML (a JSON file is valid YAML too). Every problem is reported
as :class:`PoolConfigError` naming the field (``worker.resources[cpu]``) and
the reason; nothing is half-loaded. See ``nanook/README.md`` for the format.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bigfleet.v1alpha1 import capacity_pb2
from shard_engine.model import penalty_bucket_dollars
from shard_engine.quantity import InvalidQuantity, parse_quantity

__all__ = [
    "DEFAULT_BOOTSTRAP_TEMPLATE",
    "PoolConfig",
    "PoolConfigError",
    "PoolRequirement",
    "dollars_to_bucket",
    "load_pool_config",
    "parse_pool_config",
]

UINT32_MAX = 2**32 - 1

# The worker's instance_id is its BigFleet machine id. One bootstrap blob can
# serve a batch of machines and a BootstrapRequest names none of them, so the
# id is resolved on the host at boot: its node name, which BigFleet sets to
# the machine id (providers may also export BIGFLEET_MACHINE_ID).
DEFAULT_BOOTSTRAP_TEMPLATE = """#!/bin/sh
# Polars Nanook worker for cluster $cluster_id, bootstrapped by BigFleet.
set -eu
INSTANCE_ID="$${BIGFLEET_MACHINE_ID:-$$(hostname)}"
mkdir -p /etc/polars-nanook
cat > /etc/polars-nanook/worker.toml <<'NANOOK_WORKER_CONFIG'
$worker_config
NANOOK_WORKER_CONFIG
exec polars-nanook-compute --config /etc/polars-nanook/worker.toml --instance-id "$$INSTANCE_ID"
"""

DEFAULT_WORKER_CONFIG = """[worker]
leader = "$leader"
"""

TEMPLATE_FIELDS = ("cluster_id", "worker_config", "leader")
"""Placeholders a bootstrap template may use (``$name``); ``$$`` is a literal ``$``."""

_OPERATORS = {
    "In": capacity_pb2.NodeSelectorRequirement.OPERATOR_IN,
    "NotIn": capacity_pb2.NodeSelectorRequirement.OPERATOR_NOT_IN,
    "Exists": capacity_pb2.NodeSelectorRequirement.OPERATOR_EXISTS,
    "DoesNotExist": capacity_pb2.NodeSelectorRequirement.OPERATOR_DOES_NOT_EXIST,
    "Same": capacity_pb2.NodeSelectorRequirement.OPERATOR_SAME,
}
_VALUED = ("In", "NotIn")
_UNVALUED = ("Exists", "DoesNotExist")


class PoolConfigError(ValueError):
    """A pool configuration the adapter refuses: ``field`` says where, ``reason`` why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class PoolRequirement:
    """A node-selector requirement on the machines a worker may run on."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Same
    values: tuple[str, ...] = ()

    def to_wire(self) -> capacity_pb2.NodeSelectorRequirement:
        return capacity_pb2.NodeSelectorRequirement(
            key=self.key, operator=_OPERATORS[self.operator], values=list(self.values)
        )

    def admits(self, labels: Mapping[str, str]) -> bool:
        """True when a machine with ``labels`` satisfies this requirement."""
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        # Same: any one value, restricted to ``values`` when given.
        return value is not None and (not self.values or value in self.values)


@dataclass(frozen=True)
class PoolConfig:
    """One Nanook worker pool (see module docstring and ``nanook/README.md``)."""

    worker: Mapping[str, str]  # resource name -> quantity string, one worker
    requirements: tuple[PoolRequirement, ...] = ()
    priority: int = 0
    interruption_penalty_bucket: int = capacity_pb2.PENALTY_BUCKET_ZERO
    reclamation_penalty_bucket: int = capacity_pb2.PENALTY_BUCKET_ZERO
    min: int = 0
    max: int | None = None
    bootstrap_template: str = DEFAULT_BOOTSTRAP_TEMPLATE
    worker_config: str = DEFAULT_WORKER_CONFIG
    leader: str = ""
    bootstrap_ttl_s: int = 900
    rollup_interval_s: float = 5.0
    worker_amounts: Mapping[str, float] = field(default_factory=dict)

    def bootstrap_blob(self, cluster_id: str) -> bytes:
        """The bootstrap blob for one batch of this pool's machines."""
        worker_config = string.Template(self.worker_config).substitute(
            cluster_id=cluster_id, leader=self.leader
        )
        text = string.Template(self.bootstrap_template).substitute(
            cluster_id=cluster_id, worker_config=worker_config.rstrip("\n"), leader=self.leader
        )
        return text.encode()


def dollars_to_bucket(dollars: float, *, field: str) -> int:
    """The smallest wire penalty bucket whose upper bound covers ``dollars``."""
    if isinstance(dollars, bool) or not isinstance(dollars, int | float):
        raise PoolConfigError(field, f"not a number of dollars: {dollars!r}")
    if math.isnan(dollars) or dollars < 0:
        raise PoolConfigError(field, f"must be a number of dollars >= 0, got {dollars!r}")
    if dollars == 0:
        return capacity_pb2.PENALTY_BUCKET_ZERO
    first, pinned = capacity_pb2.PENALTY_BUCKET_HALF_DOLLAR, capacity_pb2.PENALTY_BUCKET_PINNED
    for bucket in range(first, pinned):
        if dollars <= penalty_bucket_dollars(bucket):
            return bucket
    return capacity_pb2.PENALTY_BUCKET_PINNED


def _count(raw: Any, field: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise PoolConfigError(field, f"must be a whole number, got {raw!r}")
    if not 0 <= raw <= UINT32_MAX:
        raise PoolConfigError(field, f"must be between 0 and {UINT32_MAX}, got {raw}")
    return raw


def _mapping(raw: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise PoolConfigError(field, f"must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if not isinstance(key, str):
            raise PoolConfigError(field, f"keys must be strings, got {key!r}")
    return raw


def _reject_unknown(raw: Mapping[str, Any], known: tuple[str, ...], field: str) -> None:
    for key in raw:
        if key not in known:
            where = f"{field}.{key}" if field else key
            raise PoolConfigError(where, f"unknown field (known: {', '.join(known)})")


def _requirement(raw: Any, field: str) -> PoolRequirement:
    item = _mapping(raw, field)
    _reject_unknown(item, ("key", "operator", "values"), field)
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise PoolConfigError(f"{field}.key", "must be a non-empty string")
    operator = item.get("operator")
    if operator not in _OPERATORS:
        raise PoolConfigError(
            f"{field}.operator", f"must be one of {', '.join(_OPERATORS)}, got {operator!r}"
        )
    values = item.get("values", [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise PoolConfigError(f"{field}.values", "must be a list of non-empty strings")
    if operator in _VALUED and not values:
        raise PoolConfigError(f"{field}.values", f"{operator} needs at least one value")
    if operator in _UNVALUED and values:
        raise PoolConfigError(f"{field}.values", f"{operator} takes no values")
    return PoolRequirement(key, str(operator), tuple(values))


def _template(text: Any, field: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(text, str) or not text.strip():
        raise PoolConfigError(field, "must be a non-empty string")
    try:
        string.Template(text).substitute(dict.fromkeys(allowed, ""))
    except KeyError as err:
        raise PoolConfigError(
            field, f"unknown placeholder ${err.args[0]} (known: {', '.join(allowed)})"
        ) from None
    except ValueError as err:
        raise PoolConfigError(field, f"invalid template: {err}") from None
    return text


_TOP = (
    "worker",
    "priority",
    "interruption_penalty",
    "reclamation_penalty",
    "min",
    "max",
    "bootstrap",
    "rollup_interval_seconds",
)


def parse_pool_config(raw: Any) -> PoolConfig:
    """Validate a parsed configuration document and build the :class:`PoolConfig`."""
    doc = _mapping(raw, "(document)")
    _reject_unknown(doc, _TOP, "")
    if "worker" not in doc:
        raise PoolConfigError("worker", "is required")
    worker = _mapping(doc["worker"], "worker")
    _reject_unknown(worker, ("resources", "requirements"), "worker")
    resources = _mapping(worker.get("resources"), "worker.resources")
    if not resources:
        raise PoolConfigError("worker.resources", "must name at least one resource")
    amounts: dict[str, float] = {}
    texts: dict[str, str] = {}
    for name, text in resources.items():
        where = f"worker.resources[{name}]"
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise PoolConfigError(where, f"must be a quantity such as '4' or '16Gi', got {text!r}")
        try:
            value = parse_quantity(str(text))
        except InvalidQuantity as err:
            raise PoolConfigError(where, f"invalid quantity {text!r}: {err.reason}") from None
        if value <= 0:
            raise PoolConfigError(where, f"must be more than zero, got {text!r}")
        amounts[name] = value
        texts[name] = str(text)
    reqs_raw = worker.get("requirements", [])
    if not isinstance(reqs_raw, list):
        raise PoolConfigError("worker.requirements", "must be a list")
    requirements = tuple(
        _requirement(r, f"worker.requirements[{i}]") for i, r in enumerate(reqs_raw)
    )
    priority = doc.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PoolConfigError("priority", f"must be a whole number, got {priority!r}")
    if not -(2**31) <= priority < 2**31:
        raise PoolConfigError("priority", f"must fit in int32, got {priority}")
    minimum = _count(doc.get("min", 0), "min")
    maximum = None if doc.get("max") is None else _count(doc["max"], "max")
    if maximum is not None and minimum > maximum:
        raise PoolConfigError("min", f"{minimum} exceeds max {maximum}")
    bootstrap = _mapping(doc.get("bootstrap", {}), "bootstrap")
    _reject_unknown(bootstrap, ("template", "worker_config", "leader", "ttl_seconds"), "bootstrap")
    template = _template(
        bootstrap.get("template", DEFAULT_BOOTSTRAP_TEMPLATE), "bootstrap.template", TEMPLATE_FIELDS
    )
    worker_config = _template(
        bootstrap.get("worker_config", DEFAULT_WORKER_CONFIG),
        "bootstrap.worker_config",
        ("cluster_id", "leader"),
    )
    leader = bootstrap.get("leader", "")
    if not isinstance(leader, str):
        raise PoolConfigError("bootstrap.leader", "must be a string (the leader's address)")
    ttl = bootstrap.get("ttl_seconds", 900)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise PoolConfigError("bootstrap.ttl_seconds", f"must be a whole number > 0, got {ttl!r}")
    interval = doc.get("rollup_interval_seconds", 5.0)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, int | float)
        or not 0.05 <= interval <= 3600
    ):
        raise PoolConfigError(
            "rollup_interval_seconds", f"must be a number between 0.05 and 3600, got {interval!r}"
        )
    return PoolConfig(
        worker=texts,
        worker_amounts=amounts,
        requirements=requirements,
        priority=priority,
        interruption_penalty_bucket=dollars_to_bucket(
            doc.get("interruption_penalty", 0), field="interruption_penalty"
        ),
        reclamation_penalty_bucket=dollars_to_bucket(
            doc.get("reclamation_penalty", 0), field="reclamation_penalty"
        ),
        min=minimum,
        max=maximum,
        bootstrap_template=template,
        worker_config=worker_config,
        leader=leader,
        bootstrap_ttl_s=ttl,
        rollup_interval_s=float(interval),
    )


def load_pool_config(path: Path) -> PoolConfig:
    """Read and validate a pool configuration file."""
    try:
        text = path.read_text()
    except OSError as err:
        raise PoolConfigError(str(path), f"cannot read: {err.strerror or err}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PoolConfigError(str(path), f"not valid YAML: {err}") from None
    return parse_pool_config(raw)
