"""``Store``: every repository of the schema over one engine, for the process wiring.

    Store = ShardRepository       shards.py        leases, epochs, membership, addresses
          + ClusterRepository     clusters.py      cluster -> shard, cluster moves
          + MachineRepository     machines.py      ownership, binding, quarantine, the log
          + InstructionRepository instructions.py  coordinator term, instruction log

The bootstrap builds one ``Store`` per process and hands it down. A part
that needs one aggregate should ask for that repository, and an activity
for a Protocol of its own (``activities/``), which a ``Store`` satisfies.
Every contended write is a compare-and-set (see each repository).
"""

from __future__ import annotations

from bigfleet.store.clusters import ClusterRepository
from bigfleet.store.instructions import InstructionRepository
from bigfleet.store.machines import MachineRepository
from bigfleet.store.shards import ShardRepository

__all__ = ["Store"]


class Store(ShardRepository, ClusterRepository, MachineRepository, InstructionRepository):
    """Typed access to the BigFleet schema over one async engine: all four repositories."""
