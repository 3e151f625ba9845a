"""A loopback TCP fault proxy: pass, cut, blackhole and delay, switchable at run time.

    client ──▶ FaultProxy(listen) ──▶ target (PostgreSQL, a provider, ...)

Modes, set by the process that owns the proxy:

    heal()        bytes flow both ways (the default)
    cut()         every open connection is reset, and new ones are reset on accept:
                  what a client sees when the server's host goes away
    blackhole()   connections stay open and new ones are accepted, but no byte moves
                  in either direction; bytes already sent wait in the kernel, as they
                  would in TCP retransmission, and flow again after heal()
    delay(s)      every chunk is held ``s`` seconds before it is forwarded

The proxy never reads past what it forwards: while blackholed it stops
reading, so nothing is lost and nothing is answered. It runs on the caller's
event loop (``await proxy.start()``), or in a process of its own
(``python -m tests.chaos.faultproxy --listen ... --target ...`` reading
``heal``/``cut``/``blackhole``/``delay S`` lines on stdin).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FaultProxy", "ProxyStats"]

CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    """What the proxy has seen since it started."""

    accepted: int = 0
    reset: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class _Link:
    """One proxied connection: the client's side and the target's side."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> None:
        self.client = client
        self.target = target
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        """Reset both sides (RST, not FIN: the peer sees the connection torn down)."""
        for _, writer in filter(None, (self.client, self.target)):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forwards TCP connections from ``listen`` to ``target``, with faults on demand."""

    def __init__(self, target: str, *, listen: str = "127.0.0.1:0") -> None:
        host, _, port = target.rpartition(":")
        self.target_host, self.target_port = host or "127.0.0.1", int(port)
        lhost, _, lport = listen.rpartition(":")
        self._listen = (lhost or "127.0.0.1", int(lport))
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut = False
        self._delay_s = 0.0
        self.stats = ProxyStats()
        self.mode = "pass"
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` clients dial instead of the target."""
        return f"{self._listen[0]}:{self.port}"

    def retarget(self, target: str) -> None:
        """Send new connections to another target (a server restarted elsewhere)."""
        host, _, port = target.rpartition(":")
        self.target_host, self.target_port = host or "127.0.0.1", int(port)

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, *self._listen)
        sock: socket.socket = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    # ------------------------------------------------------------- faults

    def heal(self) -> None:
        """Forward everything again (blackholed bytes flow on)."""
        self._cut = False
        self._delay_s = 0.0
        self.mode = "pass"
        self._flowing.set()

    def cut(self) -> None:
        """Reset every open connection and every new one until :meth:`heal`."""
        self._cut = True
        self.mode = "cut"
        self._flowing.set()
        for link in list(self._links):
            self.stats.reset += 1
            link.abort()
        self._links.clear()

    def blackhole(self) -> None:
        """Hold every connection open and move no byte until :meth:`heal`."""
        self._cut = False
        self.mode = "blackhole"
        self._flowing.clear()

    def delay(self, seconds: float) -> None:
        """Hold each chunk ``seconds`` before forwarding it (0 forwards at once)."""
        self._delay_s = max(0.0, seconds)
        self.mode = "delay" if seconds > 0 else "pass"

    # ---------------------------------------------------------- forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self._cut:
            self.stats.reset += 1
            writer.transport.abort()
            return
        link = _Link((reader, writer), None)
        self._links.add(link)
        try:
            # A blackholed network does not even complete the upstream connection.
            await self._flowing.wait()
            if self._cut:
                link.abort()
                return
            try:
                link.target = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                link.abort()
                return
            up = asyncio.create_task(self._pump(reader, link.target[1], up=True))
            down = asyncio.create_task(self._pump(link.target[0], writer, up=False))
            link.tasks = [up, down]
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            self._links.discard(link)
            for task in link.tasks:
                task.cancel()
            for _, w in filter(None, (link.client, link.target)):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool
    ) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    with contextlib.suppress(Exception):
                        writer.write_eof()
                    return
                if self._delay_s > 0:
                    await asyncio.sleep(self._delay_s)
                # Bytes read just before a blackhole wait with the rest.
                await self._flowing.wait()
                if self._cut:
                    return
                writer.write(data)
                await writer.drain()
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
        except (ConnectionError, OSError):
            return


async def _serve(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--target", required=True)
    args = parser.parse_args(argv)
    proxy = await FaultProxy(args.target, listen=args.listen).start()
    print(f"faultproxy {proxy.address} -> {args.target}", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        verb, _, arg = line.partition(" ")
        if verb == "heal":
            proxy.heal()
        elif verb == "cut":
            proxy.cut()
        elif verb == "blackhole":
            proxy.blackhole()
        elif verb == "delay":
            proxy.delay(float(arg or 0))
        else:
            print(f"unknown command {verb!r}", flush=True)
            continue
        print(f"mode {proxy.mode}", flush=True)
    await proxy.stop()


if __name__ == "__main__":
    asyncio.run(_serve())
