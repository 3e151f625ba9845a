"""docker-compose.yml describes every service the README names, coherently."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _readme_services() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Multi-host deployment", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M))


def test_every_service_the_readme_names_is_in_the_compose_file() -> None:
    named = _readme_services()
    assert named, "the README's deployment table lists no services"
    assert named <= set(_compose()["services"])


def test_every_service_has_an_image_or_build_and_valid_dependencies() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name} has neither image nor build"
        deps = svc.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown service {dep}"


def test_bigfleet_processes_get_database_temporal_and_providers() -> None:
    services = _compose()["services"]
    for name in ("shard-0", "shard-1"):
        env = services[name]["environment"]
        assert env["BIGFLEET_DATABASE_URL"].startswith("postgresql://")
        assert env["BIGFLEET_TEMPORAL_ADDRESS"] == "temporal:7233"
        assert env["BIGFLEET_SHARD_ID"] == name
        for entry in env["BIGFLEET_PROVIDERS"].split(","):
            host = entry.split("=", 1)[1].split(":", 1)[0]
            assert host in services, f"{name} names provider host {host} that is not a service"


def test_the_temporal_ui_is_published_on_the_documented_port() -> None:
    assert "8233:8080" in _compose()["services"]["temporal-ui"]["ports"]


def test_every_bigfleet_process_speaks_mutual_tls_with_a_certificate_the_certs_job_issues() -> None:
    from bigfleet.certs import leaf_stem
    from bigfleet.identity import Identity, Role

    services = _compose()["services"]
    command = services["certs"]["command"]
    issued = {"admin", "readonly"}
    for arg in command:
        for role in (Role.CLUSTER, Role.SHARD, Role.PROVIDER):
            if arg.startswith(f"--{role.value}="):
                issued.add(leaf_stem(Identity(role, arg.split("=", 1)[1])))
    hosts = {arg.split("=", 1)[1] for arg in command if arg.startswith("--host=")}
    for name in ("shard-0", "shard-1", "coordinator", "provider-simcloud", "provider-baremetal"):
        svc = services[name]
        env = svc["environment"]
        stem = Path(env["BIGFLEET_TLS_CERT"]).stem
        assert stem in issued, f"{name} presents {stem}, which the certs job does not issue"
        assert env["BIGFLEET_TLS_KEY"] == f"/certs/{stem}.key"
        assert env["BIGFLEET_TLS_CA"] == "/certs/ca.pem"
        assert "certs:/certs:ro" in svc["volumes"]
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    # Servers answer to the names their clients dial.
    for entry in services["shard-0"]["environment"]["BIGFLEET_PROVIDERS"].split(","):
        assert entry.split("=", 1)[1].split(":", 1)[0] in hosts
    assert {"shard-0", "shard-1"} <= hosts
