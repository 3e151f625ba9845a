"""Fault-injection tier: a loopback TCP fault proxy and scenarios, one process per part."""
