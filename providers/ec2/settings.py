"""What the EC2 provider manages: accounts, regions, zones, instance types and
capacity types, read once from a small YAML (or JSON) file, plus the AWS
settings that are not per account (endpoint URL, refresh cadence, launch rate).

A minimal file::

    accounts:
      - alias: prod
        profile: prod-fleet          # optional: a named AWS profile
        regions:
          us-east-1:
            image_id: ami-0123456789abcdef0
            zones: [us-east-1a, us-east-1b]            # optional: every offered zone
            subnets: {us-east-1a: subnet-aaa, us-east-1b: subnet-bbb}
            interruption_queue_url: https://sqs.us-east-1.amazonaws.com/1234/spot
            quota_vcpus: {on-demand: 256, spot: 256}   # only if Service Quotas is silent
    instance_types: [m6i.large, m6i.xlarge, c6i.2xlarge]
    capacity_types: [on-demand, spot]

Every error names the field it is about (``accounts[0].regions.us-east-1.image_id``)
and why it is refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Capacity types EC2 sells that this provider can launch.
CAPACITY_TYPES = ("on-demand", "spot")
#: First letters of the instance families whose vCPUs count against EC2's
#: "standard" on-demand and spot quotas (the two quotas this provider reads).
STANDARD_FAMILIES = "acdhimrtz"

_ALIAS = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?\Z")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d\Z")


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the field."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field_path = field_path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RegionSettings:
    """One region of one account."""

    region: str
    image_id: str
    #: Zones to offer; empty means every zone DescribeInstanceTypeOfferings names.
    zones: tuple[str, ...] = ()
    #: Subnet per zone (launches without one go to the default VPC's subnet).
    subnets: Mapping[str, str] = field(default_factory=dict)
    security_group_ids: tuple[str, ...] = ()
    #: The instance profile (name or ARN) instances run with; it must allow SSM.
    instance_profile: str = ""
    #: The SQS queue EventBridge sends spot interruption warnings and
    #: rebalance recommendations to; empty: no notices are read.
    interruption_queue_url: str = ""
    #: The vCPU quota per capacity type used when Service Quotas does not answer.
    quota_vcpus: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AccountSettings:
    """One AWS account: how to reach it and which regions of it to use."""

    alias: str
    regions: tuple[RegionSettings, ...]
    #: A named profile of the shared AWS config; empty: the default chain. A
    #: cross-account fleet names profiles with ``role_arn`` and
    #: ``source_profile``, whose credentials boto3 renews by itself.
    profile: str = ""


@dataclass(frozen=True, slots=True)
class Ec2Settings:
    """Everything the EC2 provider reads at start (see the module docstring).

    Durations are real seconds: EC2 does not run on simulated time.
    """

    accounts: tuple[AccountSettings, ...]
    instance_types: tuple[str, ...]
    capacity_types: tuple[str, ...] = CAPACITY_TYPES
    #: An EC2-compatible API endpoint instead of AWS (a local test server).
    endpoint_url: str = ""
    #: How often quotas, offerings and spot prices are read again.
    refresh_s: float = 300.0
    #: How often launches, terminations and bootstrap commands in flight are
    #: described.
    poll_s: float = 5.0
    #: How often every instance holding a machine is described, to notice the
    #: ones EC2 ended (spot reclaimed, terminated by someone else).
    watch_s: float = 30.0
    #: Longest wait of one SQS ReceiveMessage (long polling).
    queue_wait_s: int = 20
    #: RunInstances token bucket per (account, region).
    launches_per_second: float = 2.0
    launch_burst: int = 20
    #: After InsufficientInstanceCapacity, Creates in that (zone, type,
    #: capacity type) fail at once for this long instead of calling EC2.
    capacity_cooldown_s: float = 300.0
    #: Hourly interruption probability declared for spot machines without a notice.
    spot_interruption_per_hour: float = 0.05
    #: On-demand price file; empty: the shipped ``prices.json``.
    prices_path: str = ""
    #: Root volume size (GiB): ephemeral storage of every machine.
    root_volume_gib: int = 100
    #: Runs on the instance with the bootstrap blob's path as its argument.
    bootstrap_command: str = "/opt/bigfleet/bootstrap"

    def __post_init__(self) -> None:
        if not self.accounts:
            raise SettingsError("accounts", "at least one account is needed")
        if not self.instance_types:
            raise SettingsError("instance_types", "at least one instance type is needed")
        for index, name in enumerate(self.instance_types):
            if not re.fullmatch(r"[a-z0-9-]+\.[a-z0-9]+", name):
                raise SettingsError(f"instance_types[{index}]", f"{name!r} is not an instance type")
            if name[0] not in STANDARD_FAMILIES:
                raise SettingsError(
                    f"instance_types[{index}]",
                    f"{name} is not of a standard family ({', '.join(STANDARD_FAMILIES.upper())}):"
                    " its vCPU quota is another one, which this provider does not read yet",
                )
        for index, capacity in enumerate(self.capacity_types):
            if capacity not in CAPACITY_TYPES:
                raise SettingsError(
                    f"capacity_types[{index}]", f"{capacity!r} is not one of {list(CAPACITY_TYPES)}"
                )
        _positive("refresh_s", self.refresh_s)
        _positive("poll_s", self.poll_s)
        _positive("watch_s", self.watch_s)
        _positive("launches_per_second", self.launches_per_second)
        if self.launch_burst < 1:
            raise SettingsError("launch_burst", "must be at least 1")
        if not 0 <= self.queue_wait_s <= 20:
            raise SettingsError("queue_wait_s", "SQS long polling waits 0 to 20 seconds")
        if not 0 < self.spot_interruption_per_hour <= 1:
            raise SettingsError("spot_interruption_per_hour", "must be in (0, 1]")
        if self.capacity_cooldown_s < 0:
            raise SettingsError("capacity_cooldown_s", "must be >= 0")
        aliases = [a.alias for a in self.accounts]
        if len(set(aliases)) != len(aliases):
            raise SettingsError("accounts", "account aliases must be unique")


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise SettingsError(name, f"must be a positive number, not {value!r}")


def load_settings(path: Path, **overrides: Any) -> Ec2Settings:
    """Read ``path`` (YAML or JSON); keyword ``overrides`` (from the command
    line) replace top-level fields. Raises SettingsError naming the field."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SettingsError(str(path), f"cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise SettingsError(str(path), f"is not YAML or JSON ({err})") from None
    return parse_settings(raw, **overrides)


def parse_settings(raw: object, **overrides: Any) -> Ec2Settings:
    """Build `Ec2Settings` from a parsed document (see `load_settings`)."""
    if not isinstance(raw, Mapping):
        raise SettingsError("(top level)", "must be a mapping")
    known = {f for f in Ec2Settings.__dataclass_fields__}
    unknown = set(raw) - known
    if unknown:
        raise SettingsError(sorted(unknown)[0], f"is not a setting (known: {sorted(known)})")
    accounts_raw = raw.get("accounts")
    if not isinstance(accounts_raw, list):
        raise SettingsError("accounts", "must be a list of accounts")
    accounts = tuple(_account(f"accounts[{i}]", a) for i, a in enumerate(accounts_raw))
    values: dict[str, Any] = {k: v for k, v in raw.items() if k != "accounts"}
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("instance_types", "capacity_types"):
        if key in values:
            values[key] = tuple(_strings(key, values[key]))
    try:
        return Ec2Settings(accounts=accounts, **values)
    except TypeError as err:
        raise SettingsError("(top level)", str(err)) from None


def _account(where: str, raw: object) -> AccountSettings:
    if not isinstance(raw, Mapping):
        raise SettingsError(where, "must be a mapping")
    alias = raw.get("alias")
    if not isinstance(alias, str) or not _ALIAS.match(alias):
        raise SettingsError(
            f"{where}.alias", "must be 1-32 lowercase letters, digits or '-' (it is in machine ids)"
        )
    regions_raw = raw.get("regions")
    if not isinstance(regions_raw, Mapping) or not regions_raw:
        raise SettingsError(f"{where}.regions", "must map at least one region to its settings")
    regions = tuple(
        _region(f"{where}.regions.{name}", str(name), body) for name, body in regions_raw.items()
    )
    extra = set(raw) - {"alias", "regions", "profile"}
    if extra:
        raise SettingsError(f"{where}.{sorted(extra)[0]}", "is not an account setting")
    return AccountSettings(
        alias=alias,
        regions=regions,
        profile=str(raw.get("profile", "")),
    )


def _region(where: str, name: str, raw: object) -> RegionSettings:
    if not _REGION.match(name):
        raise SettingsError(where, f"{name!r} is not a region name")
    if not isinstance(raw, Mapping):
        raise SettingsError(where, "must be a mapping")
    image = raw.get("image_id")
    if not isinstance(image, str) or not image.startswith("ami-"):
        raise SettingsError(f"{where}.image_id", "must name an AMI (ami-...)")
    zones = tuple(_strings(f"{where}.zones", raw.get("zones", [])))
    for index, zone in enumerate(zones):
        if not zone.startswith(name):
            raise SettingsError(f"{where}.zones[{index}]", f"{zone!r} is not a zone of {name}")
    quota_raw = raw.get("quota_vcpus", {})
    if not isinstance(quota_raw, Mapping):
        raise SettingsError(f"{where}.quota_vcpus", "must map capacity types to vCPU counts")
    quota: dict[str, int] = {}
    for capacity, count in quota_raw.items():
        if capacity not in CAPACITY_TYPES:
            raise SettingsError(f"{where}.quota_vcpus.{capacity}", "is not a capacity type")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise SettingsError(f"{where}.quota_vcpus.{capacity}", "must be a whole number >= 0")
        quota[str(capacity)] = count
    subnets = raw.get("subnets", {})
    if not isinstance(subnets, Mapping):
        raise SettingsError(f"{where}.subnets", "must map zones to subnet ids")
    known = {
        "image_id",
        "zones",
        "subnets",
        "security_group_ids",
        "instance_profile",
        "interruption_queue_url",
        "quota_vcpus",
    }
    extra = set(raw) - known
    if extra:
        raise SettingsError(f"{where}.{sorted(extra)[0]}", "is not a region setting")
    return RegionSettings(
        region=name,
        image_id=image,
        zones=zones,
        subnets={str(k): str(v) for k, v in subnets.items()},
        security_group_ids=tuple(
            _strings(f"{where}.security_group_ids", raw.get("security_group_ids", []))
        ),
        instance_profile=str(raw.get("instance_profile", "")),
        interruption_queue_url=str(raw.get("interruption_queue_url", "")),
        quota_vcpus=quota,
    )


def _strings(where: str, value: object) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise SettingsError(where, "must be a list of strings")
    return list(value)


def dump_settings(settings: Ec2Settings) -> str:
    """The settings as JSON (which the loader reads back), for a child process."""

    def region(r: RegionSettings) -> dict[str, Any]:
        return {
            "image_id": r.image_id,
            "zones": list(r.zones),
            "subnets": dict(r.subnets),
            "security_group_ids": list(r.security_group_ids),
            "instance_profile": r.instance_profile,
            "interruption_queue_url": r.interruption_queue_url,
            "quota_vcpus": dict(r.quota_vcpus),
        }

    body: dict[str, Any] = {
        name: getattr(settings, name)
        for name in Ec2Settings.__dataclass_fields__
        if name != "accounts"
    }
    body["instance_types"] = list(settings.instance_types)
    body["capacity_types"] = list(settings.capacity_types)
    body["accounts"] = [
        {
            "alias": a.alias,
            "profile": a.profile,
            "regions": {r.region: region(r) for r in a.regions},
        }
        for a in settings.accounts
    ]
    return json.dumps(body, indent=2)


__all__ = [
    "CAPACITY_TYPES",
    "STANDARD_FAMILIES",
    "AccountSettings",
    "Ec2Settings",
    "RegionSettings",
    "SettingsError",
    "dump_settings",
    "load_settings",
    "parse_settings",
]
