"""The machines a shard process owns, and what it knows of them that the engine does not keep.

    owned       machine -> provider, as PostgreSQL records it; only these are observed
                and acted on (a machine listed by a provider but owned by another
                shard is invisible here)
    priorities  machine -> the priority of the workload it serves, read back from the
                ``bigfleet.io/priority`` key the provider echoes in ``shard_metadata``
    serving     machine -> the key of the need it was configured for (``bigfleet.io/need``)
    leaving     machines being drained for another shard's need, by the coordinator
                instruction (term, seq) that asked; they are out of the engine and are
                handed over once idle

Shared by the parts of the shard process that change ownership (cross-shard
transfers, membership moves) and those that read it (the provider observer,
the outcome recorder, the coordinator reporter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Holdings"]


@dataclass
class Holdings:
    """Ownership and workload priority of one shard's machines."""

    owned: dict[str, str] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)
    leaving: dict[str, tuple[int, int]] = field(default_factory=dict)

    def priority(self, machine_id: str) -> int:
        """The priority of the workload the machine serves (0 when it serves none)."""
        return self.priorities.get(machine_id, 0)

    def leaving_for(self, term: int, seq: int) -> list[str]:
        """The machines being drained for one coordinator instruction."""
        return [m for m, key in self.leaving.items() if key == (term, seq)]
