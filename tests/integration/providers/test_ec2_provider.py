"""The EC2 provider's own behaviour, over the wire against moto's API server:
quota slots, launches, bootstrap delivery, termination, interruption notices,
throttling and capacity errors, the launch bucket, orphan clean-up.

(The contract every provider keeps is the conformance suite's; it runs
against EC2 too.) Faults EC2 would produce but moto does not, throttling and
InsufficientInstanceCapacity, come from a small HTTP proxy in front of moto
that answers chosen RunInstances calls with EC2's error response.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import gzip
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web

from bigfleet.v1alpha1 import provider_pb2 as pb
from providers.client import ProviderClient
from providers.config import ProviderConfig
from providers.ec2.local import LocalEc2, start_local_ec2
from providers.ec2.notices import LABEL, REBALANCE, SPOT_WARNING
from providers.ec2.prices import PriceTable
from providers.ec2.provider import Ec2Provider, client_token
from providers.ec2.settings import Ec2Settings
from providers.server import RunningProvider, start_provider_server
from shard_engine.quantity import parse_quantity
from tests.integration.providers.provider_harness import EC2_DEADLINES, Harness, Shard
from tests.waiting import eventually

QUOTA = 400
SCALE = 0.2


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEc2]:
    """A moto server of this module's own, with an interruption queue."""
    server = start_local_ec2(quota_vcpus=QUOTA, poll_s=0.05, watch_s=0.5, queue_wait_s=1)
    try:
        yield server
    finally:
        server.stop()


async def serve(settings: Ec2Settings, **overrides: Any) -> RunningProvider:
    config = ProviderConfig(
        kind="ec2",
        time_factor=0.001,
        quota_scale=SCALE,
        # About 9 real seconds: no test here waits for a deadline, and a busy
        # machine must not turn a slow answer into one.
        deadlines_s={op: 9000.0 for op in EC2_DEADLINES},
        ec2=settings,
    )
    return await start_provider_server(replace(config, **overrides), "127.0.0.1:0")


class Ec2Harness(Harness):
    """The conformance harness plus the provider core and its moto server."""

    local: LocalEc2

    @property
    def ec2(self) -> Ec2Provider:
        core = self.core
        assert isinstance(core, Ec2Provider)
        return core

    async def configured_spot(self, shard: Shard) -> pb.Machine:
        """A fresh spot machine walked to CONFIGURED."""
        machine = await self.machine(spot)
        await self.client.create(machine.id, shard.token())
        await self.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
        await self.client.configure(machine.id, "c-spot", b"#!/bin/sh\n", shard.token())
        return await self.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)

    def launched(self, machine_id: str) -> int:
        """How many instances this provider launched for ``machine_id`` (other
        providers of this module share the server and the machine ids)."""
        filters = [
            {"Name": "tag:bigfleet.io/machine", "Values": [machine_id]},
            {"Name": "tag:bigfleet.io/lineage", "Values": [self.ec2.lineage]},
        ]
        reservations = self.local.client("ec2").describe_instances(Filters=filters)
        return sum(len(r["Instances"]) for r in reservations["Reservations"])

    def instance(self, instance_id: str) -> dict[str, Any]:
        """The instance as moto's EC2 describes it."""
        (reservation,) = self.local.client("ec2").describe_instances(InstanceIds=[instance_id])[
            "Reservations"
        ]
        (instance,) = reservation["Instances"]
        return dict(instance)


async def harness_for(local: LocalEc2, settings: Ec2Settings, **overrides: Any) -> Ec2Harness:
    running = await serve(settings, **overrides)
    h = Ec2Harness("ec2", running, ProviderClient(running.address))
    h.local = local
    return h


@pytest.fixture
async def h(local: LocalEc2) -> AsyncIterator[Ec2Harness]:
    harness = await harness_for(local, local.settings)
    try:
        yield harness
    finally:
        await harness.client.close()
        assert harness.running is not None
        await harness.running.stop(grace=None)


class FaultProxy:
    """Forwards every request to moto, except that the next calls of an
    action are answered with the EC2 error codes queued for it in
    ``faults`` (``faults["RunInstances"] = ["RequestLimitExceeded"]``). Runs on
    its own loop in its own thread: the provider's constructor reads its
    catalog through it with blocking calls."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
        self.seen: collections.Counter[str] = collections.Counter()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Keep-alive connections of the SDK must not hold the shutdown up.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession()

    async def _stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        action = parse_qs(body.decode(errors="replace")).get("Action", [""])[0]
        self.seen[action] += 1
        if self.faults[action]:
            code = self.faults[action].pop(0)
            xml = (
                "<Response><Errors><Error><Code>"
                f"{code}</Code><Message>injected by the test</Message></Error></Errors>"
                "<RequestID>fault</RequestID></Response>"
            )
            status = 503 if code == "RequestLimitExceeded" else 500
            return web.Response(status=status, body=xml.encode(), content_type="text/xml")
        assert self._session is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding")
        }
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
            }
            return web.Response(status=answer.status, body=payload, headers=kept)


@pytest.fixture
async def proxied(local: LocalEc2) -> AsyncIterator[tuple[Ec2Harness, FaultProxy]]:
    proxy = FaultProxy(local.endpoint_url)
    proxy.start()
    settings = replace(local.settings, endpoint_url=proxy.url, capacity_cooldown_s=3600.0)
    harness = await harness_for(local, settings)
    try:
        yield harness, proxy
    finally:
        await harness.client.close()
        assert harness.running is not None
        await harness.running.stop(grace=None)
        proxy.stop()


def spot(machine: pb.Machine) -> bool:
    return machine.capacity_type == pb.CAPACITY_TYPE_SPOT


async def test_quota_comes_from_the_settings_when_service_quotas_is_silent(
    local: LocalEc2, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="providers.ec2.provider")
    harness = await harness_for(local, local.settings)
    try:
        fallbacks = [r.getMessage() for r in caplog.records if "Service Quotas" in r.getMessage()]
        assert len(fallbacks) == 2  # on-demand and spot: moto knows no EC2 quotas
        assert all("using quota_vcpus from the settings" in line for line in fallbacks)
        listing = await harness.client.list_all()
        used: collections.Counter[int] = collections.Counter()
        for machine in listing.machines:
            used[machine.capacity_type] += int(
                parse_quantity(machine.resources.resources["cpu"]) + 0.5
            )
        vcpus = {
            m.instance_type: int(parse_quantity(m.allocatable.resources["cpu"]) + 0.5)
            for m in listing.machines
        }
        assert set(vcpus) == set(local.settings.instance_types)
        for capacity in (pb.CAPACITY_TYPE_ON_DEMAND, pb.CAPACITY_TYPE_SPOT):
            # The slots' vCPUs fill the scaled quota without exceeding it.
            assert QUOTA * SCALE - 3 * max(vcpus.values()) < used[capacity] <= QUOTA * SCALE
    finally:
        await harness.client.close()
        assert harness.running is not None
        await harness.running.stop(grace=None)


async def test_slots_sit_in_the_chosen_zones_at_the_file_and_market_prices(h: Ec2Harness) -> None:
    prices = PriceTable.load()
    history = h.local.client("ec2").describe_spot_price_history(
        InstanceTypes=list(h.local.settings.instance_types)
    )["SpotPriceHistory"]
    market = {(r["AvailabilityZone"], r["InstanceType"]): float(r["SpotPrice"]) for r in history}
    zones = set(h.local.settings.accounts[0].regions[0].zones)
    listing = await h.client.list_all()
    assert {m.zone for m in listing.machines} == zones
    for machine in listing.machines:
        if spot(machine):
            assert machine.price_per_hour == pytest.approx(
                market[(machine.zone, machine.instance_type)]
            )
            assert machine.interruption_probability == pytest.approx(0.05)
        else:
            assert machine.price_per_hour == prices.on_demand("us-east-1", machine.instance_type)
            assert machine.interruption_probability == 0
        assert machine.labels["kubernetes.io/arch"] == "amd64"


async def test_a_spot_create_launches_one_spot_instance_named_by_its_operation(
    h: Ec2Harness,
) -> None:
    shard = h.shard()
    machine = await h.machine(spot)
    ack = await h.client.create(machine.id, shard.token())
    idle = await h.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
    instance = h.instance(idle.host.ref)
    assert instance["State"]["Name"] == "running"
    assert instance["InstanceLifecycle"] == "spot"
    assert instance["InstanceType"] == machine.instance_type
    assert instance["Placement"]["AvailabilityZone"] == machine.zone
    assert instance["ClientToken"] == client_token(machine.id, ack.operation_id, "run")
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["bigfleet.io/machine"] == machine.id
    # A retry is the same operation and launches nothing new.
    again = await h.client.create(machine.id, shard.token())
    assert again.operation_id == ack.operation_id
    assert h.launched(machine.id) == 1


async def test_configure_delivers_the_blob_by_ssm_and_never_into_tags_or_logs(
    local: LocalEc2, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    state = tmp_path / "ec2.json"
    h = await harness_for(local, local.settings, state_path=state)
    try:
        marker = "blob-secret-7f3a9c"
        blob = f"#!/bin/sh\necho {marker}\n".encode()
        encoded = base64.b64encode(gzip.compress(blob, mtime=0)).decode()
        shard = h.shard()
        machine = await h.idle(shard)
        await h.client.configure(machine.id, "c-ssm", blob, shard.token(), {"need": "n1"})
        configured = await h.wait_state(machine.id, pb.MACHINE_STATE_CONFIGURED)
        commands = local.client("ssm").list_commands(InstanceId=configured.host.ref)["Commands"]
        assert len(commands) == 1
        (command,) = commands
        assert command["DocumentName"] == "AWS-RunShellScript"
        delivered = "\n".join(command["Parameters"]["commands"])
        assert encoded in delivered  # the blob reached the instance, and only that way
        assert marker not in command.get("Comment", "")
        tags = h.instance(configured.host.ref)["Tags"]
        assert not any(marker in t["Value"] or encoded in t["Value"] for t in tags)
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert marker not in logged and encoded not in logged
        h.ec2.close()  # a final snapshot, then look at everything on disk
        files = sorted(tmp_path.iterdir())  # noqa: ASYNC240 - a few small files
        on_disk = "".join(p.read_bytes().decode(errors="replace") for p in files)
        assert marker not in on_disk and encoded not in on_disk
    finally:
        await h.client.close()
        assert h.running is not None
        await h.running.stop(grace=None)


async def test_delete_terminates_the_instance_and_gives_the_slot_back(h: Ec2Harness) -> None:
    shard = h.shard()
    idle = await h.idle(shard)
    await h.client.delete(idle.id, shard.token())
    back = await h.wait_state(idle.id, pb.MACHINE_STATE_SPECULATIVE)
    assert not back.HasField("host")
    assert h.instance(idle.host.ref)["State"]["Name"] == "terminated"


async def test_notices_raise_the_risk_and_a_reclaimed_spot_machine_fails(h: Ec2Harness) -> None:
    shard = h.shard()
    warned = await h.configured_spot(shard)
    rebalanced = await h.configured_spot(shard)
    h.local.client("sqs").send_message(QueueUrl=h.local.queue_url, MessageBody="not an event")
    h.local.send_notice(rebalanced.host.ref, REBALANCE)
    h.local.send_notice(warned.host.ref, SPOT_WARNING)

    async def risk(machine_id: str, probability: float) -> pb.Machine:
        async def check() -> pb.Machine | None:
            machine = await h.client.get(machine_id)
            return machine if machine.interruption_probability == probability else None

        found: pb.Machine = await eventually(check, within=60, what="the notice to take effect")
        return found

    rebalance = await risk(rebalanced.id, 0.5)
    warning = await risk(warned.id, 0.99)
    assert rebalance.labels[LABEL] == "rebalance-recommendation"
    assert warning.labels[LABEL] == "spot-interruption-warning"
    assert warning.state == pb.MACHINE_STATE_CONFIGURED  # still serving: the shard decides
    await h.wait_until(lambda: h.ec2.stats["notices_ignored"] == 1, within=60)
    left = h.local.client("sqs").receive_message(QueueUrl=h.local.queue_url, WaitTimeSeconds=0)
    assert not left.get("Messages")  # every notice was taken off the queue

    h.local.reclaim(warned.host.ref)
    failed = await h.wait_state(warned.id, pb.MACHINE_STATE_FAILED)
    assert failed.last_error.startswith("spot interruption: EC2 reclaimed instance")
    assert "after its spot interruption warning" in failed.last_error
    assert failed.cluster == "" and not failed.shard_metadata

    h.ec2.clear_failed(warned.id)
    slot = await h.client.get(warned.id)
    assert slot.state == pb.MACHINE_STATE_SPECULATIVE
    assert slot.interruption_probability == pytest.approx(0.05)
    assert LABEL not in slot.labels


async def test_throttled_launches_back_off_and_land_once(
    proxied: tuple[Ec2Harness, FaultProxy],
) -> None:
    h, proxy = proxied
    proxy.faults["RunInstances"] = ["RequestLimitExceeded", "RequestLimitExceeded"]
    before = proxy.seen["RunInstances"]
    idle = await h.idle()
    assert proxy.seen["RunInstances"] == before + 3
    assert h.ec2.stats["throttled"] >= 2
    assert h.launched(idle.id) == 1


async def test_insufficient_capacity_fails_the_create_and_cools_the_pool_down(
    proxied: tuple[Ec2Harness, FaultProxy],
) -> None:
    h, proxy = proxied
    proxy.faults["RunInstances"] = ["InsufficientInstanceCapacity"]
    first = await h.machine(spot)
    await h.client.create(first.id, h.shard().token())
    failed = await h.wait_state(first.id, pb.MACHINE_STATE_FAILED)
    assert failed.last_error.startswith("create failed: InsufficientInstanceCapacity")

    launches = proxy.seen["RunInstances"]
    same_pool = await h.machine(
        lambda m: (
            (m.zone, m.instance_type, m.capacity_type)
            == (first.zone, first.instance_type, first.capacity_type)
        )
    )
    await h.client.create(same_pool.id, h.shard().token())
    cooled = await h.wait_state(same_pool.id, pb.MACHINE_STATE_FAILED)
    assert "cooling down" in cooled.last_error
    assert proxy.seen["RunInstances"] == launches  # EC2 was not asked again

    other_pool = await h.machine(lambda m: m.instance_type != first.instance_type)
    await h.client.create(other_pool.id, h.shard().token())
    await h.wait_state(other_pool.id, pb.MACHINE_STATE_IDLE)


async def test_the_launch_bucket_queues_launches_beyond_its_burst(local: LocalEc2) -> None:
    settings = replace(local.settings, launches_per_second=2.0, launch_burst=1)
    h = await harness_for(local, settings)
    try:
        shard = h.shard()
        machines = [await h.machine() for _ in range(3)]
        for machine in machines:
            await h.client.create(machine.id, shard.token())
        for machine in machines:
            await h.wait_state(machine.id, pb.MACHINE_STATE_IDLE)
        assert h.ec2.stats["launches_queued_by_rate_limit"] == 2
    finally:
        await h.client.close()
        assert h.running is not None
        await h.running.stop(grace=None)


async def test_an_instance_no_machine_holds_is_terminated_by_the_sweep(local: LocalEc2) -> None:
    h = await harness_for(local, replace(local.settings, refresh_s=0.2))
    try:
        slot = await h.machine()
        ec2 = local.client("ec2")
        image = local.settings.accounts[0].regions[0].image_id
        tags = {
            "bigfleet.io/provider": h.ec2.name,
            "bigfleet.io/lineage": h.ec2.lineage,
            "bigfleet.io/machine": slot.id,
        }
        orphan = ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType=slot.instance_type,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
        )["Instances"][0]["InstanceId"]
        await h.wait_until(lambda: h.instance(orphan)["State"]["Name"] == "terminated")
        assert h.ec2.stats["orphans_terminated"] == 1
        assert (await h.client.get(slot.id)).state == pb.MACHINE_STATE_SPECULATIVE
    finally:
        await h.client.close()
        assert h.running is not None
        await h.running.stop(grace=None)


async def test_an_instance_ec2_ends_under_an_on_demand_machine_fails_it(h: Ec2Harness) -> None:
    idle = await h.idle()
    while idle.capacity_type != pb.CAPACITY_TYPE_ON_DEMAND:
        idle = await h.idle()
    h.local.client("ec2").terminate_instances(InstanceIds=[idle.host.ref])
    failed = await h.wait_state(idle.id, pb.MACHINE_STATE_FAILED)
    assert failed.last_error.startswith(f"instance {idle.host.ref} is terminated outside BigFleet")


async def test_an_instance_launched_before_a_restart_is_terminated_when_its_machine_is_cleaned_up(
    local: LocalEc2, tmp_path: Path
) -> None:
    proxy = FaultProxy(local.endpoint_url)
    proxy.start()
    settings = replace(local.settings, endpoint_url=proxy.url)
    state = tmp_path / "ec2.json"
    try:
        first = await harness_for(local, settings, state_path=state)
        machine = await first.machine()
        # EC2 launches the instance, then stops answering DescribeInstances:
        # the machine is CREATING when the provider dies.
        proxy.faults["DescribeInstances"] = ["RequestLimitExceeded"] * 10_000
        await first.client.create(machine.id, first.shard().token())
        await first.wait_until(
            lambda: proxy.seen["RunInstances"] >= 1 and first.ec2.stats["throttled"] > 0
        )
        await first.client.close()
        assert first.running is not None
        await first.running.stop(grace=None)
        proxy.faults.clear()

        second = await harness_for(local, settings, state_path=state)
        try:
            failed = await second.client.get(machine.id)
            assert failed.state == pb.MACHINE_STATE_FAILED
            assert "restart" in failed.last_error
            instance_id = failed.host.ref
            assert instance_id.startswith("i-")
            assert second.instance(instance_id)["State"]["Name"] == "running"
            second.ec2.clear_failed(machine.id)
            await second.wait_until(
                lambda: second.instance(instance_id)["State"]["Name"] == "terminated"
            )
            assert (await second.client.get(machine.id)).state == pb.MACHINE_STATE_SPECULATIVE
        finally:
            await second.client.close()
            assert second.running is not None
            await second.running.stop(grace=None)
    finally:
        proxy.stop()
