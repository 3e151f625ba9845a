"""The provider kinds, by the name used on the command line and in config."""

from __future__ import annotations

from providers.bare_metal import BareMetalProvider
from providers.clock import Scheduler
from providers.config import ProviderConfig
from providers.core import ProviderCore
from providers.ec2.provider import Ec2Provider
from providers.sim_cloud import SimCloudProvider

PROVIDER_KINDS: dict[str, type[ProviderCore]] = {
    "sim-cloud": SimCloudProvider,
    "bare-metal": BareMetalProvider,
    "ec2": Ec2Provider,
}


def build_provider(config: ProviderConfig, *, scheduler: Scheduler | None = None) -> ProviderCore:
    """The provider ``config.kind`` names, loaded from ``config.state_path``
    when that holds earlier state. Not started: call ``start()`` on its loop."""
    return PROVIDER_KINDS[config.kind](config, scheduler=scheduler)


__all__ = ["PROVIDER_KINDS", "build_provider"]
