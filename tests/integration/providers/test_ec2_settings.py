"""The EC2 provider's settings file and command line: every bad setting is
refused naming its field, and ``serve --help`` documents every setting."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from providers.cli import app
from providers.ec2.local import start_local_ec2
from providers.ec2.notices import REBALANCE, SPOT_WARNING, event_body, parse_notice
from providers.ec2.settings import (
    Ec2Settings,
    SettingsError,
    dump_settings,
    load_settings,
    parse_settings,
)


def valid() -> dict[str, Any]:
    return {
        "accounts": [
            {
                "alias": "prod",
                "profile": "fleet",
                "regions": {
                    "us-east-1": {
                        "image_id": "ami-0123456789abcdef0",
                        "zones": ["us-east-1a"],
                        "subnets": {"us-east-1a": "subnet-1"},
                        "quota_vcpus": {"spot": 64},
                    }
                },
            }
        ],
        "instance_types": ["m6i.large"],
        "capacity_types": ["spot"],
    }


def test_a_valid_file_round_trips(tmp_path: Path) -> None:
    settings = parse_settings(valid(), poll_s=1.5)
    assert settings.poll_s == 1.5
    assert settings.accounts[0].regions[0].subnets == {"us-east-1a": "subnet-1"}
    path = tmp_path / "ec2.json"
    path.write_text(dump_settings(settings), encoding="utf-8")
    assert load_settings(path) == settings


def broken(path: str, value: Any) -> dict[str, Any]:
    """``valid()`` with the value at a dotted path replaced (None deletes it)."""
    raw = valid()
    node: Any = raw
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is None:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("accounts", [], "accounts"),
        ("accounts.0.alias", "Prod_1", "accounts[0].alias"),
        ("accounts.0.regions", {}, "accounts[0].regions"),
        (
            "accounts.0.regions.us-east-1.image_id",
            "img-1",
            "accounts[0].regions.us-east-1.image_id",
        ),
        (
            "accounts.0.regions.us-east-1.zones",
            ["eu-west-1a"],
            "accounts[0].regions.us-east-1.zones[0]",
        ),
        (
            "accounts.0.regions.us-east-1.quota_vcpus",
            {"spot": -1},
            "accounts[0].regions.us-east-1.quota_vcpus.spot",
        ),
        (
            "accounts.0.regions.us-east-1.quota_vcpus",
            {"reserved": 4},
            "accounts[0].regions.us-east-1.quota_vcpus.reserved",
        ),
        ("accounts.0.regions.us-east-1.colour", "blue", "accounts[0].regions.us-east-1.colour"),
        ("accounts.0.role", "x", "accounts[0].role"),
        ("instance_types", ["large"], "instance_types[0]"),
        ("instance_types", ["m6i.large", "p4d.24xlarge"], "instance_types[1]"),
        ("capacity_types", ["reserved"], "capacity_types[0]"),
        ("poll_s", 0, "poll_s"),
        ("queue_wait_s", 25, "queue_wait_s"),
        ("spot_interruption_per_hour", 0, "spot_interruption_per_hour"),
        ("launch_burst", 0, "launch_burst"),
        ("regions", {}, "regions"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_settings(broken(path, value))
    assert caught.value.field_path == field
    assert str(caught.value).startswith(f"{field}: ")


def test_account_aliases_must_be_unique() -> None:
    raw = valid()
    raw["accounts"].append(raw["accounts"][0])
    with pytest.raises(SettingsError, match="aliases must be unique"):
        parse_settings(raw)


def test_serve_documents_every_ec2_setting() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = re.sub(r"\s+", " ", result.output)
    options = {
        "endpoint_url": "--endpoint-url",
        "refresh_s": "--refresh-seconds",
        "poll_s": "--poll-seconds",
        "watch_s": "--watch-seconds",
        "queue_wait_s": "--queue-wait-seconds",
        "launches_per_second": "--launches-per-second",
        "launch_burst": "--launch-burst",
        "capacity_cooldown_s": "--capacity-cooldown-seconds",
        "spot_interruption_per_hour": "--spot-interruption-per-hour",
        "prices_path": "--prices",
        "root_volume_gib": "--root-volume-gib",
        "bootstrap_command": "--bootstrap-command",
    }
    top_level = set(Ec2Settings.__dataclass_fields__) - {
        "accounts",
        "instance_types",
        "capacity_types",
    }
    assert top_level == set(options)
    for option in options.values():
        assert option in text, option
    # The file's own settings are named in the --ec2-config help.
    for name in ("accounts", "image_id", "subnets", "interruption_queue_url", "quota_vcpus"):
        assert name in text, name
    assert "ec2" in text and "--ec2-config" in text


def test_serve_ec2_without_settings_names_the_option() -> None:
    result = CliRunner().invoke(app, ["serve", "--kind", "ec2"], env={"BIGFLEET_EC2_CONFIG": ""})
    assert result.exit_code != 0
    assert "--ec2-config" in result.output


def test_serve_ec2_with_a_bad_file_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "ec2.yaml"
    path.write_text("accounts: []\ninstance_types: [m6i.large]\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--kind", "ec2", "--ec2-config", str(path)])
    assert result.exit_code != 0
    assert "accounts: at least one account is needed" in result.output


@pytest.mark.parametrize(("detail_type", "probability"), [(SPOT_WARNING, 0.99), (REBALANCE, 0.5)])
def test_eventbridge_notices_parse_to_their_probability(
    detail_type: str, probability: float
) -> None:
    body = event_body("i-0abc", detail_type, region="us-east-1", account="123456789012")
    notice = parse_notice(body)
    assert notice is not None
    assert notice.instance_id == "i-0abc"
    assert notice.probability == probability


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[]",
        '{"detail-type": "EC2 Instance State-change Notification", '
        '"detail": {"instance-id": "i-1"}}',
        '{"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {}}',
        '{"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {"instance-id": 7}}',
    ],
)
def test_anything_else_on_the_queue_is_not_a_notice(body: str) -> None:
    assert parse_notice(body) is None


def test_serve_ec2_names_an_instance_type_without_a_price(tmp_path: Path) -> None:
    local = start_local_ec2(queue=False)
    try:
        raw = {
            "endpoint_url": local.endpoint_url,
            "accounts": [
                {
                    "alias": "local",
                    "regions": {
                        "us-east-1": {
                            "image_id": "ami-00000000",
                            "quota_vcpus": {"on-demand": 8, "spot": 8},
                        }
                    },
                }
            ],
            "instance_types": ["m5.large", "m5.24xlarge"],
        }
        path = tmp_path / "ec2.json"
        path.write_text(json.dumps(raw), encoding="utf-8")
        result = CliRunner().invoke(
            app,
            ["serve", "--kind", "ec2", "--ec2-config", str(path), "--addr", "127.0.0.1:0"],
            env={"COLUMNS": "300"},
        )
        assert result.exit_code != 0
        text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())
        assert "instance_types[1]: the price file has no on-demand price for m5.24xlarge" in text
    finally:
        local.stop()
