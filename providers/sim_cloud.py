"""A simulated public cloud: quota as speculative machines, launches that
take real time and are rate limited per account, spot instances that get
interrupted.

Inventory: for every (account, region, instance type, capacity type) in the
catalog's quota, that many speculative slots (scaled by ``quota_scale``),
spread round-robin over the region's zones. Each slot belongs to one account,
so launches fan out over the accounts' separate RunInstances buckets.

Latencies (simulated seconds, scaled by ``time_factor``): Create waits for a
launch token, then 30-90 s; Configure ~30 s; Drain as long as the workloads
take, cut short by the grace period; Delete ~10 s.

Spot: a spot machine holding a host is interrupted after an exponential
waiting time matching its declared hourly probability (scaled by
``interruption_scale``). The interrupted machine goes FAILED with a
``spot interruption`` last_error, its binding cleared: the shard notices on its
next List or Get.
"""

from __future__ import annotations

from typing import Any

from providers.catalog import Shape, load_catalog, scaled
from providers.clock import Scheduler
from providers.config import ProviderConfig
from providers.core import MachineRecord, Plan, ProviderCore, hourly_to_rate
from providers.model import CapacityType, HostRef, Operation, State
from providers.ratelimit import TokenBucket

_SHORT = {"on-demand": "od", "spot": "spot", "reserved": "ri"}
_HOSTED = frozenset({State.IDLE, State.CONFIGURING, State.CONFIGURED, State.DRAINING})

_FAILURES = {
    Operation.CREATE: "InsufficientInstanceCapacity: not enough capacity for this instance "
    "type in this zone",
    Operation.CONFIGURE: "bootstrap failed: the kubelet did not register with the cluster",
    Operation.DRAIN: "drain failed: the instance stopped responding during eviction",
    Operation.DELETE: "TerminateInstances failed: InternalError",
}


class SimCloudProvider(ProviderCore):
    """The simulated cloud (kind ``sim-cloud``). See the module docstring."""

    kind = "sim-cloud"
    supports_delete = True

    def __init__(self, config: ProviderConfig, *, scheduler: Scheduler | None = None) -> None:
        self._catalog = load_catalog(self.kind, config.catalog_path)
        self._buckets: dict[str, TokenBucket] = {}
        for account in self._catalog["accounts"]:
            limits = account.get("run_instances", {})
            self._buckets[account["alias"]] = TokenBucket(
                config.run_instances_per_second or float(limits.get("per_second", 2.0)),
                config.run_instances_burst or int(limits.get("burst", 100)),
            )
        super().__init__(config, scheduler=scheduler)

    # ------------------------------------------------------------------ inventory

    def _build_inventory(self) -> list[MachineRecord]:
        records: list[MachineRecord] = []
        types: dict[str, Any] = self._catalog["instance_types"]
        zone_factor: dict[tuple[str, str], float] = {}
        # Allocatable and hardware labels depend on the shape only: computed once per type.
        shapes: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        for account in self._catalog["accounts"]:
            alias = account["alias"]
            for region, quotas in account["quota"].items():
                zones: list[str] = self._catalog["regions"][region]
                for instance_type, counts in quotas.items():
                    spec = types[instance_type]
                    if instance_type not in shapes:
                        shape = Shape.from_json(spec)
                        shapes[instance_type] = (shape.allocatable(), shape.labels())
                    allocatable, hardware = shapes[instance_type]
                    for capacity_label in ("on-demand", "spot", "reserved"):
                        count = scaled(int(counts.get(capacity_label, 0)), self.config.quota_scale)
                        for index in range(count):
                            zone = zones[index % len(zones)]
                            if (instance_type, zone) not in zone_factor:
                                # Spot markets differ a little from zone to zone.
                                zone_factor[(instance_type, zone)] = self._uniform(0.85, 1.15)
                            records.append(
                                self._slot(
                                    alias=alias,
                                    region=region,
                                    zone=zone,
                                    instance_type=instance_type,
                                    spec=spec,
                                    allocatable=allocatable,
                                    hardware=hardware,
                                    capacity_label=capacity_label,
                                    index=index,
                                    spot_factor=zone_factor[(instance_type, zone)],
                                )
                            )
        return records

    def _slot(
        self,
        *,
        alias: str,
        region: str,
        zone: str,
        instance_type: str,
        spec: dict[str, Any],
        allocatable: dict[str, str],
        hardware: dict[str, str],
        capacity_label: str,
        index: int,
        spot_factor: float,
    ) -> MachineRecord:
        capacity = CapacityType.from_label(capacity_label)
        price = float(spec["price_per_hour"][capacity_label])
        interruption = 0.0
        if capacity is CapacityType.SPOT:
            price *= spot_factor
            interruption = min(1.0, float(spec["spot_interruption_per_hour"]) * spot_factor)
        slug = instance_type.replace(".", "-")
        machine_id = f"{self.name}-{alias}-{zone}-{slug}-{_SHORT[capacity_label]}-{index:03d}"
        labels = {
            "topology.kubernetes.io/region": region,
            "topology.kubernetes.io/zone": zone,
            "node.kubernetes.io/instance-type": instance_type,
            "bigfleet.io/capacity-type": capacity_label,
            "bigfleet.io/provider": self.name,
            "bigfleet.io/account": alias,
            "bigfleet.io/instance-family": str(spec.get("family", "")),
            **hardware,
        }
        return MachineRecord(
            id=machine_id,
            state=State.SPECULATIVE,
            instance_type=instance_type,
            zone=zone,
            capacity_type=capacity,
            price_per_hour=round(price, 4),
            interruption_probability=round(interruption, 4),
            resources=dict(allocatable),
            allocatable=dict(allocatable),
            labels=labels,
            attrs={"account": alias, "region": region},
        )

    # ------------------------------------------------------------------ transitions

    def _plan(self, record: MachineRecord, op: Operation, grace: int) -> Plan:
        latency = self.config.latency(op.value)
        sample = self._uniform(latency.low, latency.high)
        if op is Operation.CREATE:
            bucket = self._buckets[record.attrs["account"]]
            factor = self.config.time_factor
            queued = (bucket.reserve(self.now, factor) - self.now) / factor
            if queued > 0:
                self.stats["launches_queued_by_rate_limit"] += 1
            return Plan(queued + sample)
        if op is Operation.DRAIN:
            # Workloads leave in their own time; at the grace period they are forced.
            return Plan(min(sample, float(grace)) + self._uniform(1.0, 5.0))
        return Plan(sample)

    def _mint_host(self, record: MachineRecord) -> HostRef:
        return HostRef(
            provider=f"{self.name}-{record.attrs['region']}", ref=f"i-{self._new_hex(17)}"
        )

    def _failure_reason(self, op: Operation) -> str:
        return _FAILURES[op]

    def _on_host_released(self, record: MachineRecord) -> None:
        record.host = None

    def _on_transition(self, record: MachineRecord) -> None:
        if record.capacity_type is not CapacityType.SPOT:
            return
        if record.state not in _HOSTED:
            self._disarm(record.id, "interrupt")
            return
        if self._armed(record.id, "interrupt"):
            return
        rate = hourly_to_rate(record.interruption_probability) * self.config.interruption_scale
        wait = self._exponential(rate)
        if wait == float("inf"):
            return
        host = record.host
        self._arm(record.id, "interrupt", wait, lambda: self._interrupt(record.id, host))

    def _interrupt(self, machine_id: str, host: HostRef | None) -> None:
        record = self._machines.get(machine_id)
        if record is None or record.state not in _HOSTED or record.host != host:
            return
        try:
            self.stats["spot_interruptions"] += 1
            ref = host.ref if host is not None else "?"
            self._fail(
                record,
                f"spot interruption: the cloud reclaimed instance {ref} "
                "(the two-minute notice elapsed)",
            )
        finally:
            self._commit()


__all__ = ["SimCloudProvider"]
