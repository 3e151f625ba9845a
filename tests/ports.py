"""A free loopback TCP port for a server a test starts (never a fixed port)."""

from __future__ import annotations

from bigfleet.temporal import free_port

__all__ = ["free_port"]
