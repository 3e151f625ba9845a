"""Simulated bare metal: racks of servers that exist whether used or not.

Inventory: every server of every rack in the catalog (scaled by
``quota_scale``), starting SPECULATIVE, i.e. in the site's free pool. Racks
are topology domains: each machine carries ``topology.kubernetes.io/zone``
(the hall) and ``topology.kubernetes.io/rack``.

Create claims a server from the free pool: near-instant when its rack is
commissioned. A rack the catalog marks as not yet commissioned (firmware,
OS install, burn-in) becomes ready ``commission_s`` after the provider
starts; its servers are listed from the start with the label
``bigfleet.io/commissioned=false``, and a Create on one completes when the
rack is ready, like a cloud launch that takes a while.

There is no Delete (UNIMPLEMENTED): a drained server stays IDLE, since
holding it costs nothing. Price is 0, or the catalog's amortised cost with
``bare_metal_pricing="amortised"``; interruption probability is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from providers.catalog import Shape, load_catalog, scaled
from providers.clock import Scheduler
from providers.config import ProviderConfig
from providers.core import MachineRecord, Plan, ProviderCore
from providers.model import CapacityType, HostRef, Operation, State

COMMISSIONED_LABEL = "bigfleet.io/commissioned"

_FAILURES = {
    Operation.CREATE: "IPMI power-on failed: the BMC is unreachable",
    Operation.CONFIGURE: "PXE boot failed: no DHCP offer on the provisioning network",
    Operation.DRAIN: "drain failed: the node did not acknowledge the shutdown",
    Operation.DELETE: "bare metal has no delete",
}


@dataclass
class _Rack:
    key: str
    machines: list[str]
    commissioned: bool
    ready_at: float | None = None


class BareMetalProvider(ProviderCore):
    """The simulated bare-metal site (kind ``bare-metal``). See the module docstring."""

    kind = "bare-metal"
    supports_delete = False

    def __init__(self, config: ProviderConfig, *, scheduler: Scheduler | None = None) -> None:
        self._catalog = load_catalog(self.kind, config.catalog_path)
        self._racks: dict[str, _Rack] = {}
        super().__init__(config, scheduler=scheduler)
        for record in self._machines.values():
            key = record.attrs["rack"]
            rack = self._racks.setdefault(key, _Rack(key, [], commissioned=True))
            rack.machines.append(record.id)
            if record.labels.get(COMMISSIONED_LABEL) != "true":
                rack.commissioned = False

    # ------------------------------------------------------------------ inventory

    def _build_inventory(self) -> list[MachineRecord]:
        records: list[MachineRecord] = []
        site: str = self._catalog["site"]
        region: str = self._catalog["region"]
        models: dict[str, Any] = self._catalog["server_models"]
        for zone, racks in self._catalog["halls"].items():
            for rack in racks:
                model = models[rack["model"]]
                shape = Shape.from_json(model)
                rack_allocatable, hardware = shape.allocatable(), shape.labels()
                rack_key = f"{zone}-{rack['rack']}"
                count = scaled(int(rack["servers"]), self.config.quota_scale)
                for slot in range(1, count + 1):
                    price = 0.0
                    if self.config.bare_metal_pricing == "amortised":
                        price = float(model["amortised_per_hour"])
                    allocatable = dict(rack_allocatable)
                    records.append(
                        MachineRecord(
                            id=f"{self.name}-{rack_key}-u{slot:02d}",
                            state=State.SPECULATIVE,
                            instance_type=rack["model"],
                            zone=zone,
                            capacity_type=CapacityType.BARE_METAL,
                            price_per_hour=price,
                            interruption_probability=0.0,
                            resources=dict(allocatable),
                            allocatable=allocatable,
                            labels={
                                "topology.kubernetes.io/region": region,
                                "topology.kubernetes.io/zone": zone,
                                "topology.kubernetes.io/rack": rack_key,
                                "node.kubernetes.io/instance-type": rack["model"],
                                "bigfleet.io/capacity-type": CapacityType.BARE_METAL.label,
                                "bigfleet.io/provider": self.name,
                                "bigfleet.io/site": site,
                                COMMISSIONED_LABEL: "true" if rack["commissioned"] else "false",
                                **hardware,
                            },
                            attrs={"rack": rack_key, "site": site},
                            host=HostRef(
                                provider=f"{self.name}-{site}",
                                ref=f"SN-{self._new_hex(12).upper()}",
                            ),
                        )
                    )
        return records

    # ------------------------------------------------------------------ commissioning

    def _on_start(self) -> None:
        for rack in self._racks.values():
            if rack.commissioned:
                continue
            rack.ready_at = self.now + self.config.commission_s * self.config.time_factor
            self._arm(rack.key, "commission", self.config.commission_s, self._commissioner(rack))

    def _commissioner(self, rack: _Rack) -> Callable[[], None]:
        def commission() -> None:
            try:
                rack.commissioned = True
                self.stats["racks_commissioned"] += 1
                for machine_id in rack.machines:
                    record = self._machines[machine_id]
                    record.labels[COMMISSIONED_LABEL] = "true"
                    self._touch(record)
            finally:
                self._commit()

        return commission

    def _commissioning_wait(self, record: MachineRecord) -> float:
        """Simulated seconds until the machine's rack is commissioned."""
        rack = self._racks.get(record.attrs["rack"])
        if rack is None or rack.commissioned:
            return 0.0
        if rack.ready_at is None:
            return self.config.commission_s
        return max(0.0, (rack.ready_at - self.now) / self.config.time_factor)

    # ------------------------------------------------------------------ transitions

    def _plan(self, record: MachineRecord, op: Operation, grace: int) -> Plan:
        latency = self.config.latency(op.value)
        sample = self._uniform(latency.low, latency.high)
        if op is Operation.CREATE:
            return Plan(self._commissioning_wait(record) + sample)
        if op is Operation.DRAIN:
            return Plan(min(sample, float(grace)) + self._uniform(1.0, 5.0))
        return Plan(sample)

    def _deadline(self, record: MachineRecord, op: Operation, grace: int) -> float:
        base = super()._deadline(record, op, grace)
        if op is Operation.CREATE:
            return base + self._commissioning_wait(record)
        return base

    def _mint_host(self, record: MachineRecord) -> HostRef:
        if record.host is None:
            record.host = HostRef(
                provider=f"{self.name}-{record.attrs['site']}",
                ref=f"SN-{self._new_hex(12).upper()}",
            )
        return record.host

    def _failure_reason(self, op: Operation) -> str:
        return _FAILURES[op]


__all__ = ["COMMISSIONED_LABEL", "BareMetalProvider"]
