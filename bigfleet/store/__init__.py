"""Durable state in PostgreSQL: shard leases and epochs, cluster and machine assignments.

Only what must survive a restart lives here (DESIGN §5). Every write that
could race is a compare-and-set. Schema changes go through ``migrations/``.
One repository per aggregate (``shards``, ``clusters``, ``machines``,
``instructions``); ``Store`` composes them for the process wiring.
"""

from bigfleet.store.clusters import ClusterAssignment, ClusterMove, ClusterRepository
from bigfleet.store.database import Database, EmbeddedPostgres, to_async_url
from bigfleet.store.instructions import InstructionRepository, InstructionRow
from bigfleet.store.machines import MachineAssignment, MachineRepository
from bigfleet.store.repository import Store
from bigfleet.store.shards import (
    LeaseHeld,
    LeaseLost,
    MembershipError,
    ShardNotEmpty,
    ShardRemoved,
    ShardRepository,
    ShardRow,
)

__all__ = [
    "ClusterAssignment",
    "ClusterMove",
    "ClusterRepository",
    "Database",
    "EmbeddedPostgres",
    "InstructionRepository",
    "InstructionRow",
    "LeaseHeld",
    "LeaseLost",
    "MachineAssignment",
    "MachineRepository",
    "MembershipError",
    "ShardNotEmpty",
    "ShardRemoved",
    "ShardRepository",
    "ShardRow",
    "Store",
    "to_async_url",
]
