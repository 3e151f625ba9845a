"""Command groups other packages define (``provider``, ``simulate``, ``nanook``), mounted here.

Those packages may not import the application, so the application hands
them what they need from it: the process's mutual TLS, read from
BIGFLEET_TLS_* (the provider server's credentials, the Nanook adapter's
Session channels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from bigfleet.cli import runtime

if TYPE_CHECKING:
    from providers.server import ServerSecurity

__all__ = ["mount_nanook", "mount_provider", "mount_simulate"]


def mount_provider(app: typer.Typer) -> None:
    """``bigfleet provider serve``: a simulated capacity provider."""
    from providers.cli import app as provider_app
    from providers.cli import install_security

    install_security(_provider_security)
    app.add_typer(provider_app, name="provider", help="Run a simulated capacity provider.")


def _provider_security() -> ServerSecurity | None:
    """Mutual TLS for ``bigfleet provider serve`` when BIGFLEET_TLS_* is set."""
    from bigfleet.identity import KeyPairSource, provider_security

    files = runtime.settings().tls
    return provider_security(KeyPairSource(files)) if files is not None else None


def mount_simulate(app: typer.Typer) -> None:
    """``bigfleet simulate``: a trace replayed through the engine in virtual time."""
    from simulator.cli import simulate_command

    app.command(name="simulate")(simulate_command)


def mount_nanook(app: typer.Typer) -> None:
    """``bigfleet nanook ...``: a Polars Nanook worker pool served through BigFleet."""
    from nanook.cli import app as nanook_app
    from nanook.cli import install_channel_factory

    install_channel_factory(_nanook_channels)
    app.add_typer(nanook_app, name="nanook", help="Serve a Polars Nanook worker pool.")


def _nanook_channels() -> Callable[[str], Any]:
    """Session channels for ``bigfleet nanook serve``: mutual TLS when BIGFLEET_TLS_* is set
    (the certificate must be the pool's ``bigfleet://cluster/<id>``)."""
    from bigfleet.identity import channel, client_security

    security = client_security(runtime.settings().tls)

    def open_channel(address: str) -> Any:
        return channel(address, security)

    return open_channel
