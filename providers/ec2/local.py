"""A local EC2 for development and tests: moto's API server on loopback,
seeded so the EC2 provider can run against it with no AWS account.

moto (a dev/test dependency, not a runtime one) serves EC2, SSM, SQS and
Service Quotas over real HTTP. What it does not do, and what that means:

* Service Quotas knows no EC2 quotas (it answers ``NoSuchResourceException``),
  so the provider falls back to the settings' ``quota_vcpus`` and logs so.
* Instances are ``running`` as soon as they are described, SSM commands
  succeed at once, spot prices are a constant, and nothing reclaims spot
  instances: a test plays EC2's part by terminating the instance
  (`LocalEc2.reclaim`) and by sending the notice to the queue
  (`LocalEc2.send_notice`).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, replace
from typing import Any

import boto3

from bigfleet.extras import MissingExtra
from providers.ec2.notices import event_body
from providers.ec2.settings import AccountSettings, Ec2Settings, RegionSettings

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"
#: The instance types the local settings offer (moto knows their shapes).
LOCAL_TYPES = ("m5.large", "m5.xlarge", "c5.xlarge")


@dataclass
class LocalEc2:
    """A running moto server and settings that point the provider at it."""

    server: Any
    endpoint_url: str
    queue_url: str
    settings: Ec2Settings

    def client(self, service: str) -> Any:
        """A boto3 client of the local server."""
        return boto3.client(
            service,
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )

    def send_notice(self, instance_id: str, detail_type: str) -> None:
        """Put an EventBridge interruption event on the queue, as EC2 would."""
        self.client("sqs").send_message(
            QueueUrl=self.queue_url,
            MessageBody=event_body(instance_id, detail_type, region=REGION, account=ACCOUNT_ID),
        )

    def reclaim(self, instance_id: str) -> None:
        """End an instance the way EC2 ends a reclaimed spot instance."""
        self.client("ec2").terminate_instances(InstanceIds=[instance_id])

    def stop(self) -> None:
        """Stop the server (its state goes with it)."""
        self.server.stop()


def start_local_ec2(*, quota_vcpus: int = 400, queue: bool = True, **changes: Any) -> LocalEc2:
    """Start moto on a free loopback port, create an interruption queue and
    return settings for one account and region there; ``changes`` replace
    top-level settings (``poll_s``, ``watch_s``, ...)."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise MissingExtra(
            "a local EC2 (bigfleet dev --ec2)", package="moto", extra="dev"
        ) from None

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    local = LocalEc2(server, endpoint, "", _settings(endpoint, "", quota_vcpus))
    image = local.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    queue_url = ""
    if queue:
        queue_url = local.client("sqs").create_queue(QueueName="bigfleet-interruptions")["QueueUrl"]
    local.queue_url = queue_url
    local.settings = replace(_settings(endpoint, queue_url, quota_vcpus, image), **changes)
    return local


def _settings(
    endpoint: str, queue_url: str, quota_vcpus: int, image: str = "ami-00000000"
) -> Ec2Settings:
    return Ec2Settings(
        accounts=(
            AccountSettings(
                alias="local",
                regions=(
                    RegionSettings(
                        region=REGION,
                        image_id=image,
                        zones=(f"{REGION}a", f"{REGION}b"),
                        interruption_queue_url=queue_url,
                        quota_vcpus={"on-demand": quota_vcpus, "spot": quota_vcpus},
                    ),
                ),
            ),
        ),
        instance_types=LOCAL_TYPES,
        endpoint_url=endpoint,
        poll_s=0.5,
        watch_s=2.0,
        queue_wait_s=1,
        refresh_s=60.0,
    )


__all__ = ["ACCOUNT_ID", "LOCAL_TYPES", "REGION", "LocalEc2", "start_local_ec2"]
