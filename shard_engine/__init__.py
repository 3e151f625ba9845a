"""BigFleet's shard decision engine: pure functions and values, numpy (and numba) only.

Nothing in this package performs I/O, reads a clock or starts work. Callers
pass ``now`` in and carry out the returned plan. See ``shard_engine/README.md``.
"""
