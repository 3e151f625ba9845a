"""Service Quotas, the part of the EC2 API moto does not serve for EC2: the
provider reads the vCPU quota where Service Quotas answers, falls back to the
settings where it says it has none, and backs off where it throttles. The
Service Quotas client is stubbed with botocore's Stubber (AWS's answers, as
documented); everything else is real."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from providers.ec2.cloud import QUOTA_CODES, RegionApi, Throttled
from providers.ec2.settings import AccountSettings, Ec2Settings, RegionSettings


def region_api() -> RegionApi:
    region = RegionSettings(region="us-east-1", image_id="ami-00000000")
    settings = Ec2Settings(
        accounts=(AccountSettings(alias="prod", regions=(region,)),),
        instance_types=("m6i.large",),
        endpoint_url="http://127.0.0.1:9",  # never reached: the client is stubbed
    )
    return RegionApi(settings, settings.accounts[0], region)


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_the_vcpu_quota_is_read_from_service_quotas(capacity: str) -> None:
    api = region_api()
    with Stubber(api.quotas) as stub:
        stub.add_response(
            "get_service_quota",
            {"Quota": {"QuotaCode": QUOTA_CODES[capacity], "Value": 1152.0}},
            {"ServiceCode": "ec2", "QuotaCode": QUOTA_CODES[capacity]},
        )
        assert api.vcpu_quota(capacity) == 1152
        stub.assert_no_pending_responses()


def test_no_quota_from_service_quotas_means_the_settings_decide() -> None:
    api = region_api()
    with Stubber(api.quotas) as stub:
        stub.add_client_error("get_service_quota", "NoSuchResourceException", "not here")
        assert api.vcpu_quota("spot") is None


def test_a_throttled_quota_read_is_retried_later_not_taken_for_no_quota() -> None:
    api = region_api()
    with Stubber(api.quotas) as stub:
        stub.add_client_error("get_service_quota", "TooManyRequestsException", "slow down")
        with pytest.raises(Throttled):
            api.vcpu_quota("on-demand")
