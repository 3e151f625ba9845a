"""Configuration, read once from the environment (``BIGFLEET_*``) into frozen values.

Every setting has a default that works on a single machine; the dev stack and
tests build :class:`Settings` directly. ``describe()`` documents every variable.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shard_engine.budgets import Budget, BudgetError, parse_budgets
from shard_engine.config import EngineConfig

__all__ = [
    "ConfigError",
    "ProviderEndpoint",
    "Settings",
    "TLSFiles",
    "parse_budgets_file",
    "parse_mode",
    "parse_providers",
    "parse_tls",
]


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


@dataclass(frozen=True)
class TLSFiles:
    """Where a process finds its certificate, its private key and the CA bundle it trusts.

    One process, one identity: the same three files serve every edge of it
    (its servers, and its calls to providers, shards and Temporal). The files
    are re-read when they change (see :mod:`bigfleet.identity`).
    """

    cert: Path
    key: Path
    ca: Path


_TLS_VARS = ("BIGFLEET_TLS_CERT", "BIGFLEET_TLS_KEY", "BIGFLEET_TLS_CA")


def parse_tls(env: Mapping[str, str]) -> TLSFiles | None:
    """All three ``BIGFLEET_TLS_*`` set: mTLS; none set: plaintext; some set: an error.

    A partial set is refused rather than read as plaintext, so that a typo
    cannot silently turn mutual TLS off.
    """
    values = {name: env.get(name, "").strip() for name in _TLS_VARS}
    given = [name for name, value in values.items() if value]
    if not given:
        return None
    missing = [name for name in _TLS_VARS if name not in given]
    if missing:
        raise ConfigError(
            missing[0],
            f"must be set because {', '.join(given)} is (mutual TLS needs all three files)",
        )
    for name, value in values.items():
        if not Path(value).is_file():
            raise ConfigError(name, f"{value!r} is not a readable file")
    return TLSFiles(
        cert=Path(values["BIGFLEET_TLS_CERT"]),
        key=Path(values["BIGFLEET_TLS_KEY"]),
        ca=Path(values["BIGFLEET_TLS_CA"]),
    )


MODES = ("active", "shadow")


def parse_mode(env: Mapping[str, str]) -> str:
    """``BIGFLEET_MODE``: ``active`` (default) or ``shadow`` (decide and record, never act)."""
    raw = env.get("BIGFLEET_MODE", "").strip().lower() or "active"
    if raw not in MODES:
        raise ConfigError("BIGFLEET_MODE", f"{raw!r} is not one of {list(MODES)}")
    return raw


def parse_budgets_file(env: Mapping[str, str]) -> tuple[Budget, ...]:
    """``BIGFLEET_BUDGETS_FILE``: a JSON list of disruption budgets (docs/budgets.md).

    A budget that cannot be used is refused at start-up, naming the variable and the
    budget's field, rather than leaving drains unguarded.
    """
    name = "BIGFLEET_BUDGETS_FILE"
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    path = Path(raw)
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(name, f"{raw!r} cannot be read ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ConfigError(name, f"{raw!r} is not JSON (line {error.lineno}: {error.msg})") from None
    try:
        return parse_budgets(data)
    except BudgetError as error:
        raise ConfigError(name, str(error)) from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(name, f"{raw!r} is not a boolean (use true or false)")


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


def _optional_float(env: Mapping[str, str], name: str, *, minimum: float) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    return _float(env, name, 0.0, minimum=minimum)


def _probability(env: Mapping[str, str], name: str, default: float = 0.99) -> float:
    value = _float(env, name, default)
    if not 0.0 < value <= 1.0:
        raise ConfigError(name, f"{value} is not a probability above 0 and at most 1")
    return value


# At most this many edges by default: more has not been measured (ADR 0147).
MAX_AUTO_EDGES = 4


def auto_edges(cores: int | None = None) -> int:
    """Edge processes for a shard by default: one per core beyond the engine's (ADR 0147).

    ``cores``: those this process may run on (its CPU affinity when None).
    One core: none, the Session port stays a thread of the shard.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min((cores or 1) - 1, MAX_AUTO_EDGES))


def _edges(env: Mapping[str, str]) -> int:
    raw = env.get("BIGFLEET_SHARD_EDGES", "").strip()
    if raw in ("", "auto"):
        return auto_edges()
    if not raw.lstrip("+-").isdigit():
        raise ConfigError("BIGFLEET_SHARD_EDGES", f"{raw!r} is neither a whole number nor 'auto'")
    return _int(env, "BIGFLEET_SHARD_EDGES", 0)


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"{raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(name, f"{value} is below the minimum {minimum}")
    return value


def _listen(env: Mapping[str, str], name: str) -> str | None:
    """An optional HOST:PORT address (port 0: any free port)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    _, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(name, f"{raw!r} is not HOST:PORT")
    return raw


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
    # Stop acting this long before the lease can expire; None: a quarter of the ttl.
    lease_margin_s: float | None = None
    report_interval_s: float = 30.0
    # A shard with news for the coordinator reports this soon after its last report (ADR 0184).
    early_report_gap_s: float = 10.0
    # How often each shard reconciles providers, PostgreSQL and its engine (ADR 0103).
    reconcile_interval_s: float = 60.0
    # Multiplies every transitional-state deadline (fault drills and tests shorten them).
    deadline_scale: float = 1.0
    # A roll-up stamped further ahead of the shard's clock than this is rejected.
    rollup_max_skew_s: float = 300.0
    # Phase 3 waits for excess to persist (docs/adr/0090-reclaim-waits-for-excess-to-persist.md).
    reclaim_hysteresis_cycles: int = 3
    reclaim_min_age_s: float = 600.0
    reclaim_window_s: float = 600.0
    # A configured machine its provider warns about this strongly is drained and
    # replaced at once (docs/adr/0150-announced-interruptions-are-replaced-at-once.md).
    interruption_drain_threshold: float = 0.99
    interruption_grace_s: int = 90
    # How long a need waits for another shard's idle machine before buying (ADR 0129).
    fleet_idle_wait_s: float = 60.0
    # Where operators are told to dial this shard; empty: the listen address.
    shard_advertise: str = ""
    # How long a process keeps retrying PostgreSQL and Temporal at start-up.
    connect_timeout_s: float = 120.0
    # Where /metrics is served (prometheus_client), and the Temporal SDK's own metrics.
    metrics_listen: str | None = None
    temporal_metrics_listen: str | None = None
    data_dir: Path = field(default_factory=lambda: Path(".bigfleet"))
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    # Mutual TLS for every gRPC edge of the process; None means plaintext.
    tls: TLSFiles | None = None
    # Also use the TLS files for the Temporal client (the Temporal server must speak TLS).
    temporal_tls: bool = False
    # active, or shadow: the shard decides and records but never acts (docs/shadow-mode.md).
    mode: str = "active"
    # Fleet disruption budgets the shard enforces (BIGFLEET_BUDGETS_FILE).
    budgets: tuple[Budget, ...] = ()
    # Edge processes serving the shard's Session port (0: a thread of the shard; ADR 0147).
    # From the environment it defaults to auto_edges(); built directly, to none.
    shard_edges: int = 0
    # The Unix-domain socket a shard's edges join ('': one in the temporary directory).
    shard_edge_socket: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        ttl = _float(env, "BIGFLEET_LEASE_TTL_SECONDS", 30.0, minimum=1.0)
        margin = _optional_float(env, "BIGFLEET_LEASE_MARGIN_SECONDS", minimum=0.01)
        if margin is not None and margin >= ttl * 2 / 3:
            raise ConfigError(
                "BIGFLEET_LEASE_MARGIN_SECONDS",
                f"{margin:g} must be below two thirds of the lease ttl ({ttl * 2 / 3:g} s): "
                "a renewal every ttl/3 must still land before the acting deadline",
            )
        return cls(
            database_url=env.get("BIGFLEET_DATABASE_URL") or None,
            temporal_address=env.get("BIGFLEET_TEMPORAL_ADDRESS") or None,
            temporal_namespace=env.get("BIGFLEET_TEMPORAL_NAMESPACE", "default"),
            shard_id=env.get("BIGFLEET_SHARD_ID", "shard-0"),
            shard_listen=env.get("BIGFLEET_SHARD_LISTEN", "127.0.0.1:7443"),
            providers=parse_providers(env.get("BIGFLEET_PROVIDERS", "")),
            cycle_interval_s=_float(env, "BIGFLEET_CYCLE_SECONDS", 5.0, minimum=0.05),
            observe_interval_s=_float(env, "BIGFLEET_OBSERVE_SECONDS", 2.0, minimum=0.05),
            lease_ttl_s=ttl,
            lease_margin_s=margin,
            report_interval_s=_float(env, "BIGFLEET_REPORT_SECONDS", 30.0, minimum=0.1),
            early_report_gap_s=_float(env, "BIGFLEET_EARLY_REPORT_SECONDS", 10.0),
            reconcile_interval_s=_float(env, "BIGFLEET_RECONCILE_SECONDS", 60.0, minimum=0.1),
            deadline_scale=_float(env, "BIGFLEET_DEADLINE_SCALE", 1.0, minimum=0.001),
            rollup_max_skew_s=_float(env, "BIGFLEET_ROLLUP_MAX_SKEW_SECONDS", 300.0, minimum=1.0),
            reclaim_hysteresis_cycles=_int(env, "BIGFLEET_RECLAIM_HYSTERESIS_CYCLES", 3, minimum=1),
            reclaim_min_age_s=_float(env, "BIGFLEET_RECLAIM_MIN_AGE_SECONDS", 600.0),
            reclaim_window_s=_float(env, "BIGFLEET_RECLAIM_WINDOW_SECONDS", 600.0),
            interruption_drain_threshold=_probability(env, "BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD"),
            interruption_grace_s=_int(env, "BIGFLEET_INTERRUPTION_GRACE_SECONDS", 90),
            fleet_idle_wait_s=_float(env, "BIGFLEET_FLEET_IDLE_WAIT_SECONDS", 60.0),
            shard_advertise=_listen(env, "BIGFLEET_SHARD_ADVERTISE") or "",
            connect_timeout_s=_float(env, "BIGFLEET_CONNECT_TIMEOUT_SECONDS", 120.0),
            metrics_listen=_listen(env, "BIGFLEET_METRICS_LISTEN"),
            temporal_metrics_listen=_listen(env, "BIGFLEET_TEMPORAL_METRICS_LISTEN"),
            data_dir=Path(env.get("BIGFLEET_DATA_DIR", ".bigfleet")),
            tls=parse_tls(env),
            temporal_tls=_flag(env, "BIGFLEET_TEMPORAL_TLS"),
            mode=parse_mode(env),
            budgets=parse_budgets_file(env),
            shard_edges=_edges(env),
            shard_edge_socket=env.get("BIGFLEET_SHARD_EDGE_SOCKET", ""),
        )

    def engine_config(self) -> EngineConfig:
        """The shard engine's tuning from these settings (defaults for everything else)."""
        return EngineConfig(
            reclaim_hysteresis_cycles=self.reclaim_hysteresis_cycles,
            reclaim_min_age_seconds=self.reclaim_min_age_s,
            reclaim_window_seconds=self.reclaim_window_s,
            rollup_max_skew_seconds=self.rollup_max_skew_s,
            interruption_drain_threshold=self.interruption_drain_threshold,
            interruption_grace_seconds=self.interruption_grace_s,
            fleet_idle_wait_seconds=self.fleet_idle_wait_s,
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
            "BIGFLEET_SHARD_EDGES": (
                "edge processes serving Shard.Session, sharing its port (SO_REUSEPORT) and "
                "relaying validated roll-ups to the shard; 0: a thread of the shard process "
                f"(default auto: one per core beyond the shard's, at most {MAX_AUTO_EDGES}; "
                "ADR 0147)"
            ),
            "BIGFLEET_SHARD_EDGE_SOCKET": (
                "Unix-domain socket the shard's edge processes join (default: one in the "
                "temporary directory, named after the shard)"
            ),
            "BIGFLEET_PROVIDERS": "NAME=HOST:PORT,... capacity providers to use",
            "BIGFLEET_CYCLE_SECONDS": "decision cycle interval (default 5)",
            "BIGFLEET_OBSERVE_SECONDS": "provider List interval (default 2)",
            "BIGFLEET_LEASE_TTL_SECONDS": "shard lease lifetime; renewed at a third of it",
            "BIGFLEET_LEASE_MARGIN_SECONDS": "stop acting this long before the lease can "
            "expire (default: a quarter of the ttl; ADR 0100)",
            "BIGFLEET_REPORT_SECONDS": "how often a shard reports to the coordinator (default 30)",
            "BIGFLEET_EARLY_REPORT_SECONDS": (
                "a shard whose cycle found a new shortfall or more idle machines, or that has "
                "not reported since it started, reports at once, no sooner than this after "
                "its last report (default 10; at or above "
                "BIGFLEET_REPORT_SECONDS, only at the interval)"
            ),
            "BIGFLEET_RECONCILE_SECONDS": "how often a shard compares providers, PostgreSQL "
            "and its engine and repairs drift (default 60; ADR 0103)",
            "BIGFLEET_DEADLINE_SCALE": "multiplies every transitional-state deadline "
            "(default 1: creating/configuring/deleting 10 min, draining grace + 5 min)",
            "BIGFLEET_ROLLUP_MAX_SKEW_SECONDS": (
                "reject roll-ups stamped further ahead of the shard's clock (default 300)"
            ),
            "BIGFLEET_RECLAIM_HYSTERESIS_CYCLES": (
                "cycles excess must persist before it is reclaimed (default 3)"
            ),
            "BIGFLEET_RECLAIM_MIN_AGE_SECONDS": (
                "a machine (and its need) is reclaimed only this long after it was configured "
                "(default 600)"
            ),
            "BIGFLEET_SHARD_ADVERTISE": (
                "HOST:PORT operators are told to dial for this shard (default: the listen "
                "address; a 0.0.0.0 listener needs one)"
            ),
            "BIGFLEET_CONNECT_TIMEOUT_SECONDS": (
                "how long a process retries PostgreSQL and Temporal at start-up (default 120)"
            ),
            "BIGFLEET_METRICS_LISTEN": "HOST:PORT serving Prometheus /metrics (unset: none)",
            "BIGFLEET_TEMPORAL_METRICS_LISTEN": (
                "HOST:PORT serving the Temporal SDK's own Prometheus metrics (unset: none)"
            ),
            "BIGFLEET_INTERRUPTION_DRAIN_THRESHOLD": (
                "a configured machine whose provider reports at least this interruption "
                "probability (0.99: a spot interruption warning) is drained and replaced at "
                "once (default 0.99)"
            ),
            "BIGFLEET_INTERRUPTION_GRACE_SECONDS": (
                "drain grace for such a machine (default 90: inside EC2's two-minute warning)"
            ),
            "BIGFLEET_FLEET_IDLE_WAIT_SECONDS": (
                "how long a need waits for another shard's idle machine, which the "
                "coordinator moves, before creating or claiming one (default 60; 0: never "
                "wait; ADR 0129)"
            ),
            "BIGFLEET_RECLAIM_WINDOW_SECONDS": (
                "excess is judged against each need's peak over this window (default 600)"
            ),
            "BIGFLEET_DATA_DIR": "local state (embedded Postgres, Temporal dev DB)",
            "BIGFLEET_TLS_CERT": "PEM cert with one bigfleet:// URI SAN (mTLS: all three or none)",
            "BIGFLEET_TLS_KEY": "PEM private key of BIGFLEET_TLS_CERT",
            "BIGFLEET_TLS_CA": "PEM CA bundle that peers' certificates must chain to",
            "BIGFLEET_TEMPORAL_TLS": "true: present the TLS files to Temporal too (default false)",
            "BIGFLEET_MODE": (
                "active (default) or shadow: the shard takes roll-ups and decides, records "
                "every decision and never acts (no workflow, provider call or instruction)"
            ),
            "BIGFLEET_BUDGETS_FILE": (
                "JSON list of disruption budgets: nodes (count or %), reasons (reclaim, "
                "preempt), scope (instance_types, capacity_types, resources, clusters), "
                "optional cron schedule + duration (docs/budgets.md)"
            ),
        }
