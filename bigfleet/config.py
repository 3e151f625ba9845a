"""Configuration, read once from the environment (``BIGFLEET_*``) into frozen values.

Every setting has a default that works on a single machine; the dev stack and
tests build :class:`Settings` directly. ``describe()`` documents every variable.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ConfigError", "ProviderEndpoint", "Settings", "parse_providers"]


class ConfigError(ValueError):
    """A configuration value that cannot be used, naming the variable and the reason."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"{name}: {reason}")


@dataclass(frozen=True)
class ProviderEndpoint:
    """A capacity provider BigFleet talks to: a name (used in ids and logs) and an address."""

    name: str
    address: str


def parse_providers(text: str, *, var: str = "BIGFLEET_PROVIDERS") -> tuple[ProviderEndpoint, ...]:
    """Parse ``name=host:port,name2=host:port`` into endpoints."""
    endpoints: list[ProviderEndpoint] = []
    seen: set[str] = set()
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise ConfigError(var, f"entry {item!r} is not NAME=HOST:PORT")
        if ":" not in address:
            raise ConfigError(var, f"provider {name!r}: address {address!r} has no port")
        if name in seen:
            raise ConfigError(var, f"provider {name!r} is listed twice")
        seen.add(name)
        endpoints.append(ProviderEndpoint(name, address))
    return tuple(endpoints)


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"{raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(name, f"{value} is below the minimum {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything a BigFleet process needs to know about its surroundings."""

    # PostgreSQL URL; None means "start an embedded server" (dev stack only).
    database_url: str | None = None
    # Temporal frontend host:port; None means "start a dev server" (dev stack only).
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    shard_id: str = "shard-0"
    # Where the shard serves bigfleet.v1alpha1.Shard.
    shard_listen: str = "127.0.0.1:7443"
    providers: tuple[ProviderEndpoint, ...] = ()
    cycle_interval_s: float = 5.0
    observe_interval_s: float = 2.0
    lease_ttl_s: float = 30.0
    report_interval_s: float = 30.0
    data_dir: Path = field(default_factory=lambda: Path(".bigfleet"))
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            database_url=env.get("BIGFLEET_DATABASE_URL") or None,
            temporal_address=env.get("BIGFLEET_TEMPORAL_ADDRESS") or None,
            temporal_namespace=env.get("BIGFLEET_TEMPORAL_NAMESPACE", "default"),
            shard_id=env.get("BIGFLEET_SHARD_ID", "shard-0"),
            shard_listen=env.get("BIGFLEET_SHARD_LISTEN", "127.0.0.1:7443"),
            providers=parse_providers(env.get("BIGFLEET_PROVIDERS", "")),
            cycle_interval_s=_float(env, "BIGFLEET_CYCLE_SECONDS", 5.0, minimum=0.05),
            observe_interval_s=_float(env, "BIGFLEET_OBSERVE_SECONDS", 2.0, minimum=0.05),
            lease_ttl_s=_float(env, "BIGFLEET_LEASE_TTL_SECONDS", 30.0, minimum=1.0),
            report_interval_s=_float(env, "BIGFLEET_REPORT_SECONDS", 30.0, minimum=0.1),
            data_dir=Path(env.get("BIGFLEET_DATA_DIR", ".bigfleet")),
        )

    @staticmethod
    def describe() -> dict[str, str]:
        """Every environment variable and what it sets."""
        return {
            "BIGFLEET_DATABASE_URL": "PostgreSQL URL; unset in `bigfleet dev` = embedded server",
            "BIGFLEET_TEMPORAL_ADDRESS": "Temporal frontend host:port; unset in dev = dev server",
            "BIGFLEET_TEMPORAL_NAMESPACE": "Temporal namespace (default: default)",
            "BIGFLEET_SHARD_ID": "this shard's id; its task queue is shard-<id>",
            "BIGFLEET_SHARD_LISTEN": "host:port the Shard.Session service listens on",
            "BIGFLEET_PROVIDERS": "NAME=HOST:PORT,... capacity providers to use",
            "BIGFLEET_CYCLE_SECONDS": "decision cycle interval (default 5)",
            "BIGFLEET_OBSERVE_SECONDS": "provider List interval (default 2)",
            "BIGFLEET_LEASE_TTL_SECONDS": "shard lease lifetime; renewed at a third of it",
            "BIGFLEET_REPORT_SECONDS": "how often a shard reports to the coordinator (default 30)",
            "BIGFLEET_DATA_DIR": "local state (embedded Postgres, Temporal dev DB)",
        }
