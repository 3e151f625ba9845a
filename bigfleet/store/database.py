"""Connections: an async SQLAlchemy engine over asyncpg, an embedded server, migrations."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bigfleet.extras import MissingExtra

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent.parent / "migrations"


def to_async_url(url: str) -> str:
    """Normalise a PostgreSQL URL to the ``postgresql+asyncpg`` dialect SQLAlchemy needs.

    Accepts ``postgres://``, ``postgresql://`` and ``postgresql+asyncpg://``;
    drops libpq-only query options asyncpg does not understand.
    """
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme in ("postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2"):
        scheme = "postgresql+asyncpg"
    elif scheme != "postgresql+asyncpg":
        raise ValueError(f"database URL: unsupported scheme {parts.scheme!r} (want postgresql://)")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("sslmode", "connect_timeout")]
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def alembic_config(url: str) -> Config:
    """An Alembic configuration pointing at ``migrations/`` and ``url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a URL must be doubled.
    cfg.set_main_option("sqlalchemy.url", to_async_url(url).replace("%", "%%"))
    return cfg


@dataclass
class Database:
    """One async engine for one database URL. Create with :meth:`connect`."""

    url: str
    engine: AsyncEngine

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 5) -> Database:
        engine = create_async_engine(
            to_async_url(url), pool_size=pool_size, max_overflow=5, pool_pre_ping=True
        )
        return cls(url=url, engine=engine)

    async def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to ``revision`` (Alembic runs in a worker thread)."""
        await asyncio.to_thread(command.upgrade, alembic_config(self.url), revision)

    async def downgrade(self, revision: str = "base") -> None:
        await asyncio.to_thread(command.downgrade, alembic_config(self.url), revision)

    async def close(self) -> None:
        await self.engine.dispose()


class EmbeddedPostgres:
    """A PostgreSQL server run from the ``pgserver`` wheel in a local data directory.

    Used by the dev stack when ``BIGFLEET_DATABASE_URL`` is unset, so a fresh
    machine needs no database installed. Data persists in ``data_dir`` across runs.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server and return its connection URL."""
        try:
            import pgserver
        except ImportError as err:
            raise MissingExtra(
                "the embedded PostgreSQL",
                package="pgserver",
                extra="dev",
                instead="set BIGFLEET_DATABASE_URL to a running server",
            ) from err

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = pgserver.get_server(  # type: ignore[attr-defined]
            self.data_dir, cleanup_mode="stop"
        )
        uri: str = self._server.get_uri()
        log.info("embedded postgres ready at %s", uri)
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
