"""Where a running stack can be reached: written by the dev stack, read by the CLI.

    bigfleet dev ──start──► DATA_DIR/endpoints.json   {database_url, temporal_address,
                                                       namespace, shards, providers,
                                                       metrics, ui, pid, started_at}
                 ──stop───► removed
    bigfleet <command> ──► Endpoints.resolve(flags, environment, data dir)

Every CLI command that reads PostgreSQL or Temporal finds a running
``make dev`` stack by itself; ``--database-url`` and ``--address`` override
it, and so do ``BIGFLEET_DATABASE_URL`` and ``BIGFLEET_TEMPORAL_ADDRESS``.
A file left behind by a stack that is gone (its process no longer exists)
is ignored. When nothing names an endpoint, the error says what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ENDPOINTS_FILE", "Endpoints", "EndpointsMissing"]

ENDPOINTS_FILE = "endpoints.json"

_START_HINT = "start the dev stack with `make dev`"


class EndpointsMissing(LookupError):
    """No flag, variable or running dev stack names an endpoint a command needs."""

    def __init__(self, what: str, flag: str, variable: str) -> None:
        self.what = what
        super().__init__(
            f"no {what} to connect to: {_START_HINT} (it is found in its data dir), "
            f"or pass {flag}, or set {variable}"
        )


@dataclass(frozen=True)
class Endpoints:
    """The addresses of one stack (any of them may be empty)."""

    database_url: str = ""
    temporal_address: str = ""
    namespace: str = "default"
    shards: Mapping[str, str] = field(default_factory=dict)
    providers: Mapping[str, str] = field(default_factory=dict)
    metrics: str = ""
    ui: str = ""
    pid: int = 0
    started_at: float = 0.0

    # -- the dev stack's side -----------------------------------------------------------------
    def write(self, data_dir: Path) -> Path:
        """Write the file (atomically: a reader never sees half of it)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        target = data_dir / ENDPOINTS_FILE
        partial = target.with_suffix(".json.tmp")
        partial.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        partial.replace(target)
        return target

    @staticmethod
    def remove(data_dir: Path) -> None:
        """Remove the file (the stack stopped)."""
        with contextlib.suppress(FileNotFoundError):
            (data_dir / ENDPOINTS_FILE).unlink()

    # -- the CLI's side -----------------------------------------------------------------------
    @classmethod
    def read(cls, data_dir: Path) -> Endpoints | None:
        """The endpoints of a stack still running from ``data_dir``, or None."""
        path = data_dir / ENDPOINTS_FILE
        try:
            raw: Any = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict):
            return None
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        if not _well_typed(known):
            return None
        found = cls(**known)
        if found.pid and not _alive(found.pid):
            return None
        return found

    @classmethod
    def resolve(
        cls,
        *,
        data_dir: Path,
        environment: Mapping[str, str],
        database_url: str | None = None,
        temporal_address: str | None = None,
    ) -> Endpoints:
        """Flags first, then the environment, then a running dev stack in ``data_dir``."""
        running = cls.read(data_dir) or cls()
        return cls(
            database_url=database_url
            or environment.get("BIGFLEET_DATABASE_URL", "")
            or running.database_url,
            temporal_address=temporal_address
            or environment.get("BIGFLEET_TEMPORAL_ADDRESS", "")
            or running.temporal_address,
            namespace=environment.get("BIGFLEET_TEMPORAL_NAMESPACE", "") or running.namespace,
            shards=running.shards,
            providers=running.providers,
            metrics=running.metrics,
            ui=running.ui,
            pid=running.pid,
            started_at=running.started_at,
        )

    def need_database(self) -> str:
        """The database URL, or :class:`EndpointsMissing` saying how to get one."""
        if not self.database_url:
            raise EndpointsMissing("PostgreSQL", "--database-url", "BIGFLEET_DATABASE_URL")
        return self.database_url

    def need_temporal(self) -> str:
        """The Temporal address, or :class:`EndpointsMissing` saying how to get one."""
        if not self.temporal_address:
            raise EndpointsMissing("Temporal", "--address", "BIGFLEET_TEMPORAL_ADDRESS")
        return self.temporal_address


def _well_typed(fields: Mapping[str, Any]) -> bool:
    """Every field the type the dev stack writes (a damaged file is ignored whole)."""
    for name, value in fields.items():
        if name in ("shards", "providers"):
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                return False
        elif name == "pid":
            if not isinstance(value, int) or isinstance(value, bool):
                return False
        elif name == "started_at":
            if not isinstance(value, int | float) or isinstance(value, bool):
                return False
        elif not isinstance(value, str):
            return False
    return True


def _alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without touching it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
