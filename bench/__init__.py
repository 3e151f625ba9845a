"""Benchmarks: each suite prints its figures as JSON lines (see docs/benchmarks.md)."""
