"""The AWS side of the EC2 provider: one `RegionApi` per (account, region),
a thin, blocking adapter over boto3 that speaks in plain values.

The provider calls these from worker threads (boto3 blocks) and never holds
its own state here. Errors come back as two named kinds the provider acts on:

* `Throttled` - ``RequestLimitExceeded`` and the other throttling codes: the
  call may succeed later; the provider backs off and retries it.
* `CloudRefused` - anything else EC2 answered (``InsufficientInstanceCapacity``,
  ``VcpuLimitExceeded``, ``InvalidInstanceID.NotFound``, ...), with its code.

Blobs never reach a log from here: botocore logs request bodies at DEBUG, so
`quiet_sdk_loggers` pins its loggers at WARNING whatever the process's level.
"""

from __future__ import annotations

import base64
import gzip
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from providers.ec2.settings import AccountSettings, Ec2Settings, RegionSettings

log = logging.getLogger(__name__)

#: Service Quotas codes of the vCPU-based EC2 limits for standard families
#: (A, C, D, H, I, M, R, T, Z): on-demand and spot.
QUOTA_CODES = {"on-demand": "L-1216C47A", "spot": "L-34B43A08"}

THROTTLING_CODES = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"}
)

#: Tag keys that tie an instance to its machine (never a blob, never metadata).
TAG_PROVIDER = "bigfleet.io/provider"
TAG_MACHINE = "bigfleet.io/machine"
#: The provider state's lineage: instances of another state under the same
#: provider name (a test, a rebuilt provider) are never taken for orphans.
TAG_LINEAGE = "bigfleet.io/lineage"


class CloudError(Exception):
    """Base of what a `RegionApi` call raises."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Throttled(CloudError):
    """EC2 (or SSM, SQS) asked us to slow down; retry after a back-off."""


class CloudRefused(CloudError):
    """EC2 refused the call for a reason other than throttling."""


def quiet_sdk_loggers() -> None:
    """Keep boto3/botocore below DEBUG: their DEBUG lines carry request
    bodies, and a SendCommand body carries a bootstrap blob."""
    for name in ("boto3", "botocore", "urllib3", "s3transfer"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _translate(err: botocore.exceptions.ClientError) -> CloudError:
    error = err.response.get("Error", {})
    code = str(error.get("Code", "Unknown"))
    message = str(error.get("Message", ""))
    if code in THROTTLING_CODES:
        return Throttled(code, message)
    return CloudRefused(code, message)


@dataclass(frozen=True, slots=True)
class InstanceTypeInfo:
    """What DescribeInstanceTypes says about one type."""

    name: str
    vcpu: int
    memory_mib: int
    gpus: int
    gpu_product: str
    gpu_memory_mib: int
    arch: str


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance as DescribeInstances reports it."""

    instance_id: str
    state: str
    machine_id: str
    private_dns: str
    state_reason: str


@dataclass(frozen=True, slots=True)
class Notice:
    """One SQS message: its receipt handle and parsed body."""

    receipt: str
    body: str


class RegionApi:
    """EC2, SSM, SQS and Service Quotas clients of one (account, region)."""

    def __init__(self, settings: Ec2Settings, account: AccountSettings, region: RegionSettings):
        self.account = account
        self.region = region
        self._settings = settings
        session = _session(settings, account, region.region)
        config = botocore.config.Config(
            # The provider backs off itself (and counts it); the SDK's own
            # retries would hide throttling from it.
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=max(30, settings.queue_wait_s + 10),
        )
        endpoint = settings.endpoint_url or None

        def client(service: str) -> Any:
            return session.client(service, endpoint_url=endpoint, config=config)

        #: The boto3 clients (public so a test can stub a service moto lacks).
        self.ec2 = client("ec2")
        self.ssm = client("ssm")
        self.sqs = client("sqs")
        self.quotas = client("service-quotas")

    # ------------------------------------------------------------------ catalog

    def vcpu_quota(self, capacity: str) -> int | None:
        """The region's vCPU limit for ``capacity`` from Service Quotas, or
        None when Service Quotas does not answer for EC2 (then the settings'
        ``quota_vcpus`` are used, and the provider says so in its log)."""
        try:
            answer = self.quotas.get_service_quota(
                ServiceCode="ec2", QuotaCode=QUOTA_CODES[capacity]
            )
        except botocore.exceptions.ClientError as err:
            translated = _translate(err)
            if isinstance(translated, Throttled):
                raise translated from None
            log.debug("Service Quotas has no %s quota: %s", capacity, translated)
            return None
        return int(float(answer["Quota"]["Value"]))

    def offerings(self, instance_types: Iterable[str]) -> dict[str, set[str]]:
        """Zone -> instance types offered there (DescribeInstanceTypeOfferings)."""
        out: dict[str, set[str]] = {}
        for page in self._pages(
            self.ec2.get_paginator("describe_instance_type_offerings"),
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": list(instance_types)}],
        ):
            for offer in page["InstanceTypeOfferings"]:
                out.setdefault(offer["Location"], set()).add(offer["InstanceType"])
        return out

    def instance_types(self, names: Iterable[str]) -> dict[str, InstanceTypeInfo]:
        """Shape of each named type (DescribeInstanceTypes)."""
        out: dict[str, InstanceTypeInfo] = {}
        for page in self._pages(
            self.ec2.get_paginator("describe_instance_types"), InstanceTypes=list(names)
        ):
            for raw in page["InstanceTypes"]:
                gpus = raw.get("GpuInfo", {}).get("Gpus", [])
                archs = raw.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
                out[raw["InstanceType"]] = InstanceTypeInfo(
                    name=raw["InstanceType"],
                    vcpu=int(raw["VCpuInfo"]["DefaultVCpus"]),
                    memory_mib=int(raw["MemoryInfo"]["SizeInMiB"]),
                    gpus=sum(int(g.get("Count", 0)) for g in gpus),
                    gpu_product=str(gpus[0].get("Name", "")) if gpus else "",
                    gpu_memory_mib=int(gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0))
                    if gpus
                    else 0,
                    arch="arm64" if "arm64" in archs else "amd64",
                )
        return out

    def spot_prices(self, instance_types: Iterable[str]) -> dict[tuple[str, str], float]:
        """The newest Linux spot price per (zone, instance type)."""
        newest: dict[tuple[str, str], tuple[Any, float]] = {}
        for page in self._pages(
            self.ec2.get_paginator("describe_spot_price_history"),
            InstanceTypes=list(instance_types),
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
        ):
            for row in page["SpotPriceHistory"]:
                key = (row["AvailabilityZone"], row["InstanceType"])
                stamp = row["Timestamp"]
                if key not in newest or stamp > newest[key][0]:
                    newest[key] = (stamp, float(row["SpotPrice"]))
        return {key: price for key, (_, price) in newest.items()}

    # ------------------------------------------------------------------ instances

    def run_instance(
        self,
        *,
        machine_id: str,
        provider_name: str,
        lineage: str,
        instance_type: str,
        zone: str,
        spot: bool,
        client_token: str,
    ) -> str:
        """RunInstances for one machine; the instance id. ``client_token``
        makes a retry of the same launch return the same instance."""
        request: dict[str, Any] = {
            "ImageId": self.region.image_id,
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token,
            "Placement": {"AvailabilityZone": zone},
            "BlockDeviceMappings": [
                {
                    "DeviceName": "/dev/xvda",
                    "Ebs": {
                        "VolumeSize": self._settings.root_volume_gib,
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "MetadataOptions": {"HttpTokens": "required"},
            "TagSpecifications": [
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": TAG_PROVIDER, "Value": provider_name},
                        {"Key": TAG_MACHINE, "Value": machine_id},
                        {"Key": TAG_LINEAGE, "Value": lineage},
                        {"Key": "Name", "Value": machine_id},
                    ],
                }
            ],
        }
        subnet = self.region.subnets.get(zone)
        if subnet:
            request["SubnetId"] = subnet
        if self.region.security_group_ids:
            request["SecurityGroupIds"] = list(self.region.security_group_ids)
        if self.region.instance_profile:
            key = "Arn" if self.region.instance_profile.startswith("arn:") else "Name"
            request["IamInstanceProfile"] = {key: self.region.instance_profile}
        if spot:
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        answer = self._call(self.ec2.run_instances, **request)
        return str(answer["Instances"][0]["InstanceId"])

    def terminate(self, instance_id: str) -> None:
        """TerminateInstances (an instance already gone counts as terminated)."""
        try:
            self._call(self.ec2.terminate_instances, InstanceIds=[instance_id])
        except CloudRefused as err:
            if err.code != "InvalidInstanceID.NotFound":
                raise

    def describe(self, instance_ids: Iterable[str]) -> dict[str, InstanceView]:
        """The named instances (absent ones are simply missing from the answer)."""
        ids = sorted(set(instance_ids))
        out: dict[str, InstanceView] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            try:
                pages = self._pages(self.ec2.get_paginator("describe_instances"), InstanceIds=chunk)
                for page in pages:
                    out.update(_views(page))
            except CloudRefused as err:
                if err.code != "InvalidInstanceID.NotFound":
                    raise
                # One id of the chunk is unknown: ask for each on its own.
                for instance_id in chunk:
                    try:
                        out.update(
                            _views(
                                self._call(self.ec2.describe_instances, InstanceIds=[instance_id])
                            )
                        )
                    except CloudRefused as single:
                        if single.code != "InvalidInstanceID.NotFound":
                            raise
        return out

    def tagged(self, provider_name: str, lineage: str) -> dict[str, InstanceView]:
        """Every live instance this provider's state launched (by its tags)."""
        out: dict[str, InstanceView] = {}
        for page in self._pages(
            self.ec2.get_paginator("describe_instances"),
            Filters=[
                {"Name": f"tag:{TAG_PROVIDER}", "Values": [provider_name]},
                {"Name": f"tag:{TAG_LINEAGE}", "Values": [lineage]},
                {
                    "Name": "instance-state-name",
                    "Values": ["pending", "running", "stopping", "stopped"],
                },
            ],
        ):
            out.update(_views(page))
        return out

    # ------------------------------------------------------------------ bootstrap

    def send_bootstrap(self, instance_id: str, blob: bytes, *, comment: str) -> str:
        """SSM SendCommand running the bootstrap command on the blob; the
        command id. The blob travels gzip-compressed and base64-encoded inside
        the command's parameters (which CloudTrail does not record) and lands
        in a root-only file; it is not in the comment, a tag or any log."""
        encoded = base64.b64encode(gzip.compress(blob, mtime=0)).decode()
        path = "/run/bigfleet/bootstrap"
        commands = [
            "set -eu",
            "umask 077",
            "mkdir -p /run/bigfleet",
            f"echo '{encoded}' | base64 -d | gunzip > {path}",
            f"{self._settings.bootstrap_command} {path}",
        ]
        answer = self._call(
            self.ssm.send_command,
            InstanceIds=[instance_id],
            DocumentName="AWS-RunShellScript",
            Comment=comment[:100],
            Parameters={"commands": commands},
        )
        return str(answer["Command"]["CommandId"])

    def command_status(self, command_id: str, instance_id: str) -> tuple[str, str]:
        """(status, details) of a bootstrap command on its instance; status
        ``Pending`` while SSM has not registered the invocation yet."""
        try:
            answer = self._call(
                self.ssm.get_command_invocation, CommandId=command_id, InstanceId=instance_id
            )
        except CloudRefused as err:
            if err.code == "InvocationDoesNotExist":
                return "Pending", ""
            raise
        return str(answer["Status"]), str(answer.get("StatusDetails", ""))

    # ------------------------------------------------------------------ notices

    def receive_notices(self, wait_s: int) -> list[Notice]:
        """Up to ten interruption notices from the region's SQS queue."""
        if not self.region.interruption_queue_url:
            return []
        answer = self._call(
            self.sqs.receive_message,
            QueueUrl=self.region.interruption_queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_s,
        )
        return [Notice(m["ReceiptHandle"], m["Body"]) for m in answer.get("Messages", [])]

    def delete_notice(self, receipt: str) -> None:
        """Remove a handled notice from the queue."""
        self._call(
            self.sqs.delete_message,
            QueueUrl=self.region.interruption_queue_url,
            ReceiptHandle=receipt,
        )

    def release_notices(self, receipts: Sequence[str]) -> None:
        """Make received but unhandled notices visible to other consumers now."""
        for receipt in receipts:
            self._call(
                self.sqs.change_message_visibility,
                QueueUrl=self.region.interruption_queue_url,
                ReceiptHandle=receipt,
                VisibilityTimeout=0,
            )

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def _call(method: Any, **kwargs: Any) -> Mapping[str, Any]:
        try:
            answer: Mapping[str, Any] = method(**kwargs)
        except botocore.exceptions.ClientError as err:
            raise _translate(err) from None
        except botocore.exceptions.BotoCoreError as err:
            # Connection trouble: as good as a throttle (retry after a back-off).
            raise Throttled(type(err).__name__, str(err)) from None
        return answer

    @staticmethod
    def _pages(paginator: Any, **kwargs: Any) -> list[Mapping[str, Any]]:
        try:
            return list(paginator.paginate(**kwargs))
        except botocore.exceptions.ClientError as err:
            raise _translate(err) from None
        except botocore.exceptions.BotoCoreError as err:
            raise Throttled(type(err).__name__, str(err)) from None


def _views(page: Mapping[str, Any]) -> dict[str, InstanceView]:
    out: dict[str, InstanceView] = {}
    for reservation in page.get("Reservations", []):
        for raw in reservation.get("Instances", []):
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            out[raw["InstanceId"]] = InstanceView(
                instance_id=raw["InstanceId"],
                state=str(raw["State"]["Name"]),
                machine_id=tags.get(TAG_MACHINE, ""),
                private_dns=str(raw.get("PrivateDnsName", "")),
                state_reason=str(raw.get("StateReason", {}).get("Message", "")),
            )
    return out


def _session(settings: Ec2Settings, account: AccountSettings, region: str) -> Any:
    """The boto3 session of an account: its profile, or the default chain. A
    local endpoint without any credentials in reach gets placeholder ones:
    such servers accept any."""
    session = boto3.Session(profile_name=account.profile or None, region_name=region)
    if settings.endpoint_url and session.get_credentials() is None:
        session = boto3.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name=region
        )
    return session


__all__ = [
    "QUOTA_CODES",
    "TAG_LINEAGE",
    "TAG_MACHINE",
    "TAG_PROVIDER",
    "CloudError",
    "CloudRefused",
    "InstanceTypeInfo",
    "InstanceView",
    "Notice",
    "RegionApi",
    "Throttled",
    "quiet_sdk_loggers",
]
