"""docker-compose.yml describes every service the README names, coherently.

What can be checked without a Docker engine: names, dependencies and their
conditions, healthchecks, advertised addresses, published ports, image
versions, certificates. That each BigFleet service's command actually starts
and becomes healthy is shown by tests/e2e/test_compose_services.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SHARDS = ("shard-0", "shard-1")
PROVIDERS = ("provider-simcloud", "provider-baremetal")
# Host ports `make dev` and a host PostgreSQL use: compose must not take them.
DEFAULT_PORTS = {5432, 7233, 7443, 7444, 8080, 8233, 9464, 9465}


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("### Multi-host deployment", 1)[1].split("\n## ", 1)[0]


def _readme_services() -> set[str]:
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", _readme_section(), flags=re.M))


def _conditions(svc: dict[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in deps.items()}


def _listen_port(svc: dict[str, Any]) -> int:
    """The container port a BigFleet gRPC server listens on (0.0.0.0:PORT)."""
    text = " ".join(svc.get("command", [])) + " " + " ".join(svc["environment"].values())
    ports = set(re.findall(r"0\.0\.0\.0:(\d+)", text)) - {"9464", "9465"}
    assert len(ports) == 1, ports
    return int(ports.pop())


def test_every_service_the_readme_names_is_in_the_compose_file_and_back() -> None:
    named = _readme_services()
    assert named, "the README's deployment table lists no services"
    assert named == set(_compose()["services"])


def test_every_service_has_an_image_or_build_and_valid_dependencies() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name} has neither image nor build"
        for dep, condition in _conditions(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits on {dep}: no healthcheck"
            if condition == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is not a one-shot"


def test_bigfleet_processes_get_database_temporal_and_providers() -> None:
    services = _compose()["services"]
    for name in (*SHARDS, "coordinator"):
        env = services[name]["environment"]
        assert env["BIGFLEET_DATABASE_URL"].startswith("postgresql://")
        assert env["BIGFLEET_TEMPORAL_ADDRESS"] == "temporal:7233"
        for entry in env["BIGFLEET_PROVIDERS"].split(","):
            host = entry.split("=", 1)[1].split(":", 1)[0]
            assert host in services, f"{name} names provider host {host} that is not a service"
    for name in SHARDS:
        assert services[name]["environment"]["BIGFLEET_SHARD_ID"] == name


def test_each_shard_advertises_its_service_name_not_its_wildcard_listener() -> None:
    services = _compose()["services"]
    advertised = set()
    for name in SHARDS:
        env = services[name]["environment"]
        assert env["BIGFLEET_SHARD_LISTEN"].startswith("0.0.0.0:")
        port = env["BIGFLEET_SHARD_LISTEN"].rsplit(":", 1)[1]
        assert env["BIGFLEET_SHARD_ADVERTISE"] == f"{name}:{port}"
        advertised.add(env["BIGFLEET_SHARD_ADVERTISE"])
    assert len(advertised) == len(SHARDS)


def test_shards_and_providers_are_healthy_when_grpc_health_says_so() -> None:
    services = _compose()["services"]
    for name in (*SHARDS, *PROVIDERS):
        svc = services[name]
        test = svc["healthcheck"]["test"]
        # Probed with the container's own certificate (its BIGFLEET_TLS_*), no shell needed.
        assert test == ["CMD", "bigfleet", "health", f"127.0.0.1:{_listen_port(svc)}"], test
        assert "BIGFLEET_TLS_CERT" in svc["environment"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_bigfleet_starts_after_its_dependencies_are_ready() -> None:
    services = _compose()["services"]
    for name in (*SHARDS, "coordinator"):
        needs = _conditions(services[name])
        assert needs["migrate"] == "service_completed_successfully"
        assert needs["certs"] == "service_completed_successfully"
        # Temporal is ready once the namespace gate has seen it healthy.
        assert needs["temporal-namespace"] == "service_completed_successfully"
        for provider in PROVIDERS:
            assert needs[provider] == "service_healthy", (name, provider)
    assert _conditions(services["migrate"])["postgres"] == "service_healthy"
    assert _conditions(services["temporal-schema"])["postgres"] == "service_healthy"
    assert _conditions(services["temporal"])["temporal-schema"] == (
        "service_completed_successfully"
    )
    gate = services["temporal-namespace"]
    assert gate["command"] == ["/bigfleet/namespace.sh"]
    assert "temporal operator cluster health" in (ROOT / "deploy/temporal/namespace.sh").read_text()


def test_the_temporal_scripts_exist_and_parse() -> None:
    services = _compose()["services"]
    for name in ("temporal-schema", "temporal-namespace"):
        svc = services[name]
        (mount,) = svc["volumes"]
        source, target = mount.split(":")[:2]
        script = ROOT / source / Path(svc["command"][0]).relative_to(target)
        assert script.exists(), script
        subprocess.run(["sh", "-n", str(script)], check=True)


def test_no_published_port_collides_with_a_host_postgres_or_make_dev() -> None:
    services = _compose()["services"]
    documented = _readme_section()
    seen: set[int] = set()
    for name, svc in services.items():
        for mapping in svc.get("ports", []):
            parts = str(mapping).split(":")
            assert len(parts) == 3 and parts[0] == "127.0.0.1", f"{name}: {mapping} not loopback"
            host = int(parts[1])
            assert host not in DEFAULT_PORTS, f"{name} publishes {host}"
            assert host not in seen, f"{name} publishes {host} twice"
            seen.add(host)
            assert f"127.0.0.1:{host}" in documented, f"the README does not say {name} is on {host}"
    assert "ports" not in services["postgres"]


def _temporal_versions() -> tuple[str, str]:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "temporal"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"Server (\d+\.\d+\.\d+), UI (\d+\.\d+\.\d+)", out)
    assert found, out
    return found.group(1), found.group(2)


def test_temporal_server_and_ui_match_the_dev_server_of_make_dev() -> None:
    server, ui = _temporal_versions()
    services = _compose()["services"]
    assert services["temporal"]["image"] == f"temporalio/server:{server}"
    assert services["temporal-ui"]["image"] == f"temporalio/ui:{ui}"
    for name in ("temporal-schema", "temporal-namespace"):
        assert services[name]["image"] == f"temporalio/admin-tools:{server}"


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
    for name in (*SHARDS, "coordinator", *PROVIDERS):
        svc = services[name]
        env = svc["environment"]
        stem = Path(env["BIGFLEET_TLS_CERT"]).stem
        assert stem in issued, f"{name} presents {stem}, which the certs job does not issue"
        assert env["BIGFLEET_TLS_KEY"] == f"/certs/{stem}.key"
        assert env["BIGFLEET_TLS_CA"] == "/certs/ca.pem"
        assert "certs:/certs:ro" in svc["volumes"]
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    # Servers answer to the names their clients dial, and to the advertised names.
    for entry in services["shard-0"]["environment"]["BIGFLEET_PROVIDERS"].split(","):
        assert entry.split("=", 1)[1].split(":", 1)[0] in hosts
    for name in SHARDS:
        assert services[name]["environment"]["BIGFLEET_SHARD_ADVERTISE"].split(":")[0] in hosts
