"""Durable state in PostgreSQL: shard leases and epochs, cluster and machine assignments.

Only what must survive a restart lives here (DESIGN §5). Every write that
could race is a compare-and-set. Schema changes go through ``migrations/``.
"""

from bigfleet.store.database import Database, EmbeddedPostgres, to_async_url
from bigfleet.store.repository import LeaseLost, MachineAssignment, Store

__all__ = [
    "Database",
    "EmbeddedPostgres",
    "LeaseLost",
    "MachineAssignment",
    "Store",
    "to_async_url",
]
