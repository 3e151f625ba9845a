"""Dealing the fleet out to shards: cloud quota evenly, bare metal in whole racks.

    unowned machines ──unit_of──▶ cloud quota group | rack
        cloud (speculative slots only)  one machine at a time to the shard with the
                                        fewest of that quota group (``distribute_evenly``)
        bare metal                      a rack somebody holds: its new machines join
                                        that holder; a free rack goes whole to the
                                        shard holding the fewest racks

Why whole racks: a gang (``OPERATOR_SAME`` on the rack key, DESIGN §9 "a gang
is a need") can only be placed by a shard that holds enough of one rack, and
topology never crosses a shard boundary. Split a rack in halves and a gang
of more than half a rack starves on every shard while the rack is idle.

Why only speculative cloud slots: a cloud machine that is idle or
configured and owned by nobody is an orphan for reconcile to explain, not
quota to hand out.

One pure function, used by the coordinator's distribution (production) and
by the simulator's start, so both deal the same fleet the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shard_engine.coordination import distribute_evenly, quota_group
from shard_engine.model import CapacityType

__all__ = ["Deal", "Dealable", "deal", "rack_of"]

#: The group every rack is counted in when racks are spread over shards.
_RACKS = "racks"


class Dealable(NamedTuple):
    """One machine as the dealer sees it (from a provider's List or the simulated fleet).

    A tuple: the simulator deals a million of them at its start.
    """

    machine_id: str
    provider: str
    zone: str
    instance_type: str
    capacity_type: int
    #: The rack (bare metal: the rack label, else the zone); ignored for cloud machines.
    rack: str = ""
    speculative: bool = True
    #: The shard that owns it already ("" when nobody does).
    owner: str = ""

    @property
    def bare_metal(self) -> bool:
        return self.capacity_type == int(CapacityType.BARE_METAL)

    @property
    def group(self) -> str:
        """The cloud quota group it counts in (see ``quota_group``)."""
        return quota_group(self.provider, self.zone, self.instance_type, self.capacity_type)


@dataclass(frozen=True, slots=True)
class Deal:
    """What each shard is given: cloud machines, and racks with their machines."""

    cloud: dict[str, list[str]] = field(default_factory=dict)
    racks: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def machines_of(self, shard_id: str) -> list[str]:
        """Every machine dealt to one shard, cloud first, then rack by rack."""
        out = list(self.cloud.get(shard_id, []))
        for _rack, ids in sorted(self.racks.get(shard_id, {}).items()):
            out += ids
        return out


def rack_of(labels: Mapping[str, str], zone: str, rack_label: str) -> str:
    """The rack a bare-metal machine belongs to: its rack label, else its zone."""
    return labels.get(rack_label) or zone


def deal(machines: Iterable[Dealable], shards: Sequence[str]) -> Deal:
    """Deal the unowned machines of ``machines`` to ``shards`` (see the module docstring).

    ``machines`` lists owned machines too: they are what each shard already
    holds, so the counts even out and a held rack stays with its holder.
    Deterministic in its input (sorted), whatever its order. Shards are
    taken as given; with none, nothing is dealt.
    """
    if not shards:
        return Deal()
    cloud_unowned: dict[str, list[str]] = defaultdict(list)
    cloud_held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rack_machines: dict[str, list[Dealable]] = defaultdict(list)
    for m in machines:
        if m.bare_metal:
            rack_machines[m.rack or m.zone].append(m)
        elif m.owner:
            cloud_held[m.owner][m.group] += 1
        elif m.speculative:
            cloud_unowned[m.group].append(m.machine_id)
    cloud = distribute_evenly(cloud_unowned, shards, cloud_held)
    holder: dict[str, str] = {}
    for rack, members in sorted(rack_machines.items()):
        owners = sorted({m.owner for m in members if m.owner})
        if owners:
            # A rack already split (by an older dealer) stays with the first holder by id.
            holder[rack] = owners[0]
    held_racks: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for owner in holder.values():
        held_racks[owner][_RACKS] += 1
    free = [r for r in rack_machines if r not in holder]
    for shard, rack_ids in distribute_evenly({_RACKS: free}, shards, held_racks).items():
        for rack in rack_ids:
            holder[rack] = shard
    racks: dict[str, dict[str, list[str]]] = {}
    for rack, members in sorted(rack_machines.items()):
        shard = holder[rack]
        unowned = sorted(m.machine_id for m in members if not m.owner)
        if unowned and shard in shards:
            racks.setdefault(shard, {})[rack] = unowned
    return Deal(cloud={s: ids for s, ids in cloud.items() if ids}, racks=racks)
