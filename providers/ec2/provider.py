"""The EC2 capacity provider (kind ``ec2``): the shared provider core over
real instances.

The core keeps the contract (validation, fencing with its durable marks,
idempotency, metadata, List cursors, deadlines, the journal); this substrate
turns accepted transitions into EC2 calls and reports back::

    Create     RunInstances (spot via InstanceMarketOptions, ClientToken from
               machine id + operation id), then DescribeInstances until running
    Configure  SSM SendCommand delivering the bootstrap blob, then
               GetCommandInvocation until the command ends (ADR 0120)
    Drain      no EC2 call: the cluster's workloads leave within the grace
    Delete     TerminateInstances, then DescribeInstances until terminated

Background loops, one set per (account, region): a watch that describes every
instance holding a machine (an instance EC2 ended is a FAILED machine, with a
``spot interruption`` reason for reclaimed spot), the interruption-notice
reader (SQS), and a refresh of quotas, offerings and spot prices that adds
slots when quota grows.

boto3 blocks, so every call runs in a worker thread; everything that changes
machine records runs on the event loop, as the core requires. Throttling
(``RequestLimitExceeded``) is retried with jittered exponential back-off
until the transition's deadline; ``InsufficientInstanceCapacity`` fails the
Create and cools that (zone, type, capacity type) down. Launches wait for a
token of their (account, region) bucket.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from providers import validation
from providers.catalog import Shape, scaled
from providers.clock import AsyncioScheduler, Scheduler
from providers.config import ProviderConfig
from providers.core import MachineRecord, Plan, ProviderCore
from providers.ec2.cloud import (
    CloudError,
    CloudRefused,
    InstanceTypeInfo,
    InstanceView,
    Notice,
    RegionApi,
    Throttled,
    quiet_sdk_loggers,
)
from providers.ec2.notices import LABEL, parse_notice
from providers.ec2.prices import PriceTable
from providers.ec2.settings import Ec2Settings, SettingsError
from providers.model import Ack, CapacityType, FencingToken, HostRef, Operation, State
from providers.ratelimit import TokenBucket

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_SHORT = {"on-demand": "od", "spot": "spot"}
#: States in which a machine holds an instance that the watch keeps an eye on.
_WATCHED = frozenset({State.IDLE, State.CONFIGURING, State.CONFIGURED, State.DRAINING})
_GONE = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
_COMMAND_FAILED = frozenset(
    {
        "Failed",
        "Cancelled",
        "TimedOut",
        "Cancelling",
        "Undeliverable",
        "Terminated",
        "DeliveryTimedOut",
    }
)
#: Where a machine's region and account are kept in its record.
_REGION = "region"
_ACCOUNT = "account"
_NOTICE = "notice"

RegionKey = tuple[str, str]


@dataclass
class RegionCatalog:
    """What one refresh learned about one (account, region)."""

    quota_vcpus: dict[str, int]
    offerings: dict[str, set[str]]
    types: dict[str, InstanceTypeInfo]
    spot_prices: dict[tuple[str, str], float]
    zones: list[str] = field(default_factory=list)


class _Superseded(Exception):
    """The operation a background task works for is no longer the machine's
    current one (its deadline failed it, or the provider closed)."""


def client_token(machine_id: str, operation_id: str, what: str) -> str:
    """The idempotency token of one EC2 call of one operation: a retry of
    the same launch (after throttling, or a lost answer) names the same
    token and gets the same instance; the next operation gets a fresh one."""
    digest = hashlib.sha256(f"{machine_id}\0{operation_id}\0{what}".encode()).hexdigest()
    return digest[:64]


class Ec2Provider(ProviderCore):
    """The EC2 provider. See the module docstring."""

    kind = "ec2"
    supports_delete = True

    def __init__(
        self,
        config: ProviderConfig,
        *,
        scheduler: Scheduler | None = None,
    ) -> None:
        if config.ec2 is None:
            raise SettingsError("ec2", "the ec2 provider needs its settings file (--ec2-config)")
        if scheduler is not None and not isinstance(scheduler, AsyncioScheduler):
            raise ValueError(
                "the EC2 provider runs on the event loop; a manual clock cannot drive EC2"
            )
        quiet_sdk_loggers()
        self.settings: Ec2Settings = config.ec2
        self._prices = PriceTable.load(self.settings.prices_path)
        self._apis: dict[RegionKey, RegionApi] = {
            (account.alias, region.region): RegionApi(self.settings, account, region)
            for account in self.settings.accounts
            for region in account.regions
        }
        self._buckets = {
            key: TokenBucket(self.settings.launches_per_second, self.settings.launch_burst)
            for key in self._apis
        }
        self._catalogs: dict[RegionKey, RegionCatalog] = {}
        for key in self._apis:
            self._catalogs[key] = self._read_catalog(key, previous=None)
        self._check_prices()
        self._blobs: dict[str, bytes] = {}
        self._cooldown: dict[tuple[str, str, str], float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._jitter = random.Random(config.seed)
        super().__init__(config, scheduler=scheduler or AsyncioScheduler())

    @property
    def lineage(self) -> str:
        """This state's lineage, tagged on every instance it launches."""
        return self._lineage

    # ------------------------------------------------------------------ catalog

    def _read_catalog(self, key: RegionKey, previous: RegionCatalog | None) -> RegionCatalog:
        """Quota, offerings, shapes and spot prices of one (account, region).
        Blocking: called at construction and from a worker thread."""
        api = self._apis[key]
        region = api.region
        quota: dict[str, int] = {}
        for capacity in self.settings.capacity_types:
            found = api.vcpu_quota(capacity)
            if found is None:
                fallback = region.quota_vcpus.get(capacity)
                if fallback is None:
                    if previous is not None:
                        quota[capacity] = previous.quota_vcpus.get(capacity, 0)
                        continue
                    raise SettingsError(
                        f"accounts[{key[0]}].regions.{key[1]}.quota_vcpus.{capacity}",
                        "Service Quotas gave no vCPU quota for EC2 and the settings name none",
                    )
                if previous is None:
                    log.warning(
                        "Service Quotas gave no %s vCPU quota for %s/%s: using quota_vcpus "
                        "from the settings (%d vCPUs)",
                        capacity,
                        key[0],
                        key[1],
                        fallback,
                    )
                found = fallback
            quota[capacity] = found
        offerings = api.offerings(self.settings.instance_types)
        zones = sorted(offerings)
        if region.zones:
            zones = [z for z in zones if z in region.zones]
        types = api.instance_types(self.settings.instance_types)
        missing = [t for t in self.settings.instance_types if t not in types]
        if missing and previous is None:
            raise SettingsError("instance_types", f"EC2 does not know {missing} in {key[1]}")
        spot = api.spot_prices(self.settings.instance_types) if "spot" in quota else {}
        return RegionCatalog(quota, offerings, types, spot, zones)

    def _check_prices(self) -> None:
        for _, region in self._apis:
            for index, name in enumerate(self.settings.instance_types):
                if self._prices.on_demand(region, name) is None:
                    raise SettingsError(
                        f"instance_types[{index}]",
                        f"the price file has no on-demand price for {name} in {region}",
                    )

    def _slots(self, key: RegionKey) -> list[MachineRecord]:
        """The speculative slots of one (account, region): each capacity
        type's vCPU quota (scaled by ``quota_scale``) shared equally by the
        allowed instance types, each type's share spread round-robin over the
        zones that offer it. The slots' vCPUs never add up to more than the
        quota, so the shard cannot plan beyond it."""
        catalog = self._catalogs[key]
        out: list[MachineRecord] = []
        for capacity in self.settings.capacity_types:
            quota = scaled(catalog.quota_vcpus.get(capacity, 0), self.config.quota_scale)
            offered = [
                t
                for t in self.settings.instance_types
                if t in catalog.types and any(t in catalog.offerings[z] for z in catalog.zones)
            ]
            if not offered:
                continue
            share = quota // len(offered)
            for name in offered:
                info = catalog.types[name]
                zones = [z for z in catalog.zones if name in catalog.offerings[z]]
                for index in range(share // max(info.vcpu, 1)):
                    out.append(
                        self._slot(key, catalog, info, capacity, zones[index % len(zones)], index)
                    )
        return out

    def _slot(
        self,
        key: RegionKey,
        catalog: RegionCatalog,
        info: InstanceTypeInfo,
        capacity_label: str,
        zone: str,
        index: int,
    ) -> MachineRecord:
        alias, region = key
        shape = Shape(
            vcpu=info.vcpu,
            memory_gib=info.memory_mib / 1024,
            disk_gib=float(self.settings.root_volume_gib),
            gpus=info.gpus,
            gpu_product=info.gpu_product,
            gpu_memory_gib=info.gpu_memory_mib / 1024,
            arch=info.arch,
        )
        allocatable = shape.allocatable()
        capacity = CapacityType.from_label(capacity_label)
        slug = info.name.replace(".", "-")
        return MachineRecord(
            id=f"{self.config.name}-{alias}-{zone}-{slug}-{_SHORT[capacity_label]}-{index:03d}",
            state=State.SPECULATIVE,
            instance_type=info.name,
            zone=zone,
            capacity_type=capacity,
            price_per_hour=self._price(region, catalog, info.name, zone, capacity),
            interruption_probability=self._baseline_interruption(capacity),
            resources=dict(allocatable),
            allocatable=dict(allocatable),
            labels={
                "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": zone,
                "node.kubernetes.io/instance-type": info.name,
                "bigfleet.io/capacity-type": capacity_label,
                "bigfleet.io/provider": self.config.name,
                "bigfleet.io/account": alias,
                "bigfleet.io/instance-family": info.name.split(".")[0],
                **shape.labels(),
            },
            attrs={_ACCOUNT: alias, _REGION: region},
        )

    def _price(
        self, region: str, catalog: RegionCatalog, name: str, zone: str, capacity: CapacityType
    ) -> float:
        on_demand = self._prices.on_demand(region, name) or 0.0
        if capacity is CapacityType.SPOT:
            return round(catalog.spot_prices.get((zone, name), on_demand), 6)
        return on_demand

    def _baseline_interruption(self, capacity: CapacityType) -> float:
        return self.settings.spot_interruption_per_hour if capacity is CapacityType.SPOT else 0.0

    # ------------------------------------------------------------------ core hooks

    def _build_inventory(self) -> list[MachineRecord]:
        records: list[MachineRecord] = []
        for key in self._apis:
            records.extend(self._slots(key))
        return records

    def _plan(self, record: MachineRecord, op: Operation, grace: int) -> Plan:
        if op is Operation.DRAIN:
            # The cluster's workloads leave in their own time, forced at the grace.
            latency = self.config.latency("drain")
            return Plan(min(self._uniform(latency.low, latency.high), float(grace)))
        return Plan(None, external=True)

    def _mint_host(self, record: MachineRecord) -> HostRef:
        # The instance id is known once RunInstances answers; until then the
        # host names only the region (callers do not see a CREATING host).
        return HostRef(provider=f"{self.config.name}-{record.attrs[_REGION]}", ref="")

    def _start_external(self, record: MachineRecord, op: Operation) -> None:
        machine_id, operation_id = record.id, record.operation_id
        if op is Operation.CREATE:
            self._spawn(self._guard(machine_id, operation_id, self._launch(record)))
        elif op is Operation.CONFIGURE:
            blob = self._blobs.pop(machine_id, b"")
            self._spawn(self._guard(machine_id, operation_id, self._bootstrap(record, blob)))
        elif op is Operation.DELETE:
            self._spawn(self._guard(machine_id, operation_id, self._terminate(record)))
        else:  # pragma: no cover - Drain is a timed plan
            raise AssertionError(op)

    def _on_host_released(self, record: MachineRecord) -> None:
        host = record.host
        if host is not None and host.ref and record.operation is not Operation.DELETE:
            # A FAILED machine released by clean-up: its instance goes too.
            self._spawn(
                self._terminate_quietly(record.attrs[_REGION], record.attrs[_ACCOUNT], host.ref)
            )
        record.host = None
        record.interruption_probability = self._baseline_interruption(record.capacity_type)
        record.labels.pop(LABEL, None)
        record.attrs.pop(_NOTICE, None)

    def _on_start(self) -> None:
        for key in self._apis:
            self._spawn(self._forever(f"watch {key}", self._watch_once, key, self.settings.watch_s))
            self._spawn(
                self._forever(
                    f"refresh {key}", self._refresh_once, key, self.settings.refresh_s, first=True
                )
            )
            if self._apis[key].region.interruption_queue_url:
                self._spawn(self._forever(f"notices {key}", self._notices_once, key, 0.0))

    def close(self) -> None:
        """Stop the background loops, then close the core (final snapshot)."""
        for task in list(self._tasks):
            task.cancel()
        super().close()

    # ------------------------------------------------------------------ contract

    def configure(
        self,
        machine_id: str,
        cluster_id: str,
        bootstrap_blob: bytes = b"",
        token: FencingToken | None = None,
        shard_metadata: Mapping[str, str] | None = None,
    ) -> Ack:
        """As `ProviderCore.configure`; the blob is held in memory only until
        SendCommand carries it (never journaled, tagged or logged)."""
        validation.bootstrap_blob(bootstrap_blob)
        self._blobs[machine_id] = bytes(bootstrap_blob)
        try:
            return super().configure(machine_id, cluster_id, bootstrap_blob, token, shard_metadata)
        finally:
            self._blobs.pop(machine_id, None)

    # ------------------------------------------------------------------ transitions

    async def _launch(self, record: MachineRecord) -> None:
        machine_id, operation_id = record.id, record.operation_id
        key = self._key(record)
        api = self._apis[key]
        pool = (record.zone, record.instance_type, record.capacity_type.label)
        loop = asyncio.get_running_loop()
        cooling = self._cooldown.get(pool, 0.0)
        if cooling > loop.time():
            self.stats["launches_skipped_in_cooldown"] += 1
            self._finish(
                machine_id,
                operation_id,
                f"InsufficientInstanceCapacity: {record.instance_type} "
                f"{record.capacity_type.label} in {record.zone} is cooling down after EC2 ran "
                "out of capacity",
            )
            return
        start = self._buckets[key].reserve(loop.time())
        if start > loop.time():
            self.stats["launches_queued_by_rate_limit"] += 1
            await asyncio.sleep(start - loop.time())
        self._check_current(machine_id, operation_id)
        try:
            instance_id = await self._retrying(
                machine_id,
                operation_id,
                lambda: api.run_instance(
                    machine_id=machine_id,
                    provider_name=self.config.name,
                    lineage=self._lineage,
                    instance_type=record.instance_type,
                    zone=record.zone,
                    spot=record.capacity_type is CapacityType.SPOT,
                    client_token=client_token(machine_id, operation_id, "run"),
                ),
            )
        except CloudRefused as err:
            if err.code in ("InsufficientInstanceCapacity", "InsufficientCapacity"):
                self.stats["insufficient_capacity"] += 1
                self._cooldown[pool] = loop.time() + self.settings.capacity_cooldown_s
            self._finish(machine_id, operation_id, str(err))
            return
        current = self._machines[machine_id]
        if current.operation_id != operation_id or current.host is None:
            # Cleaned up while EC2 was answering: nothing will hold this instance.
            await self._terminate_quietly(key[1], key[0], instance_id)
            return
        # Journal the instance at once: a restart or a missed deadline then
        # knows which instance to terminate when the machine is cleaned up.
        current.host = HostRef(current.host.provider, instance_id)
        self._dirty_machines.add(machine_id)
        self._commit()
        while True:
            self._check_current(machine_id, operation_id)
            views = await self._retrying(
                machine_id, operation_id, lambda: api.describe([instance_id])
            )
            view = views.get(instance_id)
            if view is not None and view.state == "running":
                self._finish(machine_id, operation_id, None)
                return
            if view is not None and view.state in _GONE:
                self._finish(
                    machine_id,
                    operation_id,
                    f"instance {instance_id} became {view.state} while launching"
                    + (f": {view.state_reason}" if view.state_reason else ""),
                )
                return
            await asyncio.sleep(self.settings.poll_s)

    async def _bootstrap(self, record: MachineRecord, blob: bytes) -> None:
        machine_id, operation_id = record.id, record.operation_id
        api = self._apis[self._key(record)]
        assert record.host is not None
        instance_id = record.host.ref
        try:
            command_id = await self._retrying(
                machine_id,
                operation_id,
                lambda: api.send_bootstrap(
                    instance_id, blob, comment=f"bigfleet configure {machine_id}"
                ),
            )
        except CloudRefused as err:
            self._finish(machine_id, operation_id, f"SSM SendCommand refused: {err}")
            return
        while True:
            self._check_current(machine_id, operation_id)
            status, details = await self._retrying(
                machine_id, operation_id, lambda: api.command_status(command_id, instance_id)
            )
            if status == "Success":
                self._finish(machine_id, operation_id, None)
                return
            if status in _COMMAND_FAILED:
                self._finish(
                    machine_id,
                    operation_id,
                    f"bootstrap command {command_id} ended {status}"
                    + (f": {details}" if details else ""),
                )
                return
            await asyncio.sleep(self.settings.poll_s)

    async def _terminate(self, record: MachineRecord) -> None:
        machine_id, operation_id = record.id, record.operation_id
        api = self._apis[self._key(record)]
        assert record.host is not None
        instance_id = record.host.ref
        try:
            await self._retrying(machine_id, operation_id, lambda: api.terminate(instance_id))
        except CloudRefused as err:
            self._finish(machine_id, operation_id, f"TerminateInstances refused: {err}")
            return
        while True:
            self._check_current(machine_id, operation_id)
            views = await self._retrying(
                machine_id, operation_id, lambda: api.describe([instance_id])
            )
            view = views.get(instance_id)
            if view is None or view.state == "terminated":
                self._finish(machine_id, operation_id, None)
                return
            await asyncio.sleep(self.settings.poll_s)

    async def _terminate_quietly(self, region: str, account: str, instance_id: str) -> None:
        """Terminate an instance no machine needs any more; give up after a
        few throttled attempts (the next orphan sweep tries again)."""
        api = self._apis[(account, region)]
        for attempt in range(5):
            try:
                await asyncio.to_thread(api.terminate, instance_id)
                self.stats["instances_released"] += 1
                return
            except Throttled:
                await asyncio.sleep(self._backoff(attempt))
            except CloudRefused as err:
                log.warning("could not terminate %s: %s", instance_id, err)
                return

    def _finish(self, machine_id: str, operation_id: str, error: str | None) -> None:
        """Report a transition's outcome to the core (which discards it if
        the machine has moved on, like any late completion)."""
        self._complete(machine_id, operation_id, error)

    # ------------------------------------------------------------------ background

    async def _watch_once(self, key: RegionKey) -> None:
        """Describe every instance holding a machine of this region; a machine
        whose instance EC2 ended goes FAILED (spot: ``spot interruption``)."""
        watched = {
            r.host.ref: r
            for r in self._machines.values()
            if r.state in _WATCHED and r.host is not None and r.host.ref and self._key(r) == key
        }
        if not watched:
            return
        views = await asyncio.to_thread(self._apis[key].describe, list(watched))
        for instance_id, record in watched.items():
            view = views.get(instance_id)
            if view is not None and view.state not in _GONE:
                continue
            if (
                record.state not in _WATCHED
                or record.host is None
                or record.host.ref != instance_id
            ):
                continue  # moved on while we were asking
            self._lost(record, instance_id, view)

    def _lost(self, record: MachineRecord, instance_id: str, view: InstanceView | None) -> None:
        state = "gone" if view is None else view.state
        reason = f" ({view.state_reason})" if view is not None and view.state_reason else ""
        if record.capacity_type is CapacityType.SPOT:
            self.stats["spot_interruptions"] += 1
            notice = record.attrs.get(_NOTICE, "")
            after = f" after its {notice.replace('-', ' ')}" if notice else ""
            message = (
                f"spot interruption: EC2 reclaimed instance {instance_id}{after} "
                f"(it is {state}){reason}"
            )
        else:
            self.stats["instances_lost"] += 1
            message = f"instance {instance_id} is {state} outside BigFleet{reason}"
        log.warning("machine %s: %s", record.id, message)
        try:
            self._fail(record, message)
        finally:
            self._commit()

    async def _notices_once(self, key: RegionKey) -> None:
        """Read interruption notices and raise the named machines' risk."""
        api = self._apis[key]
        messages = await asyncio.to_thread(self._receive_notices, api)
        by_instance = {
            r.host.ref: r for r in self._machines.values() if r.host is not None and r.host.ref
        }
        for message in messages:
            notice = parse_notice(message.body)
            if notice is None:
                self.stats["notices_ignored"] += 1
            else:
                record = by_instance.get(notice.instance_id)
                if record is None:
                    self.stats["notices_for_unknown_instances"] += 1
                    log.info(
                        "interruption notice for %s, which holds no machine", notice.instance_id
                    )
                elif notice.probability > record.interruption_probability:
                    self.stats[f"notices:{notice.label}"] += 1
                    log.warning(
                        "machine %s (%s): %s; interruption probability %.2f -> %.2f",
                        record.id,
                        notice.instance_id,
                        notice.label,
                        record.interruption_probability,
                        notice.probability,
                    )
                    record.interruption_probability = notice.probability
                    record.labels[LABEL] = notice.label
                    record.attrs[_NOTICE] = notice.label
                    self._touch(record)
                    self._commit()
            await asyncio.to_thread(api.delete_notice, message.receipt)

    def _receive_notices(self, api: RegionApi) -> list[Notice]:
        """One long poll of the queue, on a worker thread. Closing the provider
        cancels the awaiting task but not the thread: what a poll still in
        flight receives after the close is made visible again at once, so the
        next consumer reads it now rather than after the visibility timeout."""
        messages = api.receive_notices(self.settings.queue_wait_s)
        if self._closed and messages:
            api.release_notices([m.receipt for m in messages])
            return []
        return messages

    async def _refresh_once(self, key: RegionKey) -> None:
        """Read quotas, offerings and spot prices again: spot prices move,
        and slots are added when quota grows (a quota that shrinks leaves the
        existing slots in place: EC2 refuses launches beyond it, and those
        Creates fail with its error)."""
        catalog = await asyncio.to_thread(self._read_catalog, key, self._catalogs[key])
        self._catalogs[key] = catalog
        changed = False
        for record in self._machines.values():
            if self._key(record) != key or record.capacity_type is not CapacityType.SPOT:
                continue
            price = self._price(
                key[1], catalog, record.instance_type, record.zone, record.capacity_type
            )
            if price != record.price_per_hour:
                record.price_per_hour = price
                self._touch(record)
                changed = True
        for slot in self._slots(key):
            if slot.id not in self._machines:
                self._machines[slot.id] = slot
                self._touch(slot)
                self.stats["slots_added"] += 1
                changed = True
        if changed:
            self._commit()
        await self._sweep_orphans(key)

    async def _sweep_orphans(self, key: RegionKey) -> None:
        """Instances this provider launched that no machine holds: a launch
        whose answer a crash lost. A FAILED machine without an instance
        adopts its own (so clean-up terminates it); any other is terminated."""
        tagged = await asyncio.to_thread(self._apis[key].tagged, self.config.name, self._lineage)
        held = {r.host.ref for r in self._machines.values() if r.host is not None and r.host.ref}
        for instance_id, view in tagged.items():
            if instance_id in held:
                continue
            record = self._machines.get(view.machine_id)
            if record is not None and record.state is State.CREATING:
                continue  # its launch is answering right now
            if (
                record is not None
                and record.state is State.FAILED
                and record.host is not None
                and not record.host.ref
            ):
                record.host = HostRef(record.host.provider, instance_id)
                self._dirty_machines.add(record.id)
                self._commit()
                self.stats["orphans_adopted"] += 1
                continue
            self.stats["orphans_terminated"] += 1
            log.warning("terminating instance %s: no machine holds it", instance_id)
            await self._terminate_quietly(key[1], key[0], instance_id)

    # ------------------------------------------------------------------ plumbing

    def _key(self, record: MachineRecord) -> RegionKey:
        return (record.attrs[_ACCOUNT], record.attrs[_REGION])

    def _check_current(self, machine_id: str, operation_id: str) -> None:
        record = self._machines.get(machine_id)
        if (
            self._closed
            or record is None
            or record.operation_id != operation_id
            or record.operation is None
            or record.state is not record.operation.transitional
        ):
            raise _Superseded

    async def _retrying(self, machine_id: str, operation_id: str, call: Callable[[], _T]) -> _T:
        """Run a blocking EC2 call in a thread, backing off while it is
        throttled, for as long as the operation is current (its deadline
        bounds the wait)."""
        attempt = 0
        while True:
            self._check_current(machine_id, operation_id)
            try:
                return await asyncio.to_thread(call)
            except Throttled as err:
                self.stats["throttled"] += 1
                log.info("%s throttled (%s); backing off", machine_id, err.code)
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1

    def _backoff(self, attempt: int) -> float:
        """Jittered exponential back-off: from the poll interval (at most 1 s)
        doubling to twenty times that."""
        base = min(1.0, self.settings.poll_s)
        return min(base * 2.0**attempt, 20 * base) * self._jitter.uniform(0.5, 1.0)

    async def _guard(self, machine_id: str, operation_id: str, work: Awaitable[None]) -> None:
        """Run one transition's cloud work; end quietly when it is superseded,
        and fail the machine with the error when the work breaks."""
        try:
            await work
        except _Superseded:
            return
        except CloudError as err:
            self._finish(machine_id, operation_id, str(err))
        except Exception as err:  # a bug must not leave the machine in motion forever
            log.exception("cloud work for %s failed", machine_id)
            self._finish(machine_id, operation_id, f"provider error: {type(err).__name__}: {err}")

    async def _forever(
        self,
        what: str,
        once: Callable[[RegionKey], Awaitable[None]],
        key: RegionKey,
        every: float,
        *,
        first: bool = False,
    ) -> None:
        """Run ``once(key)`` every ``every`` seconds until the provider closes;
        throttling and errors are logged and the loop goes on."""
        attempt = 0
        if first:
            await asyncio.sleep(every)
        while not self._closed:
            try:
                await once(key)
                attempt = 0
            except Throttled:
                self.stats["throttled"] += 1
                attempt += 1
            except CloudError as err:
                log.warning("%s: %s", what, err)
                attempt += 1
            except Exception:
                log.exception("%s failed", what)
                attempt += 1
            await asyncio.sleep(max(every, self._backoff(attempt) if attempt else 0.0) or 0.01)

    def _spawn(self, work: Awaitable[None]) -> None:
        if self._closed:
            if asyncio.iscoroutine(work):
                work.close()
            return
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = ["Ec2Provider", "RegionCatalog", "client_token"]
