"""What a shard tells the coordinator it holds: supply per machine profile.

    per machine (a sample record of its profile, its state, bound?, the priority it
    serves, busy?) ──profile_supply──▶ ProfileSupply per (provider, instance type,
                                       zone, capacity type, rack)
        idle         IDLE and bound to no cluster
        speculative  SPECULATIVE
        configured   CONFIGURED, counted by the priority it serves (0 when none echoed)
        busy machines (in flight, promised, leaving) are counted in no column, but
        their profile is still reported
    rack: the machines' ``topology.kubernetes.io/rack`` label ("" without one), so
          a gang's machines can be moved within one rack (``coordination.DOMAIN_LABEL``)

One rule for production's ``CoordinatorReporter`` (over the engine's records)
and the simulator (over its mirror of the provider cores), so the
coordinator plans from the same picture in both.

``free_supply`` is the same count without the configured column, from the
engine's per-profile counters (``ShardEngine.free_by_profile``): what a
coordinator round needs when no shortfall may preempt, at the cost of the
number of profiles rather than of machines (the simulator's million-machine
fleet reports every 30 virtual seconds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from shard_engine.catalog import Profile
from shard_engine.coordination import DOMAIN_LABEL, ProfileSupply
from shard_engine.model import MachineRecord, MachineState

__all__ = [
    "Free",
    "Held",
    "ProfileKey",
    "free_counts",
    "free_entry",
    "free_supply",
    "profile_key",
    "profile_supply",
]


class Held(NamedTuple):
    """One machine as the report counts it (a tuple: a report counts every machine)."""

    #: A record of the machine's profile (its labels and allocatable are reported). Samples
    #: are told apart by identity, so each must stay alive for the whole call.
    sample: MachineRecord
    state: MachineState
    bound: bool
    priority: int
    busy: bool


def profile_supply(machines: Iterable[Held]) -> tuple[ProfileSupply, ...]:
    """Supply per profile, sorted by profile key (see the module docstring)."""
    samples: dict[ProfileKey, MachineRecord] = {}
    idle: Counter[ProfileKey] = Counter()
    speculative: Counter[ProfileKey] = Counter()
    configured: dict[ProfileKey, Counter[int]] = {}
    keys: dict[int, ProfileKey] = {}  # id(sample) -> its profile key
    for sample, state, bound, priority, busy in machines:
        key = keys.get(id(sample))
        if key is None:
            key = profile_key(sample)
            keys[id(sample)] = key
            samples.setdefault(key, sample)
        if busy:
            continue
        if state is MachineState.IDLE and not bound:
            idle[key] += 1
        elif state is MachineState.SPECULATIVE:
            speculative[key] += 1
        elif state is MachineState.CONFIGURED:
            configured.setdefault(key, Counter())[priority] += 1
    return tuple(
        ProfileSupply(
            provider=key[0],
            instance_type=key[1],
            zone=key[2],
            capacity_type=key[3],
            labels=dict(sample.labels),
            allocatable=dict(sample.allocatable),
            idle=idle[key],
            speculative=speculative[key],
            configured_by_priority=dict(configured.get(key, {})),
            domain=key[4],
        )
        for key, sample in sorted(samples.items())
    )


#: (provider, instance type, zone, capacity type, rack): what one supply entry counts.
ProfileKey = tuple[str, str, str, int, str]


def profile_key(shape: MachineRecord | Profile) -> ProfileKey:
    """The supply entry a machine (or an engine profile) is counted in."""
    labels = shape.labels if isinstance(shape.labels, Mapping) else dict(shape.labels)
    return (
        shape.provider,
        shape.instance_type,
        shape.zone,
        int(shape.capacity_type),
        labels.get(DOMAIN_LABEL, ""),
    )


class Free(NamedTuple):
    """One profile key's free machines, as :func:`free_counts` adds them up."""

    #: The first engine profile of the key: its labels and allocatable are reported.
    sample: Profile
    idle: int
    speculative: int


def free_counts(free: Iterable[tuple[Profile, int, int]]) -> dict[ProfileKey, Free]:
    """Idle and speculative machines per profile key, sorted by key.

    Engine profiles that share a key (labels or prices differ) add up; the
    first one's labels and allocatable are reported, as :func:`profile_supply`
    reports its first machine's.
    """
    samples: dict[ProfileKey, Profile] = {}
    idle: Counter[ProfileKey] = Counter()
    speculative: Counter[ProfileKey] = Counter()
    for profile, free_idle, free_speculative in free:
        key = profile_key(profile)
        samples.setdefault(key, profile)
        idle[key] += free_idle
        speculative[key] += free_speculative
    return {
        key: Free(sample, idle[key], speculative[key]) for key, sample in sorted(samples.items())
    }


def free_entry(key: ProfileKey, free: Free) -> ProfileSupply:
    """The report's entry for one key of :func:`free_counts` (no configured column)."""
    return ProfileSupply(
        provider=key[0],
        instance_type=key[1],
        zone=key[2],
        capacity_type=key[3],
        labels=dict(free.sample.labels),
        allocatable=dict(free.sample.allocatable),
        idle=free.idle,
        speculative=free.speculative,
        domain=key[4],
    )


def free_supply(free: Iterable[tuple[Profile, int, int]]) -> tuple[ProfileSupply, ...]:
    """Idle and speculative supply per profile key from (engine profile, idle, speculative).

    :func:`free_counts`, each key's entry by :func:`free_entry`; sorted by key.
    """
    return tuple(free_entry(key, entry) for key, entry in free_counts(free).items())
