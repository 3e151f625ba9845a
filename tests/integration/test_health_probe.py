"""``bigfleet health``: the readiness probe container healthchecks run.

A provider server over mutual TLS is probed with the process's own
certificate (``BIGFLEET_TLS_*``), as a container's healthcheck would; the
probe fails in one line when the server is gone, not serving, or refuses the
caller. The Temporal probe is checked against the dev server from the wheel.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from bigfleet.config import TLSFiles
from bigfleet.health import NotReady, probe_grpc, probe_temporal
from bigfleet.identity import ChannelSecurity, Identity, KeyPairSource, Role, provider_security
from bigfleet.temporal import start_dev_server
from providers.config import ProviderConfig
from providers.server import RunningProvider, start_provider_server
from tests.integration.pki import Pki
from tests.ports import free_port


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
async def provider(pki: Pki) -> AsyncIterator[RunningProvider]:
    security = provider_security(pki.source(Identity(Role.PROVIDER, "simcloud")))
    running = await start_provider_server(
        ProviderConfig(kind="sim-cloud", name="simcloud", time_factor=0.01),
        "127.0.0.1:0",
        security=security,
    )
    try:
        yield running
    finally:
        await running.stop()


async def bigfleet_health(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BIGFLEET_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bigfleet",
        "health",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean, **env},
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _tls_env(files: TLSFiles) -> dict[str, str]:
    return {
        "BIGFLEET_TLS_CERT": str(files.cert),
        "BIGFLEET_TLS_KEY": str(files.key),
        "BIGFLEET_TLS_CA": str(files.ca),
    }


async def test_a_provider_is_serving_to_a_probe_with_its_own_certificate(
    provider: RunningProvider, pki: Pki
) -> None:
    # The provider's container probes itself with the provider's own certificate.
    own = pki.files(Identity(Role.PROVIDER, "simcloud"))
    security = ChannelSecurity(KeyPairSource(own))
    assert await probe_grpc(provider.address, security=security) == "SERVING"
    service = "bigfleet.v1alpha1.CapacityProvider"
    assert await probe_grpc(provider.address, security=security, service=service) == "SERVING"

    code, out, err = await bigfleet_health(_tls_env(own), provider.address)
    assert code == 0, err
    assert out.strip() == f"{provider.address}: SERVING"


async def test_the_probe_fails_in_one_line_when_the_server_stops_serving(
    provider: RunningProvider, pki: Pki
) -> None:
    security = pki.client(Identity(Role.ADMIN))
    await provider.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(NotReady, match="NOT_SERVING"):
        await probe_grpc(provider.address, security=security)
    with pytest.raises(NotReady, match="NOT_FOUND"):
        await probe_grpc(provider.address, security=security, service="no.such.Service")


async def test_the_probe_fails_without_a_certificate_or_without_a_server(
    provider: RunningProvider, pki: Pki, tmp_path: Path
) -> None:
    # Plaintext against a mutual-TLS server: refused, one line, exit 1.
    code, out, err = await bigfleet_health({}, provider.address, "--timeout", "2")
    assert code == 1 and out == "", (out, err)
    assert err.count("\n") == 1 and err.startswith(f"not ready: {provider.address}: "), err

    # A certificate from another CA is refused by the server.
    stranger = Pki(tmp_path, name="another CA").files(Identity(Role.ADMIN))
    code, _, err = await bigfleet_health(_tls_env(stranger), provider.address, "--timeout", "2")
    assert code == 1 and err.startswith("not ready: "), err

    # Nothing listening.
    gone = f"127.0.0.1:{free_port()}"
    with pytest.raises(NotReady, match="UNAVAILABLE"):
        await probe_grpc(gone, security=None, timeout_s=2.0)


async def test_the_temporal_probe_wants_a_frontend_that_knows_the_namespace() -> None:
    env = await start_dev_server(ui=False)
    try:
        address = env.client.service_client.config.target_host
        assert await probe_temporal(address) == "SERVING (namespace default)"
        with pytest.raises(NotReady, match="NOT_FOUND"):
            await probe_temporal(address, namespace="no-such-namespace")
        code, out, err = await bigfleet_health({}, address, "--temporal")
        assert code == 0 and out.strip() == f"{address}: SERVING (namespace default)", err
    finally:
        await env.shutdown()
    with pytest.raises(NotReady, match=address):
        await probe_temporal(address, timeout_s=2.0)
