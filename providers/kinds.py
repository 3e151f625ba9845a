"""The provider kinds, by the name used on the command line and in config."""

from __future__ import annotations

from collections.abc import Callable

from providers.bare_metal import BareMetalProvider
from providers.clock import Scheduler
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.sim_cloud import SimCloudProvider


def _ec2() -> type[ProviderCore]:
    # Imported on use: boto3 would otherwise load with every command line.
    from providers.ec2.provider import Ec2Provider

    return Ec2Provider


PROVIDER_KINDS: dict[str, Callable[[], type[ProviderCore]]] = {
    "sim-cloud": lambda: SimCloudProvider,
    "bare-metal": lambda: BareMetalProvider,
    "ec2": _ec2,
}
"""Each kind's provider class, loaded when it is built."""


def build_provider(config: ProviderConfig, *, scheduler: Scheduler | None = None) -> ProviderCore:
    """The provider ``config.kind`` names, loaded from ``config.state_path``
    when that holds earlier state. Not started: call ``start()`` on its loop."""
    return PROVIDER_KINDS[config.kind]()(config, scheduler=scheduler)


__all__ = ["PROVIDER_KINDS", "build_provider"]
