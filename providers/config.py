"""Configuration of a simulated provider, read once and passed down.

All durations are *simulated* seconds; the provider multiplies each by
``time_factor`` before scheduling it, so ``time_factor=0.001`` turns a 60 s
create into 60 ms of real time. Fields left at ``None`` take the default of
the provider kind (see `KIND_DEFAULTS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from providers.ec2.settings import Ec2Settings

ProviderKind = Literal["sim-cloud", "bare-metal", "ec2"]
OperationName = Literal["create", "configure", "drain", "delete"]

OPERATIONS: tuple[OperationName, ...] = ("create", "configure", "drain", "delete")

#: The default provider name (and so machine-id prefix) of each kind.
DEFAULT_NAMES: dict[str, str] = {"sim-cloud": "simcloud", "bare-metal": "bm", "ec2": "ec2"}


@dataclass(frozen=True, slots=True)
class LatencyRange:
    """A uniform latency distribution, in simulated seconds."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not (0 <= self.low <= self.high) or not math.isfinite(self.high):
            raise ValueError(f"bad latency range [{self.low}, {self.high}]")


@dataclass(frozen=True, slots=True)
class KindDefaults:
    """Latencies and deadlines that differ between a cloud and bare metal."""

    create: LatencyRange
    configure: LatencyRange
    drain: LatencyRange
    delete: LatencyRange
    deadlines: dict[str, float]


KIND_DEFAULTS: dict[str, KindDefaults] = {
    # A cloud RunInstances takes 30-90 s to a running, reachable host; joining
    # a cluster (cloud-init, kubelet registration) about 30 s; terminating ~10 s.
    "sim-cloud": KindDefaults(
        create=LatencyRange(30.0, 90.0),
        configure=LatencyRange(20.0, 40.0),
        drain=LatencyRange(5.0, 60.0),
        delete=LatencyRange(5.0, 15.0),
        deadlines={"create": 300.0, "configure": 600.0, "drain": 300.0, "delete": 300.0},
    ),
    # Claiming a commissioned server is bookkeeping (sub-second); configuring
    # one is a PXE reboot into the cluster's image, a minute or two.
    "bare-metal": KindDefaults(
        create=LatencyRange(0.2, 1.0),
        configure=LatencyRange(60.0, 120.0),
        drain=LatencyRange(5.0, 60.0),
        delete=LatencyRange(0.0, 0.0),
        deadlines={"create": 120.0, "configure": 900.0, "drain": 300.0, "delete": 300.0},
    ),
    # A real cloud (providers/ec2): Create, Configure and Delete take as long as
    # EC2 takes, so only the drain latency (the workloads leaving) is modelled;
    # the deadlines bound what EC2 and the bootstrap command may take.
    "ec2": KindDefaults(
        create=LatencyRange(0.0, 0.0),
        configure=LatencyRange(0.0, 0.0),
        drain=LatencyRange(5.0, 60.0),
        delete=LatencyRange(0.0, 0.0),
        deadlines={"create": 600.0, "configure": 900.0, "drain": 300.0, "delete": 600.0},
    ),
}


@dataclass
class ProviderConfig:
    """Everything a simulated provider needs to start.

    ``deadlines_s`` bounds each transition; the drain deadline is counted
    *after* the drain's grace period. ``deadline_overrides_s`` adjusts them per
    capacity type label (``{"spot": {"create": 180}}``). The failure knobs are
    probabilities per accepted transition: ``error_rate`` makes it fail part
    way with a provider error, ``stuck_rate`` makes it never finish (so it
    hits its deadline), ``late_rate`` makes it finish only after its deadline
    (the late completion is discarded because the machine is FAILED by then).
    ``failed_cleanup_s`` returns FAILED machines to SPECULATIVE after that
    long; ``None`` holds them for an operator (`ProviderCore.clear_failed`).
    """

    kind: ProviderKind
    name: str = ""
    seed: int = 0
    time_factor: float = 1.0
    state_path: Path | None = None
    catalog_path: Path | None = None
    quota_scale: float = 1.0
    create_latency_s: LatencyRange | None = None
    configure_latency_s: LatencyRange | None = None
    drain_latency_s: LatencyRange | None = None
    delete_latency_s: LatencyRange | None = None
    deadlines_s: dict[str, float] = field(default_factory=dict)
    deadline_overrides_s: dict[str, dict[str, float]] = field(default_factory=dict)
    error_rate: dict[str, float] = field(default_factory=dict)
    stuck_rate: dict[str, float] = field(default_factory=dict)
    late_rate: dict[str, float] = field(default_factory=dict)
    #: Multiplies every spot interruption probability's *effect* (0 disables
    #: interruptions; the declared probability on the wire is unchanged).
    interruption_scale: float = 1.0
    failed_cleanup_s: float | None = None
    #: Overrides the catalog's per-account RunInstances token bucket.
    run_instances_per_second: float | None = None
    run_instances_burst: int | None = None
    #: Bare metal: how long a rack that is not yet commissioned takes to be.
    commission_s: float = 1800.0
    #: Bare metal: report price 0 (``zero``) or the catalog's amortised cost.
    bare_metal_pricing: Literal["zero", "amortised"] = "zero"
    #: fsync the state journal after every write (survives power loss, slower).
    fsync: bool = False
    #: EC2: accounts, regions, instance types and the AWS settings (kind ``ec2`` only).
    ec2: Ec2Settings | None = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_DEFAULTS:
            raise ValueError(f"unknown provider kind {self.kind!r}")
        if not self.name:
            self.name = DEFAULT_NAMES[self.kind]
        if not (self.time_factor > 0 and math.isfinite(self.time_factor)):
            raise ValueError("time_factor must be a positive finite number")
        if self.quota_scale < 0:
            raise ValueError("quota_scale must be >= 0")
        for knob in (self.error_rate, self.stuck_rate, self.late_rate):
            for op, p in knob.items():
                if op not in OPERATIONS or not 0 <= p <= 1:
                    raise ValueError(f"bad failure probability {op}={p}")
        if self.state_path is not None:
            self.state_path = Path(self.state_path)
        if self.catalog_path is not None:
            self.catalog_path = Path(self.catalog_path)

    @property
    def defaults(self) -> KindDefaults:
        """The latency and deadline defaults of this kind."""
        return KIND_DEFAULTS[self.kind]

    def latency(self, op: str) -> LatencyRange:
        """The latency distribution of ``op``, configured or default."""
        configured = {
            "create": self.create_latency_s,
            "configure": self.configure_latency_s,
            "drain": self.drain_latency_s,
            "delete": self.delete_latency_s,
        }[op]
        return configured if configured is not None else getattr(self.defaults, op)

    def deadline(self, op: str, capacity_type: str) -> float:
        """The deadline of ``op`` for a machine of ``capacity_type``."""
        override = self.deadline_overrides_s.get(capacity_type, {})
        if op in override:
            return override[op]
        return self.deadlines_s.get(op, self.defaults.deadlines[op])


__all__ = [
    "DEFAULT_NAMES",
    "KIND_DEFAULTS",
    "OPERATIONS",
    "KindDefaults",
    "LatencyRange",
    "OperationName",
    "ProviderConfig",
    "ProviderKind",
]
