"""The stack a roll-up ingestion bench runs on, and the child processes it starts.

``bench ingest`` and ``bench soak`` both measure one real shard process fed
by load processes; this is what they share, so the two start, feed and stop
their shard the same way::

    services(quota_scale=…)   a Temporal dev server and a simulated cloud (this process)
      └─ Stack                 where a shard child finds them, and how it is tuned
           start_shard          a real shard (``bench.ingest --child shard``) on a fresh database
           start_load           a load process (``bench.ingest --child load``) against it
           split_load           C clusters over two load processes, a connection each
           stop_shard           SIGTERM, then kill after 20 s; the database dropped

and the readings taken of a child: :func:`json_line` (its answers),
:func:`rss_kib`, :func:`loadavg`, :func:`percentile`; and, inside a child,
:func:`malloc_kib` (what the C allocator holds in use and free). The children's own code
(the shard, the load generator, the floor's echo server) stays in
``bench.ingest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Stack",
    "free_port",
    "json_line",
    "loadavg",
    "malloc_kib",
    "percentile",
    "rss_kib",
    "services",
    "split_load",
    "start_load",
    "start_shard",
    "stop_shard",
]

Drop = Callable[[], Awaitable[None]]
"""Drops the database a shard child ran on (nothing for the floor's echo server)."""


def free_port() -> int:
    """A loopback port nobody listens on now (for the Temporal dev server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_kib(pid: int) -> int:
    """A process's resident memory (KiB, ``VmRSS``); 0 when the kernel does not say."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33 and later)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def malloc_kib() -> tuple[int, int] | None:
    """This process's C heap (KiB): (in use, free but kept by the allocator); None off glibc.

    What the RSS alone cannot tell: after a burst, memory the program gave
    back (in use falls) that the allocator keeps in its free lists, in
    fragments too small to hand back to the kernel (free rises), against
    memory still held.
    """
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return (info.uordblks + info.hblkhd) // 1024, info.fordblks // 1024


def loadavg() -> str:
    """The machine's 1, 5 and 15 minute load averages, as printed beside every figure."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; NaN for no values (a window nothing landed in)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (or of one of its threads)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def runqueue_seconds(pids: Sequence[int]) -> float | None:
    """Seconds the threads of ``pids`` spent runnable but waiting for a core, summed.

    The second field of Linux's ``/proc/PID/task/TID/schedstat``. A process
    that waits here is short of CPU, not slow: on a machine whose cores the
    load generators share with the shard, this is what separates the two.
    None where the kernel keeps no such statistics; a process that has
    ended counts for nothing.
    """
    total = 0
    found = False
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found = True
    return total / 1e9 if found else None


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy (not idle, not waiting on I/O)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def services(*, quota_scale: float) -> AsyncIterator[tuple[str, str]]:
    """A Temporal dev server and a simulated cloud: (Temporal address, provider address).

    The cloud runs in this process, 1,000 times faster than real time and
    without spot interruptions; ``quota_scale`` sets how much it can create
    (little, so needs stay unmet, or some, so machines come and go). Both
    are stopped when the block ends.
    """
    from bigfleet.temporal import start_dev_server
    from providers.config import ProviderConfig
    from providers.server import start_provider_server

    env = await start_dev_server(port=free_port(), ui=False)
    provider = await start_provider_server(
        ProviderConfig(
            kind="sim-cloud", time_factor=0.001, quota_scale=quota_scale, interruption_scale=0.0
        ),
        "127.0.0.1:0",
    )
    try:
        yield env.client.service_client.config.target_host, provider.address
    finally:
        await provider.stop(grace=None)
        await env.shutdown()


async def _database(admin_url: str | None) -> tuple[str, Drop]:
    """A fresh database URL and a cleanup coroutine function."""
    import asyncpg

    name = f"bench_ingest_{os.getpid()}_{secrets.token_hex(3)}"
    url = admin_url or "postgresql://postgres@127.0.0.1:5432/postgres"
    try:
        conn = await asyncpg.connect(url)
    except OSError:
        from bigfleet.store import EmbeddedPostgres

        embedded = EmbeddedPostgres(Path(".bigfleet") / "bench-postgres")
        url = await asyncio.to_thread(embedded.start)
        conn = await asyncpg.connect(url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    head = url.rsplit("/", 1)[0]

    async def drop() -> None:
        c = await asyncpg.connect(url)
        await c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await c.close()

    return f"{head}/{name}", drop


@dataclass
class Stack:
    """Where a shard child finds Temporal, the provider and PostgreSQL, and how it is tuned."""

    temporal: str
    provider: str
    admin_url: str | None
    switch_interval_ms: float | None = None
    cycle_seconds: float = 5.0
    plain_gc: bool = False
    # Edge processes serving the shard's Session port (0: a thread of the shard; ADR 0147).
    edges: int = 0


async def json_line(stream: asyncio.StreamReader, within: float) -> dict[str, Any]:
    """A child's next JSON answer (other lines skipped); fails when it ends or falls silent."""
    while True:
        raw = await asyncio.wait_for(stream.readline(), timeout=within)
        if not raw:
            raise RuntimeError("child ended without answering")
        text = raw.decode().strip()
        if text.startswith("{"):
            data: dict[str, Any] = json.loads(text)
            return data


async def _no_database() -> None:
    """The floor's echo server ran on no database: nothing to drop."""


#: Longest result line read from a load process (an hour at 2,000 roll-ups/s is ~100 MB).
_RESULT_LINE_LIMIT = 1 << 30


async def start_shard(stack: Stack, child: str = "shard") -> tuple[Any, Drop]:
    """The process under test (a real shard on a fresh database, or the floor's echo server)."""
    drop: Drop
    if child == "echo":  # the floor: no shard, no database
        shard = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.ingest", "--child", "echo", stdout=asyncio.subprocess.PIPE
        )
        drop = _no_database
    else:
        url, drop = await _database(stack.admin_url)
        shard = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.ingest",
            "--child",
            "shard",
            "--database-url",
            url,
            "--temporal",
            stack.temporal,
            "--provider",
            stack.provider,
            "--cycle-seconds",
            str(stack.cycle_seconds),
            *(
                []
                if stack.switch_interval_ms is None
                else ["--switch-interval-ms", str(stack.switch_interval_ms)]
            ),
            *(["--plain-gc"] if stack.plain_gc else []),
            # Always said: the child's own default is the product's (one per spare core).
            "--edges",
            str(stack.edges),
            stdout=asyncio.subprocess.PIPE,
            # The shard's closing figures are one JSON line: its cycles and, with edges,
            # every report of theirs (an hour of them passed 64 KiB).
            limit=_RESULT_LINE_LIMIT,
        )
    return shard, drop


async def stop_shard(shard: Any, drop: Drop) -> None:
    """Make sure the shard child has ended, then drop its database.

    Called whether or not the bench asked it to stop already: a child still
    running gets SIGTERM, and is killed if it has not ended 20 s later, so
    a failed run leaves no shard process and no database behind.
    """
    if shard.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            shard.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(shard.wait(), 20)
        except TimeoutError:
            shard.kill()
    await drop()


async def stop_loads(loads: Sequence[Any]) -> None:
    """Kill every load process still running (a run cut short must not leave its load on)."""
    for proc in loads:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def start_load(
    address: str, prefix: str, *, sessions: int, mode: str, seconds: float, **opts: Any
) -> Any:
    """One load process (``--child load``) against ``address``; its stdout is piped.

    Each option becomes a flag (``start_at`` → ``--start-at``): ``True`` a
    bare flag, ``False`` and ``None`` none, anything else its value.
    """
    flags: list[str] = []
    for key, value in opts.items():
        if value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.ingest",
        "--child",
        "load",
        "--address",
        address,
        "--prefix",
        prefix,
        "--sessions",
        str(sessions),
        "--mode",
        mode,
        "--seconds",
        str(seconds),
        *flags,
        stdout=asyncio.subprocess.PIPE,
        # A load's result is one JSON line holding every send and latency: an
        # hour of it passed 64 MiB (the soak's first 60-minute run failed on it).
        limit=_RESULT_LINE_LIMIT,
    )


async def split_load(
    address: str,
    prefix: str,
    *,
    clusters: int,
    mode: str,
    seconds: float,
    rate: float | None = None,
    **opts: Any,
) -> list[Any]:
    """``clusters`` clusters over two load processes (``prefix-0``, ``prefix-1``).

    Two, so that one process's Python is not the bottleneck; each cluster
    has a connection of its own, and an offered ``rate`` (roll-ups/s, open
    loop) is shared in proportion to the clusters each process holds.
    """
    halves = [clusters // 2, clusters - clusters // 2]
    return [
        await start_load(
            address,
            f"{prefix}-{i}",
            sessions=n,
            connections=n,
            mode=mode,
            seconds=seconds,
            **({} if rate is None else {"rate": rate * n / clusters}),
            **opts,
        )
        for i, n in enumerate(halves)
    ]
